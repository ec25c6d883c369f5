"""Hybrid Qwen3.5-family targets: Gated DeltaNet (linear attention) layers interleaved with gated full attention.

Published checkpoints (Qwen3.5 / 3.6 / 3.8 dense, `model_type` qwen3_5) are vision-language models: config.json
nests the language model under `text_config` and the weights under `model.language_model.`; the vision tower
(`vision_config`, `model.visual.*`) is read by `vision_qwen.py` into an IR of its own, and the multi-token-prediction
head (`mtp.*`) is ignored. A checkpoint with a `vision_config` gets `mrope`: its language model takes image
embeddings and three-axis positions as inputs (docs/vision.md). A text-only checkpoint (`qwen3_5_text`,
Qwen3_5ForCausalLM) is flat with weights under `model.`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ovbuild.errors import ConfigError, UnsupportedError
from ovbuild.weights.checkpoint import Checkpoint
from ovbuild.weights.config_reader import ConfigReader
from ovbuild.weights.moe import MoeSpec, moe_tensor_table, parse_moe
from ovbuild.weights.mrope import MropeSpec, parse_mrope
from ovbuild.weights.rope import parse_rope
from ovbuild.weights.target import TargetConfig, TargetLayout
from ovbuild.weights.tensor_names import WeightSource, stored_prefix

# Architecture -> the language model's `model_type` when its config does not say. MiniCPM-V 4.7 nests a Qwen3.5
# text stack (dense or MoE, by `text_config.model_type`) under the same `model.language_model.` prefix.
HYBRID_ARCHITECTURES = {
    "Qwen3_5ForConditionalGeneration": "qwen3_5_text",
    "Qwen3_5ForCausalLM": "qwen3_5_text",
    "Qwen3_5MoeForConditionalGeneration": "qwen3_5_moe_text",
    "Qwen3_5MoeForCausalLM": "qwen3_5_moe_text",
    "MiniCPMV4_7ForConditionalGeneration": "qwen3_5_text",
}
HYBRID_TEXT_TYPES = ("qwen3_5_text", "qwen3_5_moe_text")
HYBRID_LAYER_TYPES = ("linear_attention", "full_attention")
# Where the language model's tensors sit, tried in this order; the first holding embed_tokens is the checkpoint's.
TEXT_PREFIXES = ("model.language_model.", "model.")


@dataclass(frozen=True, kw_only=True)
class HybridTargetConfig(TargetConfig):
    """A dense Qwen3.5-family language model. `layer_types[i]` is linear_attention or full_attention."""

    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int
    rotary_dim: int  # RoPE turns the first rotary_dim dims of each head (head_dim * partial_rotary_factor)
    # every MLP a mixture of experts (qwen3_5_moe_text; intermediate_size is then the shared expert's width), or None
    moe: MoeSpec | None = None
    # the checkpoint can take images (it has a vision_config): the multi-axis RoPE its image positions use, else None
    mrope: MropeSpec | None = None
    family: str = "qwen3_5"

    @property
    def key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the causal conv (and of its state): queries, keys and values side by side."""
        return 2 * self.key_dim + self.value_dim

    @property
    def full_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == "full_attention")

    @property
    def linear_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == "linear_attention")

    @property
    def layer_pattern(self) -> str:
        """One letter per layer, L = linear attention, F = full attention (`LLLF` * 16 for Qwen3.5-27B)."""
        return "".join("F" if t == "full_attention" else "L" for t in self.layer_types)

    @property
    def export_note(self) -> str | None:
        """The vision tower and the multi-token-prediction head of the published checkpoints are left out."""
        if self.mrope is not None:
            return f"{self.family} language model (layers {self.layer_pattern}), taking image embeddings as input"
        return f"{self.family} language model only (layers {self.layer_pattern}); image input is not supported"

    def text_only(self) -> HybridTargetConfig:
        """The language model without its image inputs: the IR a text-only checkpoint would give."""
        return replace(self, mrope=None)


