"""DeepSpec's Qwen3DSparkModel: DSpark drafts (Markov head, optional confidence head) and DeepSpec DFlash drafts
(the same architecture with `markov_rank` 0). Config keys flat, or nested in `dflash_config` (the MiniCPM-V 4.7
drafts: `block_size`, `mask_token_id`, `target_layer_ids`, `markov_rank`, `confidence_head_with_markov`; the nested
value wins, a flat one contradicting it is an error), written by the authors only where they apply:
`markov_head_type` only when markov_rank > 0, `confidence_head_with_markov` only when the confidence head is on.

The backbone is DFlash v1 with candidate offset 0: the anchor row is the first prediction row, so a block of B rows
proposes B tokens. The checkpoint carries its own copies of the target's embed_tokens and lm_head.
"""

from __future__ import annotations

from dataclasses import dataclass

from ovbuild.errors import ConfigError, UnsupportedError
from ovbuild.weights.config_reader import ConfigReader, merged_key
from ovbuild.weights.draft_config import DraftConfig, dflash_fields
from ovbuild.weights.families.base import CheckpointLayout
from ovbuild.weights.families.dflash import DFLASH_TENSORS

MARKOV_HEAD_TYPES = ("vanilla", "gated")


@dataclass(frozen=True, kw_only=True)
class DSparkConfig(DraftConfig):
    """A Qwen3DSparkModel draft: the DFlash backbone plus the sizes and kinds of its heads."""

    markov_rank: int  # 0 = DeepSpec DFlash: no Markov head
    markov_head_type: str | None  # "vanilla" | "gated"; None when markov_rank is 0
    enable_confidence_head: bool
    confidence_head_with_markov: bool  # the confidence head also reads W1[previous token]

    @property
    def confidence_width(self) -> int:
        """Input width of the confidence head: [h ; W1[previous token]] or h alone."""
        return self.hidden_size + (self.markov_rank if self.confidence_head_with_markov else 0)


DSPARK_TENSORS = {
    **DFLASH_TENSORS,
    "embed_tokens": "embed_tokens.weight",  # [V, H]: frozen copy of the target's
    "lm_head": "lm_head.weight",  # [V, H]: frozen copy of the target's
    "markov_head.markov_w1": "markov_head.markov_w1.weight",  # [V, r]: an embedding of the previous token
    "markov_head.markov_w2": "markov_head.markov_w2.weight",  # [V, r]: Linear r -> V
    "markov_head.gate_proj": "markov_head.gate_proj.weight",  # [r, H + r], gated head only
    "markov_head.gate_proj.bias": "markov_head.gate_proj.bias",  # [r]
    "confidence_head.proj": "confidence_head.proj.weight",  # [1, H (+ r)]
    "confidence_head.proj.bias": "confidence_head.proj.bias",  # [1]
}


def parse(r: ConfigReader) -> DSparkConfig:
    fields = dflash_fields(r, family="dspark", candidate_offset=0)
    nested = r.section("dflash_config")

    def key(name: str) -> ConfigReader:
        return merged_key(r, nested, name)

    def where(name: str) -> str:
        return key(name).where(name)

    rank = key("markov_rank").int("markov_rank", minimum=0)
    head_type = None
    if rank > 0:
        head_type = key("markov_head_type").str("markov_head_type")
        if head_type == "rnn":
            raise UnsupportedError(
                f"{where('markov_head_type')} = 'rnn' is not supported: the RNN head's state depends on the whole "
                "path of chosen tokens, so its bias cannot be scored as a Top-K lattice of pairwise transitions "
                "(use a vanilla or gated head)"
            )
        if head_type not in MARKOV_HEAD_TYPES:
            raise ConfigError(
                f"{where('markov_head_type')} = {head_type!r} is not one of {', '.join(MARKOV_HEAD_TYPES)}, rnn"
            )
    confidence = key("enable_confidence_head").bool("enable_confidence_head")
    with_markov = key("confidence_head_with_markov").bool("confidence_head_with_markov") if confidence else False
    if with_markov and rank == 0:
        raise ConfigError(
            f"{where('confidence_head_with_markov')} is true but markov_rank is 0 (no Markov features to read)"
        )
    return DSparkConfig(
        **fields,
        markov_rank=rank,
        markov_head_type=head_type,
        enable_confidence_head=confidence,
        confidence_head_with_markov=with_markov,
    )


LAYOUT = CheckpointLayout(("Qwen3DSparkModel",), parse, DSPARK_TENSORS)
