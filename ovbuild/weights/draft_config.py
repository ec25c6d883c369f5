"""DraftConfig: the normalized config every DFlash-family draft shares, and the DFlash key rules."""

from __future__ import annotations

from dataclasses import dataclass

from ovbuild.errors import ConfigError
from ovbuild.weights.config import Backbone, backbone_fields
from ovbuild.weights.config_reader import ConfigReader, merged_key


@dataclass(frozen=True, kw_only=True)
class DraftConfig(Backbone):
    """A DFlash-family draft: a Qwen3-style stack fed with target taps, proposing a block of tokens per step."""

    family: str
    architecture: str
    block_size: int
    mask_token_id: int
    target_layer_ids: tuple[int, ...]
    num_target_layers: int | None  # None when the config does not say; checked against the target later
    target_hidden_size: int
    layer_causal: tuple[bool, ...]  # per layer: block rows attend causally (True) or bidirectionally
    candidate_offset: int = 1  # block row of the first candidate: 1 for DFlash (anchor row dropped), 0 for DSpark
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    final_logit_softcapping: float = 0.0  # 0 = off

    @property
    def num_taps(self) -> int:
        return len(self.target_layer_ids)

    @property
    def num_candidates(self) -> int:
        """Proposals per step from a full block."""
        return self.block_size - self.candidate_offset


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> tuple[int, ...]:
    """z-lab's default taps when a config gives none: one per draft layer, spread from layer 1 to L-3."""
    if num_draft_layers == 1:
        return (num_target_layers // 2,)
    span = num_target_layers - 4
    return tuple(round(1 + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers))


def dflash_fields(r: ConfigReader, family: str, candidate_offset: int) -> dict:
    """Keyword arguments of DraftConfig; DFlash keys sit flat or in `dflash_config` (nested wins, conflicts fail)."""
    fields = backbone_fields(r)
    nested = r.section("dflash_config")

    def key(name: str) -> ConfigReader:
        return merged_key(r, nested, name)

    num_target_layers = key("num_target_layers").int("num_target_layers", None, minimum=1)
    ids_reader = key("target_layer_ids")
    if ids_reader.has("target_layer_ids"):
        ids = ids_reader.int_list("target_layer_ids")
    elif num_target_layers is not None:
        ids = default_target_layer_ids(num_target_layers, fields["num_layers"])
    else:
        raise ConfigError(
            f"{r.where('dflash_config.target_layer_ids')} is missing (and no num_target_layers to derive it from)"
        )
    check_target_layer_ids(ids, num_target_layers, ids_reader.where("target_layer_ids"))
    mask_reader = key("mask_token_id")
    mask = mask_reader.int("mask_token_id", minimum=0)
    if mask >= fields["vocab_size"]:
        raise ConfigError(
            f"{mask_reader.where('mask_token_id')} = {mask} is outside the vocabulary ({fields['vocab_size']})"
        )
    # Causality per layer as the authors resolve it: `is_causal` when set, else causal exactly on sliding layers.
    is_causal = r.bool("is_causal", None) if r.has("is_causal") else None
    causal = tuple(is_causal if is_causal is not None else t == "sliding_attention" for t in fields["layer_types"])
    return dict(
        fields,
        family=family,
        architecture=r.architecture(),
        block_size=key("block_size").int("block_size", 16, minimum=1 + candidate_offset),
        mask_token_id=mask,
        target_layer_ids=ids,
        num_target_layers=num_target_layers,
        target_hidden_size=r.int("target_hidden_size", fields["hidden_size"], minimum=1),
        layer_causal=causal,
        candidate_offset=candidate_offset,
    )


def check_target_layer_ids(ids: tuple[int, ...], num_target_layers: int | None, where: str) -> None:
    """Taps must be a non-empty list of unique layer indices below the target's layer count."""
    if not ids:
        raise ConfigError(f"{where} is empty")
    if len(set(ids)) != len(ids):
        raise ConfigError(f"{where} has duplicates: {list(ids)}")
    bad = [i for i in ids if i < 0 or (num_target_layers is not None and i >= num_target_layers)]
    if bad:
        limit = f"[0, {num_target_layers})" if num_target_layers is not None else ">= 0"
        raise ConfigError(f"{where} = {list(ids)}: {bad[0]} is out of range {limit}")
