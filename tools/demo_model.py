"""The demo pair's models in plain torch, for tools/train_demo.py: a Qwen3 dense decoder with a KV cache and a DFlash v1
draft (docs/formulas.md: building blocks, Qwen3 target, DFlash v1 draft step), written to match ovbuild's numpy
reference formula by formula.

Development tool only, like train_demo.py: the ovbuild package and its tests never import torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Geometry:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


def rms_norm(x, weight, eps):
    xf = x.float() if x.dtype != torch.float64 else x
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps))


def rope_tables(positions, head_dim: int, theta: float, dtype):
    """cos, sin of shape positions.shape + (1, head_dim): broadcast over the head axis of [..., S, heads, D]."""
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    ang = positions.to(torch.float64)[..., None] * inv_freq
    ang = torch.cat([ang, ang], dim=-1)[..., None, :]
    return ang.cos().to(dtype), ang.sin().to(dtype)


def apply_rope(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class Attention(nn.Module):
    """Qwen3 attention split in three parts so that the draft can take keys/values from other rows than queries."""

    def __init__(self, g: Geometry):
        super().__init__()
        self.g = g
        nh, nkv, d = g.num_attention_heads, g.num_key_value_heads, g.head_dim
        self.q_proj = nn.Linear(g.hidden_size, nh * d, bias=False)
        self.k_proj = nn.Linear(g.hidden_size, nkv * d, bias=False)
        self.v_proj = nn.Linear(g.hidden_size, nkv * d, bias=False)
        self.o_proj = nn.Linear(nh * d, g.hidden_size, bias=False)
        self.q_norm = RMSNorm(d, g.rms_norm_eps)
        self.k_norm = RMSNorm(d, g.rms_norm_eps)

    def queries(self, h, cos, sin):
        """[B, S, H] -> [B, nH, S, D]: q_proj, per-head q_norm, RoPE."""
        q = self.q_proj(h).unflatten(-1, (self.g.num_attention_heads, self.g.head_dim))
        return apply_rope(self.q_norm(q), cos, sin).transpose(1, 2)

    def keys_values(self, h, cos, sin):
        """[B, S, H] -> two [B, nKV, S, D]: k_proj, per-head k_norm, RoPE; v_proj."""
        shape = (self.g.num_key_value_heads, self.g.head_dim)
        k = apply_rope(self.k_norm(self.k_proj(h).unflatten(-1, shape)), cos, sin)
        return k.transpose(1, 2), self.v_proj(h).unflatten(-1, shape).transpose(1, 2)

    def output(self, q, k, v, mask):
        """softmax(q k^T / sqrt(D) + mask) v, then o_proj. mask: bool [..., Sq, Sk], True = visible, or None.

        GQA without copying keys/values: query head h uses KV head h // rep, so the rep query heads of one KV head
        are stacked along the query axis ([B, nKV, rep*Sq, D]) and the mask is repeated to match.
        """
        b, nh, s, d = q.shape
        nkv = k.shape[1]
        rep = nh // nkv
        if mask is not None:
            mask = mask.repeat(*([1] * (mask.dim() - 2)), rep, 1)
        q = q.reshape(b, nkv, rep * s, d)
        o = F.scaled_dot_product_attention(q, k.to(q.dtype), v.to(q.dtype), attn_mask=mask, scale=d**-0.5)
        return self.o_proj(o.view(b, nh, s, d).transpose(1, 2).flatten(2))


class MLP(nn.Module):
    def __init__(self, g: Geometry):
        super().__init__()
        self.gate_proj = nn.Linear(g.hidden_size, g.intermediate_size, bias=False)
        self.up_proj = nn.Linear(g.hidden_size, g.intermediate_size, bias=False)
        self.down_proj = nn.Linear(g.intermediate_size, g.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, g: Geometry):
        super().__init__()
        self.input_layernorm = RMSNorm(g.hidden_size, g.rms_norm_eps)
        self.self_attn = Attention(g)
        self.post_attention_layernorm = RMSNorm(g.hidden_size, g.rms_norm_eps)
        self.mlp = MLP(g)

    def finish(self, x, attn_out):
        x = x + attn_out
        return x + self.mlp(self.post_attention_layernorm(x))

    def forward(self, x, cos, sin, mask, cache=None, index=0):
        """Target layer: causal self-attention over [cached rows ; x]."""
        h = self.input_layernorm(x)
        k, v = self.self_attn.keys_values(h, cos, sin)
        if cache is not None:
            k, v = cache.extend(index, k, v)
        return self.finish(x, self.self_attn.output(self.self_attn.queries(h, cos, sin), k, v, mask))

    def draft_forward(self, x, ctx, rope_block, rope_ctx, mask):
        """DFlash layer (docs/formulas.md, "The draft layer"): queries from block rows; keys/values from
        [context C ; normed block rows]."""
        h = self.input_layernorm(x)
        kc, vc = self.self_attn.keys_values(ctx, *rope_ctx)
        kb, vb = self.self_attn.keys_values(h, *rope_block)
        k, v = torch.cat([kc, kb], dim=2), torch.cat([vc, vb], dim=2)
        return self.finish(x, self.self_attn.output(self.self_attn.queries(h, *rope_block), k, v, mask))


class KVCache:
    """Per-layer keys/values [B, nKV, capacity, D], preallocated; the first `length` positions are valid."""

    def __init__(self, layers: int, capacity: int = 512):
        self.k: list = [None] * layers
        self.v: list = [None] * layers
        self.capacity = capacity
        self.length = 0

    def extend(self, i: int, k, v):
        """Writes k, v at positions length.. of layer i; returns all valid keys/values including them."""
        if self.k[i] is None:
            self.k[i] = k.new_zeros(*k.shape[:2], self.capacity, k.shape[3])
            self.v[i] = v.new_zeros(*v.shape[:2], self.capacity, v.shape[3])
        end = self.length + k.shape[2]
        self.k[i][:, :, self.length : end] = k
        self.v[i][:, :, self.length : end] = v
        return self.k[i][:, :, :end], self.v[i][:, :, :end]


class Target(nn.Module):
    """Qwen3ForCausalLM with tied lm_head. State-dict names are the HF ones without the ``model.`` prefix."""

    def __init__(self, g: Geometry):
        super().__init__()
        self.g = g
        self.embed_tokens = nn.Embedding(g.vocab_size, g.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(g) for _ in range(g.num_hidden_layers))
        self.norm = RMSNorm(g.hidden_size, g.rms_norm_eps)

    def forward(self, ids, cache: KVCache | None = None, taps: tuple[int, ...] = ()):
        """ids [B, S] at positions cache.length.. -> (logits [B, S, V], concatenated tapped layer outputs or None)."""
        past = cache.length if cache is not None else 0
        s = ids.shape[1]
        dtype = self.embed_tokens.weight.dtype
        cos, sin = rope_tables(torch.arange(past, past + s), self.g.head_dim, self.g.rope_theta, dtype)
        mask = torch.ones(s, past + s, dtype=torch.bool).tril(past)
        x = self.embed_tokens(ids)
        tapped = []
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, mask, cache, i)
            if i in taps:
                tapped.append(x)
        if cache is not None:
            cache.length += s
        logits = self.norm(x) @ self.embed_tokens.weight.T.to(x.dtype)
        return logits, (torch.cat(tapped, dim=-1) if taps else None)


class Draft(nn.Module):
    """DFlashDraftModel (v1): fc + hidden_norm on the concatenated taps, decoder layers, final norm."""

    def __init__(self, g: Geometry, n_taps: int):
        super().__init__()
        self.g = g
        self.fc = nn.Linear(n_taps * g.hidden_size, g.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(g.hidden_size, g.rms_norm_eps)
        self.layers = nn.ModuleList(DecoderLayer(g) for _ in range(g.num_hidden_layers))
        self.norm = RMSNorm(g.hidden_size, g.rms_norm_eps)

    def forward(self, block_embeds, taps, block_pos, mask):
        """Training-time forward: block rows [B, R, H] at block_pos [B, R]; context = taps [B, S, nH_t] at 0..S-1."""
        dtype = block_embeds.dtype
        ctx = self.hidden_norm(self.fc(taps))
        rope_ctx = rope_tables(torch.arange(taps.shape[1]), self.g.head_dim, self.g.rope_theta, dtype)
        rope_block = rope_tables(block_pos, self.g.head_dim, self.g.rope_theta, dtype)
        x = block_embeds
        for layer in self.layers:
            x = layer.draft_forward(x, ctx, rope_block, rope_ctx, mask)
        return self.norm(x)


def init_weights(model: nn.Module, generator: torch.Generator) -> None:
    for name, p in model.named_parameters():
        if p.dim() == 2:
            with torch.no_grad():
                p.normal_(0.0, 0.02, generator=generator)
        elif not name.endswith("norm.weight"):
            raise ValueError(f"unexpected parameter {name}")


def tap_ids(num_target_layers: int, n: int) -> list[int]:
    """z-lab default taps: round(1 + i (L-4) / (n-1)); never the last layer."""
    ids = [round(1 + i * (num_target_layers - 4) / (n - 1)) for i in range(n)]
    assert max(ids) < num_target_layers - 1, ids
    return ids


def param_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
