"""The draft's forwards: the batched training forward (block layout, masks) and the one-block DFlash v1 reference."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from demo_model import Draft, apply_rope, rms_norm, rope_tables


def block_layout(anchors, lengths, block: int, ctx_len: int, seq_len: int):
    """Positions, loss labels index and mask of the batched training forward.

    anchors [B, m] (positions), lengths [B, m] in 2..block. Each anchor gets `block` rows [anchor, mask x (block-1)]
    at anchor..anchor+block-1, of which the first `length` exist (a runtime block of num_assistant_tokens + 1 rows);
    the others are padding that no row attends to. Keys are [context rows 0..ctx_len-1 ; all block rows]; a row sees
    the context rows before its anchor and every existing row of its own block (no mask inside the block).
    Returns block_pos [B, m*block], label_pos (clamped), valid [B, m*block] (existing rows 1.. inside the sequence)
    and mask [B, 1, m*block, ctx_len+m*block].
    """
    m = anchors.shape[1]
    offset = torch.arange(block)
    block_pos = (anchors[:, :, None] + offset).flatten(1)
    exists = (offset < lengths[:, :, None]).flatten(1)
    valid = exists & (offset > 0).repeat(m) & (block_pos < seq_len)
    row_block = torch.arange(m).repeat_interleave(block)
    ctx_visible = torch.arange(ctx_len)[None, None, :] < anchors.repeat_interleave(block, dim=1)[:, :, None]
    same_block = (row_block[:, None] == row_block[None, :])[None] & exists[:, None, :]
    mask = torch.cat([ctx_visible, same_block], dim=2)[:, None]
    return block_pos, block_pos.clamp(max=seq_len - 1), valid, mask


def draft_train_logits(draft: Draft, embed, taps, tokens, anchors, lengths, block: int, mask_id: int):
    """Batched training forward: logits [B, m*block, V] for all anchors of all sequences in one pass."""
    block_pos, label_pos, valid, mask = block_layout(anchors, lengths, block, taps.shape[1], tokens.shape[1])
    ids = torch.full_like(block_pos, mask_id)
    ids[:, ::block] = tokens.gather(1, anchors)
    hidden = draft(embed[ids], taps, block_pos, mask)
    return hidden @ embed.T.to(hidden.dtype), tokens.gather(1, label_pos), valid


def draft_block_reference(draft: Draft, embed, anchor_id: int, mask_id: int, ctx_taps, block: int):
    """One DFlash v1 step written out from docs/formulas.md ("DFlash v1 draft step"): logits [block-1, V] for the
    anchor at position len(ctx_taps)."""
    g = draft.g
    nh, nkv, d, eps = g.num_attention_heads, g.num_key_value_heads, g.head_dim, g.rms_norm_eps
    start = ctx_taps.shape[0]
    x = embed[torch.tensor([anchor_id] + [mask_id] * (block - 1))]
    c = rms_norm(ctx_taps @ draft.fc.weight.T, draft.hidden_norm.weight, eps)
    cos_c, sin_c = rope_tables(torch.arange(start), d, g.rope_theta, x.dtype)
    cos_b, sin_b = rope_tables(torch.arange(start, start + block), d, g.rope_theta, x.dtype)
    for layer in draft.layers:
        a = layer.self_attn
        h = rms_norm(x, layer.input_layernorm.weight, eps)
        q = apply_rope(rms_norm((h @ a.q_proj.weight.T).view(block, nh, d), a.q_norm.weight, eps), cos_b, sin_b)
        kb = apply_rope(rms_norm((h @ a.k_proj.weight.T).view(block, nkv, d), a.k_norm.weight, eps), cos_b, sin_b)
        kc = apply_rope(rms_norm((c @ a.k_proj.weight.T).view(start, nkv, d), a.k_norm.weight, eps), cos_c, sin_c)
        k = torch.cat([kc, kb]).repeat_interleave(nh // nkv, dim=1)
        v = torch.cat([c @ a.v_proj.weight.T, h @ a.v_proj.weight.T]).view(-1, nkv, d).repeat_interleave(nh // nkv, 1)
        p = torch.softmax(torch.einsum("qhd,khd->hqk", q, k) * d**-0.5, dim=-1)
        x = x + torch.einsum("hqk,khd->qhd", p, v).reshape(block, nh * d) @ a.o_proj.weight.T
        h = rms_norm(x, layer.post_attention_layernorm.weight, eps)
        mlp = layer.mlp
        x = x + (F.silu(h @ mlp.gate_proj.weight.T) * (h @ mlp.up_proj.weight.T)) @ mlp.down_proj.weight.T
    return rms_norm(x, draft.norm.weight, eps)[1:] @ embed.T
