"""Backbone: the Qwen3-style decoder geometry shared by targets and drafts, read from config.json."""

from __future__ import annotations

from dataclasses import dataclass

from ovbuild.errors import ConfigError, UnsupportedError
from ovbuild.weights.config_reader import ConfigReader
from ovbuild.weights.rope import RopeConfig, parse_rope

LAYER_TYPES = ("full_attention", "sliding_attention")


@dataclass(frozen=True, kw_only=True)
class Backbone:
    """Geometry of a Qwen3-style decoder stack: the single source of every shape in graphs and references."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int  # explicit: Qwen3 drafts have num_heads * head_dim != hidden_size
    rms_norm_eps: float
    vocab_size: int
    rope: RopeConfig
    layer_types: tuple[str, ...]
    sliding_windows: tuple[int, ...]  # per layer; 0 = full attention

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim


def backbone_fields(r: ConfigReader) -> dict:
    """Keyword arguments of Backbone read from a Hugging Face Qwen3-style config."""
    hidden = r.int("hidden_size", minimum=1)
    heads = r.int("num_attention_heads", minimum=1)
    kv_heads = r.int("num_key_value_heads", heads, minimum=1)
    if heads % kv_heads:
        raise ConfigError(
            f"{r.where('num_key_value_heads')} = {kv_heads} does not divide num_attention_heads = {heads}"
        )
    if r.raw("attention_bias", False):
        raise UnsupportedError(f"{r.where('attention_bias')}: attention biases are not supported (Qwen3 has none)")
    act = r.str("hidden_act", "silu")
    if act != "silu":
        raise UnsupportedError(f"{r.where('hidden_act')}: activation '{act}' is not supported (only silu)")
    layers = r.int("num_hidden_layers", minimum=1)
    layer_types, windows = _layer_windows(r, layers)
    return dict(
        hidden_size=hidden,
        intermediate_size=r.int("intermediate_size", minimum=1),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        # HF falls back to hidden // heads only when head_dim is absent; the key wins whenever present.
        head_dim=r.int("head_dim", hidden // heads, minimum=2),
        rms_norm_eps=r.float("rms_norm_eps", 1e-6),
        vocab_size=r.int("vocab_size", minimum=1),
        rope=parse_rope(r),
        layer_types=layer_types,
        sliding_windows=windows,
    )


def _layer_windows(r: ConfigReader, layers: int) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """Per-layer type and window. A window applies only where `use_sliding_window` is true (as in transformers)."""
    window = r.int("sliding_window", None, minimum=1)
    if r.has("layer_types"):
        types = tuple(r.raw("layer_types"))
        if len(types) != layers or any(t not in LAYER_TYPES for t in types):
            raise ConfigError(f"{r.where('layer_types')} must list {layers} entries from {LAYER_TYPES}, got {types}")
    else:
        first_sliding = r.int("max_window_layers", layers) if window else layers
        types = tuple("sliding_attention" if i >= first_sliding else "full_attention" for i in range(layers))
    use_window = r.bool("use_sliding_window", False)
    if use_window and "sliding_attention" in types and window is None:
        raise ConfigError(f"{r.where('sliding_window')} is missing but sliding layers are enabled")
    windows = tuple(window if use_window and t == "sliding_attention" else 0 for t in types)
    return types, windows
