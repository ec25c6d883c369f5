"""Numpy reference of a hybrid Qwen3.5-family target, one sequence at a time: full-attention layers with a KV cache,
Gated DeltaNet layers with a conv state and a recurrent state. Formulas: docs/hybrid.md."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ovbuild.reference.gated_delta import causal_conv, delta_rule_chunked, delta_rule_recurrent, silu
from ovbuild.reference.layers import REF_DTYPE, attention, linear, rope, swiglu_mlp, visibility
from ovbuild.reference.mrope import mrope
from ovbuild.reference.rope import rope_from_config
from ovbuild.reference.weights import ReferenceWeights, reference_weights

if TYPE_CHECKING:
    from ovbuild.weights.hybrid import HybridTargetConfig
    from ovbuild.weights.tensor_names import WeightSource


@dataclass
class HybridCache:
    """Keys and values of the full layers, the conv and recurrent state of the linear layers, by layer index."""

    keys: dict[int, np.ndarray] = field(default_factory=dict)  # [length, kv_heads, head_dim]
    values: dict[int, np.ndarray] = field(default_factory=dict)
    conv: dict[int, np.ndarray] = field(default_factory=dict)  # [conv_dim, kernel - 1]
    recurrent: dict[int, np.ndarray] = field(default_factory=dict)  # [v_heads, k_head_dim, v_head_dim]
    length: int = 0
    # with `record_rows`, forward keeps here each new row's states: [row] -> {layer: (conv, recurrent)}
    row_states: list[dict[int, tuple[np.ndarray, np.ndarray]]] = field(default_factory=list)

    def snapshot(self) -> HybridCache:
        """A copy to roll back to (the states cannot be truncated, only restored)."""
        return copy.deepcopy(self)

    def restore(self, saved: HybridCache) -> None:
        self.__dict__.update(copy.deepcopy(saved).__dict__)

    def truncate_keys(self, length: int) -> None:
        """Forget keys and values from position `length` on (the states are restored separately)."""
        self.keys = {i: k[:length] for i, k in self.keys.items()}
        self.values = {i: v[:length] for i, v in self.values.items()}


def zero_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """RMSNorm whose weight is stored around 0 and scales by (1 + w)."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * (1.0 + w)


def l2_normalize(x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + eps)