def parse_hybrid_config(config: dict, path: str) -> HybridTargetConfig:
    """Normalize a Qwen3.5-family config.json (nested `text_config` or flat)."""
    root = ConfigReader(config, path)
    arch = root.architecture()
    if arch not in HYBRID_ARCHITECTURES:
        raise UnsupportedError(f"{root.where('architectures')}: {arch!r} is not a Qwen3.5-family architecture")
    text = root.section("text_config") or root
    model_type = _text_model_type(root, text, arch)
    moe = None
    if model_type == "qwen3_5_moe_text":
        moe = parse_moe(text)
    hidden = text.int("hidden_size", minimum=1)
    heads = text.int("num_attention_heads", minimum=1)
    kv_heads = text.int("num_key_value_heads", heads, minimum=1)
    if heads % kv_heads:
        raise ConfigError(f"{text.where('num_key_value_heads')} = {kv_heads} does not divide {heads} query heads")
    if text.raw("attention_bias", False):
        raise UnsupportedError(f"{text.where('attention_bias')}: attention biases are not supported")
    if text.str("hidden_act", "silu") != "silu":
        raise UnsupportedError(f"{text.where('hidden_act')}: only silu is supported")
    layers = text.int("num_hidden_layers", minimum=1)
    head_dim = text.int("head_dim", hidden // heads, minimum=2)
    k_heads = text.int("linear_num_key_heads", 16, minimum=1)
    v_heads = text.int("linear_num_value_heads", 32, minimum=1)
    if v_heads % k_heads:
        raise ConfigError(
            f"{text.where('linear_num_value_heads')} = {v_heads} is not a multiple of linear_num_key_heads = {k_heads}"
        )
    rope_reader, partial = _text_rope(text)
    rotary_dim = int(head_dim * partial)
    if rotary_dim < 2 or rotary_dim % 2 or rotary_dim > head_dim:
        raise ConfigError(f"{text.where('partial_rotary_factor')} = {partial} gives {rotary_dim} rotary dims")
    mrope = None
    if text is not root and root.has("vision_config"):  # a vision-language checkpoint: its LM can take images
        mrope = parse_mrope(text.section("rope_parameters") or text.section("rope_scaling"), rotary_dim)
    tie_source = root if root.has("tie_word_embeddings") else text
    fields = dict(
        hidden_size=hidden,
        # an MoE stack has no dense MLP: its shared expert's width stands in (graph/moe.py sizes it so)
        intermediate_size=moe.shared_intermediate_size if moe else text.int("intermediate_size", minimum=1),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=text.float("rms_norm_eps", 1e-6),
        vocab_size=text.int("vocab_size", minimum=1),
        rope=parse_rope(rope_reader),
        layer_types=_layer_types(text, layers),
        sliding_windows=(0,) * layers,
        architecture=arch,
        tie_word_embeddings=tie_source.bool("tie_word_embeddings", False),
        eos_token_ids=text.int_list("eos_token_id", None) or root.int_list("eos_token_id", ()),
        max_position_embeddings=text.int("max_position_embeddings", 32768),
        linear_num_key_heads=k_heads,
        linear_num_value_heads=v_heads,
        linear_key_head_dim=text.int("linear_key_head_dim", 128, minimum=1),
        linear_value_head_dim=text.int("linear_value_head_dim", 128, minimum=1),
        linear_conv_kernel_dim=text.int("linear_conv_kernel_dim", 4, minimum=2),
        rotary_dim=rotary_dim,
    )
    return HybridTargetConfig(**fields, moe=moe, mrope=mrope)


def _text_model_type(root: ConfigReader, text: ConfigReader, arch: str) -> str:
    """The language model's type: MiniCPM-V 4.7 names it in `text_config.model_type` (transformers resolves the
    section by it); the Qwen3.5 classes fix it by architecture, so a section saying otherwise is a wrong config."""
    expected = HYBRID_ARCHITECTURES[arch]
    if text is root:  # a flat config's model_type names the whole model
        return expected
    model_type = text.str("model_type", expected)
    if model_type not in HYBRID_TEXT_TYPES:
        raise UnsupportedError(
            f"{text.where('model_type')} = '{model_type}' is not a Qwen3.5-family language model "
            f"({', '.join(HYBRID_TEXT_TYPES)})"
        )
    if arch.startswith("Qwen3_5") and model_type != expected:
        raise ConfigError(f"{text.where('model_type')} = '{model_type}' does not fit {arch} (expected '{expected}')")
    return model_type


def _layer_types(text: ConfigReader, layers: int) -> tuple[str, ...]:
    """`layer_types`, or every `full_attention_interval`-th layer full (transformers' default interval: 4)."""
    if text.has("layer_types"):
        types = tuple(text.raw("layer_types"))
        if len(types) != layers or any(t not in HYBRID_LAYER_TYPES for t in types):
            raise ConfigError(f"{text.where('layer_types')} must list {layers} entries from {HYBRID_LAYER_TYPES}")
        return types
    interval = text.int("full_attention_interval", 4, minimum=1)
    return tuple("full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers))


def _text_rope(text: ConfigReader) -> tuple[ConfigReader, float]:
    """A reader of the RoPE keys without the partial factor and multimodal sections, and the partial factor.

    `mrope_section` splits the rotary dims between temporal, height and width positions; for text all three
    positions are the token's own, so multimodal RoPE is plain RoPE over the rotary dims.
    """
    key = "rope_parameters" if text.has("rope_parameters") else "rope_scaling"
    params = text.section(key)
    partial = text.float("partial_rotary_factor", 0.25)  # transformers' default for this family when absent
    data = dict(text.data)
    if params is not None:
        partial = params.float("partial_rotary_factor", partial)
        dropped = ("partial_rotary_factor", "mrope_section", "mrope_interleaved")
        data[key] = {k: v for k, v in params.data.items() if k not in dropped}
        if data[key].get("rope_type", data[key].get("type")) == "mrope":  # older spelling of the same rope
            data[key]["rope_type"] = "default"
    if not 0 < partial <= 1:
        raise ConfigError(f"{text.where('partial_rotary_factor')} must be in (0, 1], got {partial}")
    return ConfigReader(data, text.path, text.prefix), partial


LINEAR_ATTN = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj", "conv1d", "norm")
FULL_ATTN = ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm")
SHARED = ("input_layernorm", "post_attention_layernorm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def hybrid_tensor_table(prefix: str) -> dict[str, str]:
    """Canonical name -> checkpoint name, the language-model prefix (`model.language_model.`) applied once here."""
    layer = f"{prefix}layers.{{i}}."
    table = {
        "embed_tokens": f"{prefix}embed_tokens.weight",
        "norm": f"{prefix}norm.weight",
        "lm_head": "lm_head.weight",
        **{f"layers.{{i}}.{n}": f"{layer}{n}.weight" for n in SHARED},
        **{f"layers.{{i}}.self_attn.{n}": f"{layer}self_attn.{n}.weight" for n in FULL_ATTN},
        **{f"layers.{{i}}.linear_attn.{n}": f"{layer}linear_attn.{n}.weight" for n in LINEAR_ATTN},
        # parameters, not modules: no `.weight`
        "layers.{i}.linear_attn.A_log": f"{layer}linear_attn.A_log",
        "layers.{i}.linear_attn.dt_bias": f"{layer}linear_attn.dt_bias",
    }
    return table


def text_prefix(checkpoint: Checkpoint) -> str:
    """The prefix of the language model's tensors in this checkpoint."""
    return stored_prefix(checkpoint, TEXT_PREFIXES, "embed_tokens.weight", "language-model embedding")


def load_hybrid_target(checkpoint: Checkpoint) -> tuple[HybridTargetConfig, WeightSource]:
    """Normalized config and tensor source of a Qwen3.5-family checkpoint."""
    config = parse_hybrid_config(checkpoint.config, str(checkpoint.config_path))
    prefix = text_prefix(checkpoint)
    table = hybrid_tensor_table(prefix)
    if config.moe is not None:
        table |= moe_tensor_table(prefix, config.moe.num_experts)
    if config.tie_word_embeddings:
        table["lm_head"] = table["embed_tokens"]
    return config, WeightSource(checkpoint, table)


HYBRID_LAYOUT = TargetLayout(tuple(HYBRID_ARCHITECTURES), parse_hybrid_config, load_hybrid_target)
