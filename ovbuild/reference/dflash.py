"""Numpy reference of a DFlash v1-style draft step (also the DSpark / DeepSpec backbone with candidate offset 0).

One step for one sequence: the new context rows (target taps of tokens the draft has not seen) extend the draft's
cache of context keys/values; the block [anchor, mask x (B-1)] then attends to all committed context plus itself.
Only context keys/values persist across steps; the block is recomputed every step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ovbuild.reference.layers import attention, linear, rms_norm, rope, swiglu_mlp, visibility
from ovbuild.reference.qwen3 import KVCache, new_cache
from ovbuild.reference.rope import rope_from_config
from ovbuild.reference.weights import LayerWeights, ReferenceWeights, load, reference_weights
from ovbuild.weights.draft_config import DraftConfig

if TYPE_CHECKING:
    from ovbuild.weights.tensor_names import WeightSource


class DFlashReference:
    """A DFlash draft with the target's embedding table and lm_head (unless the draft carries its own)."""

    def __init__(
        self, cfg: DraftConfig, draft: WeightSource | ReferenceWeights, target: WeightSource | ReferenceWeights
    ):
        self.cfg = cfg
        h, v = cfg.hidden_size, cfg.vocab_size
        draft, target = reference_weights(draft), reference_weights(target)
        self.weights = draft
        # RoPE and eps from config.json itself, not from the parsed config the builders use
        self.rope = rope_from_config(draft.config, cfg.head_dim)
        self.eps = float(draft.config.get("rms_norm_eps", 1e-6))
        self.fc = load(draft, "fc", (h, cfg.num_taps * cfg.target_hidden_size))
        self.hidden_norm = load(draft, "hidden_norm", (h,))
        self.layers = [LayerWeights.load(draft, cfg, i) for i in range(cfg.num_layers)]
        self.norm = load(draft, "norm", (h,))
        self.embed = load(_owner(draft, target, "embed_tokens"), "embed_tokens", (v, h))
        self.lm_head = load(_owner(draft, target, "lm_head"), "lm_head", (v, h))

    def new_cache(self) -> KVCache:
        return new_cache(self.cfg.num_layers, self.cfg.num_kv_heads, self.cfg.head_dim)

    def context_feature(self, taps: np.ndarray) -> np.ndarray:
        """C = hidden_norm(fc(concat taps)): [S, n * H_t] -> [S, H]."""
        return rms_norm(linear(taps, self.fc), self.hidden_norm, self.eps)

    def forward(self, cache: KVCache, taps: np.ndarray, block_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One call in the per-row layout: S context rows (target taps) then Q block rows, after the cache.

        Context rows are committed to the cache; block rows are not. Returns logits [Q - offset, V] and post-norm
        hidden states [Q - offset, H] of the candidate rows.
        """
        cfg = self.cfg
        c = self.context_feature(taps)  # [S, H]
        n_ctx, n_blk = len(c), len(block_ids)
        positions = cache.length + np.arange(n_ctx + n_blk)
        x = self.embed[np.asarray(block_ids, dtype=np.int64)] * cfg.input_embedding_scale  # [Q, H]
        for i, w in enumerate(self.layers):
            x = self._layer(i, w, x, c, positions, cache)
        h = rms_norm(x, self.norm, self.eps)[cfg.candidate_offset :]
        return self.logits(h), h

    def step(
        self, cache: KVCache, taps: np.ndarray, anchor: int, num_tokens: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """One draft step: new context rows, then the block [anchor, mask x (n-1)] of n = num_tokens +
        candidate_offset rows (the full block_size when num_tokens is None), which proposes num_tokens tokens."""
        cfg = self.cfg
        rows = cfg.block_size if num_tokens is None else min(cfg.block_size, num_tokens + cfg.candidate_offset)
        ids = np.array([anchor] + [cfg.mask_token_id] * (rows - 1))
        return self.forward(cache, taps, ids)

    def logits(self, h: np.ndarray) -> np.ndarray:
        """lm_head, then output_multiplier and tanh softcapping where the config asks for them."""
        logits = linear(h, self.lm_head) * self.cfg.output_multiplier
        cap = self.cfg.final_logit_softcapping
        return cap * np.tanh(logits / cap) if cap else logits

    def _layer(
        self, i: int, w: LayerWeights, x: np.ndarray, c: np.ndarray, positions: np.ndarray, cache: KVCache
    ) -> np.ndarray:
        """One decoder layer on the block rows x [Q, H]; families that wrap the Qwen3 layer override this."""
        eps = self.eps
        x = x + self._attend(i, w, rms_norm(x, w.input_layernorm, eps), c, positions, cache)
        return x + self._mlp(w, rms_norm(x, w.post_attention_layernorm, eps))

    def _attend(
        self, i: int, w: LayerWeights, u: np.ndarray, c: np.ndarray, positions: np.ndarray, cache: KVCache
    ) -> np.ndarray:
        """Commit the context rows' keys/values to layer i's cache; attention output of the block rows u [Q, H].

        keys/values: the context feature c [S, H] on context rows, u (the block's attention input) on block rows.
        """
        n_ctx, n_blk = len(c), len(u)
        k, v = self._kv(w, np.concatenate([c, u]), positions)  # [S + Q, KV, D]
        keys, values = np.concatenate([cache.keys[i], k]), np.concatenate([cache.values[i], v])
        cache.keys[i], cache.values[i] = keys[: len(keys) - n_blk], values[: len(values) - n_blk]
        if not n_blk:
            return np.zeros_like(u)
        return self._attention(i, w, u, positions[n_ctx:], keys, values)

    def _mlp(self, w: LayerWeights, x: np.ndarray) -> np.ndarray:
        return swiglu_mlp(x, w.gate_proj, w.up_proj, w.down_proj)

    def _kv(self, w: LayerWeights, x: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        cfg = self.cfg
        k = rms_norm(linear(x, w.k_proj).reshape(len(x), cfg.num_kv_heads, cfg.head_dim), w.k_norm, self.eps)
        v = linear(x, w.v_proj).reshape(len(x), cfg.num_kv_heads, cfg.head_dim)  # [n, KV, D]
        return rope(k, positions, self.rope), v

    def _attention(
        self, i: int, w: LayerWeights, u: np.ndarray, positions: np.ndarray, keys: np.ndarray, values: np.ndarray
    ) -> np.ndarray:
        """Queries from the block rows at `positions`; keys/values of every position up to the block's end."""
        cfg = self.cfg
        q = rms_norm(linear(u, w.q_proj).reshape(len(u), cfg.num_heads, cfg.head_dim), w.q_norm, self.eps)
        q = rope(q, positions, self.rope)  # [Q, H, D]
        key_positions = np.arange(len(keys))
        groups = None
        if not cfg.layer_causal[i]:  # the block is one bidirectional group; context keys stay causal
            groups = (np.zeros(len(u), int), np.where(key_positions >= positions[0], 0, -1))
        mask = visibility(positions, key_positions, window=cfg.sliding_windows[i], bidirectional=groups)
        return linear(attention(q, keys, values, mask), w.o_proj)


def _owner(draft: ReferenceWeights, target: ReferenceWeights, name: str) -> ReferenceWeights:
    """Drafts normally borrow the target's embedding and lm_head; some (DSpark) carry their own copies."""
    return draft if draft.has(name) else target
