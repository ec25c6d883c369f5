"""The dense Qwen3 target: normalized config, tensor-name table, loading; and what every target layout provides
(`TargetLayout`). Which layouts exist and how a checkpoint finds its own is the target families' declaration
(`ovbuild.targets`)."""

from __future__ import annotations

from collections.abc import Callable
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

    @property
    def export_note(self) -> str | None:
        """What an export says about a checkpoint of this kind beyond its weights (None: nothing)."""
        return None

    def text_only(self) -> TargetConfig:
        """This config without image input (`export --no-vision`); a text model's is itself."""
        return self


@dataclass(frozen=True)
class TargetLayout:
    """One target checkpoint layout: the architecture names it claims, its config parser and its loader."""

    architectures: tuple[str, ...]
    parse: Callable[[dict, str], TargetConfig]  # (config.json, its path) -> normalized config
    load: Callable[[Checkpoint], tuple[TargetConfig, WeightSource]]  # config and tensor source of a checkpoint


QWEN3_ARCHITECTURES = ("Qwen3ForCausalLM",)


def parse_qwen3_config(config: dict, path: str) -> TargetConfig:
    """Normalize a dense Qwen3 config.json."""
    r = ConfigReader(config, path)
    arch = r.architecture()
    if arch not in QWEN3_ARCHITECTURES:
        raise UnsupportedError(f"{r.where('architectures')}: {arch!r} is not a dense Qwen3 architecture")
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


def load_qwen3_target(checkpoint: Checkpoint) -> tuple[TargetConfig, WeightSource]:
    """Normalized config and tensor source of a dense Qwen3 checkpoint."""
    config = parse_qwen3_config(checkpoint.config, str(checkpoint.config_path))
    table = dict(QWEN3_TARGET_TENSORS)
    if config.tie_word_embeddings:
        table["lm_head"] = table["embed_tokens"]  # tied checkpoints store the shared matrix once, as the embedding
    return config, WeightSource(checkpoint, table)


QWEN3_LAYOUT = TargetLayout(QWEN3_ARCHITECTURES, parse_qwen3_config, load_qwen3_target)
