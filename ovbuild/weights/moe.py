"""The mixture-of-experts MLP of Qwen3.5-family MoE models (`qwen3_5_moe_text`: Qwen3.5 / 3.6-35B-A3B, and the
language model of MiniCPM-V 4.7 35B-A3B): config keys, tensor names and reading the experts.

Every layer's MLP is a router `mlp.gate` [E, H], E routed experts and one shared expert with a sigmoid gate
`mlp.shared_expert_gate` [1, H]. The experts are stored fused, `mlp.experts.gate_up_proj` [E, 2I, H] (each expert's
gate rows, then its up rows) and `mlp.experts.down_proj` [E, H, I], parameters without a `.weight` suffix; or, in the
older Qwen3-Next layout, one module per expert, `mlp.experts.{e}.{gate,up,down}_proj.weight`. Both are read.
Routing (no config switch: the family always renormalises): softmax over E in f32, the top `num_experts_per_tok`
weights renormalised to sum to 1. Formulas: docs/moe.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ovbuild.errors import ConfigError, TensorError, UnsupportedError
from ovbuild.weights.config_reader import ConfigReader
from ovbuild.weights.tensor import WeightTensor
from ovbuild.weights.tensor_names import WeightSource

MOE_TEXT_TYPES = ("qwen3_5_moe_text",)


@dataclass(frozen=True)
class MoeSpec:
    """Sizes of one MoE MLP: E routed experts of width I, k of them per token, a shared expert of width S."""

    num_experts: int
    top_k: int
    expert_intermediate_size: int
    shared_intermediate_size: int


def parse_moe(text: ConfigReader) -> MoeSpec:
    """The MoE keys of a `qwen3_5_moe_text` config (the language model's section)."""
    experts = text.int("num_experts", minimum=1)
    top_k = text.int("num_experts_per_tok", minimum=1)
    if top_k > experts:
        raise ConfigError(f"{text.where('num_experts_per_tok')} = {top_k} is more than num_experts = {experts}")
    if text.has("norm_topk_prob") and not text.bool("norm_topk_prob"):
        # transformers' qwen3_5_moe router renormalises unconditionally; a config saying otherwise is another model
        raise UnsupportedError(f"{text.where('norm_topk_prob')} = false: this family renormalises the top-k weights")
    if text.raw("mlp_only_layers", []):
        raise UnsupportedError(f"{text.where('mlp_only_layers')}: dense layers among MoE layers are not supported")
    return MoeSpec(
        num_experts=experts,
        top_k=top_k,
        expert_intermediate_size=text.int("moe_intermediate_size", minimum=1),
        shared_intermediate_size=text.int("shared_expert_intermediate_size", minimum=1),
    )


MOE_LAYER = ("mlp.gate", "mlp.shared_expert_gate", *(f"mlp.shared_expert.{p}_proj" for p in ("gate", "up", "down")))
FUSED_EXPERTS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")  # parameters: no `.weight`


def moe_tensor_table(prefix: str, num_experts: int) -> dict[str, str]:
    """Canonical name -> checkpoint name of the MoE MLP's tensors: router, shared expert and its gate, the fused
    experts, and the per-expert names of the older layout (`layers.{i}.mlp.experts.{e}.gate_proj`)."""
    layer = f"{prefix}layers.{{i}}."
    per_expert = (f"mlp.experts.{x}.{p}_proj" for x in range(num_experts) for p in ("gate", "up", "down"))
    return {
        **{f"layers.{{i}}.{n}": f"{layer}{n}.weight" for n in (*MOE_LAYER, *per_expert)},
        **{f"layers.{{i}}.{n}": f"{layer}{n}" for n in FUSED_EXPERTS},
    }


def expert_layout(source, layer: int) -> str:
    """ "fused" or "per_expert": which layout layer `layer`'s experts are stored in (source: a WeightSource or the
    reference's weights); neither is an error naming both."""
    p = f"layers.{layer}.mlp.experts"
    if source.has(f"{p}.gate_up_proj") or source.has(f"{p}.down_proj"):
        return "fused"  # the other one missing, or any shape off the config, is then a named error on reading
    if source.has(f"{p}.0.gate_proj"):
        return "per_expert"
    names = source if isinstance(source, WeightSource) else source.names
    raise TensorError(
        f"{names.checkpoint.source}: layer {layer} has no experts (looked for "
        f"'{names.checkpoint_name(p + '.gate_up_proj')}' and '{names.checkpoint_name(p + '.0.gate_proj')}')"
    )


def read_experts(source: WeightSource, layer: int, spec: MoeSpec, hidden: int, part: str) -> WeightTensor:
    """Layer `layer`'s routed experts' `part`, "gate_up" [E, 2I, H] (each expert's gate rows, then its up rows) or
    "down" [E, H, I]: the fused tensor as mapped (not copied), or stacked from the per-expert ones. One part at a
    time, so an export holds one stored tensor in memory beside what it has built."""
    p, e, inter = f"layers.{layer}.mlp.experts", spec.num_experts, spec.expert_intermediate_size
    if expert_layout(source, layer) == "fused":
        shape = (e, 2 * inter, hidden) if part == "gate_up" else (e, hidden, inter)
        return source.get(f"{p}.{part}_proj", shape)  # missing, or a shape off the config: a named error
    names = ("gate", "up") if part == "gate_up" else ("down",)
    shape = (inter, hidden) if part == "gate_up" else (hidden, inter)
    per = [[source.get(f"{p}.{x}.{m}_proj", shape) for m in names] for x in range(e)]
    dtype = per[0][0].dtype
    if any(t.dtype != dtype for ts in per for t in ts):
        raise TensorError(f"{source.checkpoint.source}: the experts of layer {layer} are not all stored as {dtype}")
    # the older layout has no fused tensor to map: this part of the layer is copied once, into the fused order
    stacked = np.stack([np.concatenate([t.array for t in ts]) for ts in per])  # [E, 2I, H] or [E, H, I]
    first = source.checkpoint_name(f"{p}.0.{names[0]}_proj")
    return WeightTensor(f"{first} (experts 0..{e - 1}, {part})", dtype, stacked)