class HybridReference:
    """The hybrid target. `forward` appends tokens to the cache and returns logits and taps, as Qwen3Reference."""

    def __init__(self, cfg: HybridTargetConfig, source: WeightSource | ReferenceWeights, chunk: int = 0):
        """chunk > 0: the linear layers run the chunked delta rule in chunks of that many rows (no per-row states)."""
        self.cfg, self.chunk = cfg, chunk
        self.w = reference_weights(source)
        text = self.w.config.get("text_config") or self.w.config
        rope_keys = text.get("rope_parameters") or text.get("rope_scaling") or {}
        partial = rope_keys.get("partial_rotary_factor", text.get("partial_rotary_factor", 0.25))
        self.rotary_dim = int(cfg.head_dim * partial)
        self.rope = rope_from_config(text, self.rotary_dim)
        # a vision-language checkpoint's language model turns each frequency by the position of its axis
        self.mrope = None
        if "vision_config" in self.w.config and "text_config" in self.w.config:
            self.mrope = (tuple(rope_keys.get("mrope_section", (11, 11, 10))), rope_keys.get("mrope_interleaved", True))
        self.eps = float(text.get("rms_norm_eps", 1e-6))
        h, v = cfg.hidden_size, cfg.vocab_size
        self.embed = self.w.get("embed_tokens", (v, h))
        self.norm = self.w.get("norm", (h,))
        self.lm_head = self.w.get("lm_head", (v, h))

    def new_cache(self) -> HybridCache:
        c = self.cfg
        cache = HybridCache()
        for i, t in enumerate(c.layer_types):
            if t == "full_attention":
                cache.keys[i] = cache.values[i] = np.zeros((0, c.num_kv_heads, c.head_dim), REF_DTYPE)
            else:
                cache.conv[i] = np.zeros((c.conv_dim, c.linear_conv_kernel_dim - 1), REF_DTYPE)
                cache.recurrent[i] = np.zeros(
                    (c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim), REF_DTYPE
                )
        return cache

    def forward(
        self,
        cache: HybridCache,
        token_ids: np.ndarray,
        tap_layer_ids: tuple[int, ...] = (),
        record_rows=False,
        positions: np.ndarray | None = None,
        images: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Run `token_ids` [n] after the cached ones: logits [n, V] and taps [n, len(taps) * H]. A target that takes
        images may be given each row's (temporal, height, width) positions [3, n] (default: the row's index in the
        sequence on every axis) and images = (rows [k], embeddings [k, H]) replacing those rows' token embeddings."""
        n = len(token_ids)
        order = cache.length + np.arange(n)  # the rows' places in the sequence: what the causal mask compares
        positions = np.stack([order] * 3) if positions is None else np.asarray(positions, np.int64)
        cache.row_states = [{} for _ in range(n)] if record_rows else []
        x = self.embed[np.asarray(token_ids, np.int64)]
        if images is not None:
            x = x.copy()
            x[np.asarray(images[0], np.int64)] = images[1]
        outputs = []
        for i, kind in enumerate(self.cfg.layer_types):
            u = zero_norm(x, self._get(i, "input_layernorm", (self.cfg.hidden_size,)), self.eps)
            mix = self._full(i, u, order, positions, cache) if kind == "full_attention" else self._linear(i, u, cache)
            x = x + mix
            x = x + self._mlp(i, x)
            outputs.append(x)
        cache.length += n
        h = zero_norm(x, self.norm, self.eps)
        outputs[-1] = h  # the last layer's tap is taken after the final norm, as transformers reports it
        taps = np.concatenate([outputs[t] for t in tap_layer_ids], -1) if tap_layer_ids else np.zeros((n, 0))
        return linear(h, self.lm_head), taps

    def _get(self, i: int, name: str, shape: tuple[int, ...]) -> np.ndarray:
        return self.w.get(f"layers.{i}.{name}", shape)

    def _mlp(self, i: int, x: np.ndarray) -> np.ndarray:
        c = self.cfg
        h, inter = c.hidden_size, c.intermediate_size
        u = zero_norm(x, self._get(i, "post_attention_layernorm", (h,)), self.eps)
        gate, up = self._get(i, "mlp.gate_proj", (inter, h)), self._get(i, "mlp.up_proj", (inter, h))
        return swiglu_mlp(u, gate, up, self._get(i, "mlp.down_proj", (h, inter)))

    def _full(self, i: int, u: np.ndarray, order: np.ndarray, positions: np.ndarray, cache: HybridCache) -> np.ndarray:
        """Gated attention: q_proj yields each head's query and its output gate side by side. order [n]: the rows'
        places in the sequence; positions [3, n]: their rotary positions."""
        c = self.cfg
        n, d, h, heads, kvh = len(u), c.head_dim, c.hidden_size, c.num_heads, c.num_kv_heads
        both = linear(u, self._get(i, "self_attn.q_proj", (2 * heads * d, h))).reshape(n, heads, 2 * d)
        q, gate = both[..., :d], both[..., d:].reshape(n, heads * d)
        q = zero_norm(q, self._get(i, "self_attn.q_norm", (d,)), self.eps)
        k = linear(u, self._get(i, "self_attn.k_proj", (kvh * d, h))).reshape(n, kvh, d)
        k = zero_norm(k, self._get(i, "self_attn.k_norm", (d,)), self.eps)
        v = linear(u, self._get(i, "self_attn.v_proj", (kvh * d, h))).reshape(n, kvh, d)
        q, k = self._partial_rope(q, positions), self._partial_rope(k, positions)
        cache.keys[i] = np.concatenate([cache.keys[i], k])
        cache.values[i] = np.concatenate([cache.values[i], v])
        mask = visibility(order, np.arange(len(cache.keys[i])))
        out = attention(q, cache.keys[i], cache.values[i], mask) / (1.0 + np.exp(-gate))
        return linear(out, self._get(i, "self_attn.o_proj", (h, heads * d)))

    def _partial_rope(self, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """RoPE on the first rotary_dim dims; positions [3, n] (text-only targets: plain RoPE on the first axis)."""
        r = self.rotary_dim
        turned = (
            rope(x[..., :r], positions[0], self.rope)
            if self.mrope is None
            else mrope(x[..., :r], positions, self.rope, *self.mrope)
        )
        return np.concatenate([turned, x[..., r:]], -1)

    def _linear(self, i: int, u: np.ndarray, cache: HybridCache) -> np.ndarray:
        """Gated DeltaNet: projections, causal conv, the delta rule, the gated norm, out_proj."""
        c = self.cfg
        n, h = len(u), c.hidden_size
        nk, nv, dk, dv = (
            c.linear_num_key_heads,
            c.linear_num_value_heads,
            c.linear_key_head_dim,
            c.linear_value_head_dim,
        )
        p = "linear_attn."
        mixed = linear(u, self._get(i, p + "in_proj_qkv", (c.conv_dim, h)))  # [n, conv_dim]
        z = linear(u, self._get(i, p + "in_proj_z", (nv * dv, h))).reshape(n, nv, dv)
        b = linear(u, self._get(i, p + "in_proj_b", (nv, h)))
        a = linear(u, self._get(i, p + "in_proj_a", (nv, h)))
        conv_w = self._get(i, p + "conv1d", (c.conv_dim, 1, c.linear_conv_kernel_dim))[:, 0]
        mixed, conv_states = causal_conv(mixed, cache.conv[i], conv_w)
        q = l2_normalize(mixed[:, : c.key_dim].reshape(n, nk, dk))
        k = l2_normalize(mixed[:, c.key_dim : 2 * c.key_dim].reshape(n, nk, dk))
        v = mixed[:, 2 * c.key_dim :].reshape(n, nv, dv)
        # each key head serves nv / nk consecutive value heads
        q, k = np.repeat(q, nv // nk, axis=1) / np.sqrt(dk), np.repeat(k, nv // nk, axis=1)
        beta = 1.0 / (1.0 + np.exp(-b))
        decay_rate = np.exp(self._get(i, p + "A_log", (nv,)))
        g = -decay_rate * np.logaddexp(0.0, a + self._get(i, p + "dt_bias", (nv,)))  # softplus
        if self.chunk:
            out, final = delta_rule_chunked(q, k, v, g, beta, cache.recurrent[i], self.chunk)
            states = [final] * n  # only the last row's state is meaningful in this form
        else:
            out, states = delta_rule_recurrent(q, k, v, g, beta, cache.recurrent[i])
        if n:
            cache.conv[i], cache.recurrent[i] = conv_states[-1], states[-1]
        for row, rec in zip(cache.row_states, zip(conv_states, states, strict=True), strict=False):
            row[i] = rec
        normed = out / np.sqrt(np.mean(out * out, axis=-1, keepdims=True) + self.eps)
        gated = normed * self._get(i, p + "norm", (dv,)) * silu(z)  # this norm scales by its weight as stored
        return linear(gated.reshape(n, nv * dv), self._get(i, p + "out_proj", (h, nv * dv)))
