"""DFlash v2 (z-lab DFlash2DraftModel): the v1 stack plus two grouped dynamic convolutions per layer, logit
transforms and a candidate selector (the Top-K lattice head). Every v2 key sits in the nested `dflash_config`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ovbuild.errors import ConfigError
from ovbuild.weights.config_reader import ConfigReader, merged_key
from ovbuild.weights.draft_config import DraftConfig, dflash_fields
from ovbuild.weights.families.base import CheckpointLayout
from ovbuild.weights.families.dflash import DFLASH_TENSORS


@dataclass(frozen=True, kw_only=True)
class DFlash2Config(DraftConfig):
    """A DFlash v2 draft: conv geometry and selector size on top of the shared DFlash config."""

    conv_kernel_size: int  # taps per convolution: row t mixes rows t, t-1, ..., t-k+1 of its own block
    conv_group_size: int  # channels sharing one dynamic coefficient
    selector_rank: int
    selector_top_k: int

    @property
    def conv_groups(self) -> int:
        return self.hidden_size // self.conv_group_size


CONVS = ("attention_conv", "mlp_conv")

DFLASH2_TENSORS = {
    **DFLASH_TENSORS,
    **{f"layers.{{i}}.{c}.base_kernel": f"layers.{{i}}.{c}.base_kernel" for c in CONVS},  # [2, k, H], no `.weight`
    **{f"layers.{{i}}.{c}.kernel_projection": f"layers.{{i}}.{c}.kernel_projection.weight" for c in CONVS},
    "candidate_selector.hidden_projection": "candidate_selector.hidden_projection.weight",  # [r, H]
    # The codebooks are bare parameters in the authors' module, hence stored without `.weight`.
    "candidate_selector.predecessor_codebook": "candidate_selector.predecessor_codebook",  # [V, r]
    "candidate_selector.successor_codebook": "candidate_selector.successor_codebook",  # [V, r]
}


def parse(r: ConfigReader) -> DFlash2Config:
    fields = dflash_fields(r, family="dflash2", candidate_offset=1)
    nested = r.section("dflash_config")

    def key(name: str) -> ConfigReader:
        reader = merged_key(r, nested, name)
        # A key found nowhere is reported where the published checkpoints put it: in dflash_config.
        return nested if nested is not None and not reader.has(name) else reader

    hidden, vocab = fields["hidden_size"], fields["vocab_size"]
    group_reader, top_k_reader = key("conv_group_size"), key("selector_top_k")
    group = group_reader.int("conv_group_size", minimum=1)
    if hidden % group:
        raise ConfigError(f"{group_reader.where('conv_group_size')} = {group} does not divide hidden_size = {hidden}")
    top_k = top_k_reader.int("selector_top_k", minimum=1)
    if top_k > vocab:
        raise ConfigError(f"{top_k_reader.where('selector_top_k')} = {top_k} exceeds vocab_size = {vocab}")
    return DFlash2Config(
        **fields,
        conv_kernel_size=key("conv_kernel_size").int("conv_kernel_size", minimum=1),
        conv_group_size=group,
        selector_rank=key("selector_rank").int("selector_rank", minimum=1),
        selector_top_k=top_k,
        input_embedding_scale=_positive(key("input_embedding_scale"), "input_embedding_scale", 1.0),
        output_multiplier=_positive(key("output_multiplier"), "output_multiplier", 1.0),
        final_logit_softcapping=_softcap(key("final_logit_softcapping")),
    )


def _positive(r: ConfigReader, name: str, default: float) -> float:
    value = r.float(name, default)
    if value <= 0:
        raise ConfigError(f"{r.where(name)} must be > 0, got {value}")
    return value


def _softcap(r: ConfigReader) -> float:
    value = r.float("final_logit_softcapping", 0.0)
    if value < 0:
        raise ConfigError(f"{r.where('final_logit_softcapping')} must be >= 0 (0 = off), got {value}")
    return value


LAYOUT = CheckpointLayout(("DFlash2DraftModel",), parse, DFLASH2_TENSORS)
