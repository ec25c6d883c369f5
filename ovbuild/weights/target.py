"""The Qwen3 target: normalized config, tensor-name table, loading."""

from __future__ import annotations

from dataclasses import dataclass

from ovbuild.errors import UnsupportedError
from ovbuild.weights.checkpoint import Checkpoint
from ovbuild.weights.config import Backbone, backbone_fields
from ovbuild.weights.config_reader import ConfigReader
from ovbuild.weights.tensor_names import WeightSource, layer_entries


@dataclass(frozen=True, kw_only=True)
class TargetConfig(Backbone):
    """A dense Qwen3 causal LM."""

    architecture: str
    tie_word_embeddings: bool
    eos_token_ids: tuple[int, ...]
    max_position_embeddings: int
    family: str = "qwen3"

    @property
    def context_length(self) -> int:
        """Positions the target serves: max_position_embeddings, or more where a linear or YaRN RoPE stretches its
        original length by `factor` (as vLLM derives its max_model_len)."""
        rope = self.rope
        if rope.rope_type in ("linear", "yarn") and rope.factor > 1:
            stretched = int((rope.original_max_position_embeddings or self.max_position_embeddings) * rope.factor)
            return max(self.max_position_embeddings, stretched)
        return self.max_position_embeddings


QWEN3_ARCHITECTURES = ("Qwen3ForCausalLM",)
# Every architecture `export` treats as a target: dense Qwen3, and the hybrid Qwen3.5 family (weights/hybrid.py:
# dense, mixture-of-experts, MiniCPM-V 4.7's language model), whose Qwen3-Next relative is listed so that it fails
# with a clear message.
SUPPORTED_TARGET_ARCHITECTURES = (
    *QWEN3_ARCHITECTURES,
    "Qwen3_5ForConditionalGeneration",
    "Qwen3_5ForCausalLM",
    "Qwen3_5MoeForConditionalGeneration",
    "Qwen3_5MoeForCausalLM",
    "MiniCPMV4_7ForConditionalGeneration",
)
TARGET_ARCHITECTURES = (*SUPPORTED_TARGET_ARCHITECTURES, "Qwen3NextForCausalLM")


def parse_target_config(config: dict, path: str) -> TargetConfig:
    """Normalize a target's config.json: dense Qwen3, or a hybrid Qwen3.5-family model."""
    from ovbuild.weights.hybrid import is_hybrid_config, parse_hybrid_config  # hybrid.py builds on this module

    if is_hybrid_config(config):
        return parse_hybrid_config(config, path)
    r = ConfigReader(config, path)
    arch = r.architecture()
    if arch not in QWEN3_ARCHITECTURES:
        raise UnsupportedError(
            f"{r.where('architectures')}: unknown target architecture {arch!r} "
            f"(supported: {', '.join(SUPPORTED_TARGET_ARCHITECTURES)})"
        )
    eos = r.int_list("eos_token_id", ())
    return TargetConfig(
        **backbone_fields(r),
        architecture=arch,
        tie_word_embeddings=r.bool("tie_word_embeddings", False),
        eos_token_ids=eos,
        max_position_embeddings=r.int("max_position_embeddings", 32768),
    )


QWEN3_TARGET_TENSORS = {
    "embed_tokens": "model.embed_tokens.weight",
    **layer_entries("model."),
    "norm": "model.norm.weight",
    "lm_head": "lm_head.weight",
}


def load_target(checkpoint: Checkpoint) -> tuple[TargetConfig, WeightSource]:
    """Normalized config and tensor source of a target checkpoint (Qwen3 or hybrid Qwen3.5 family)."""
    from ovbuild.weights.hybrid import is_hybrid_config, load_hybrid_target

    if is_hybrid_config(checkpoint.config):
        return load_hybrid_target(checkpoint)
    config = parse_target_config(checkpoint.config, str(checkpoint.config_path))
    table = dict(QWEN3_TARGET_TENSORS)
    if config.tie_word_embeddings:
        table["lm_head"] = table["embed_tokens"]  # tied checkpoints store the shared matrix once, as the embedding
    return config, WeightSource(checkpoint, table)
