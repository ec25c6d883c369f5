"""Equivalence checks: cached vs full target forward, batched training vs one-block reference draft forward."""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from .checkpoints import target_geometry
from .common import log
from .draft import draft_block_reference, draft_train_logits
from demo_model import Draft, KVCache, Target, init_weights, tap_ids


@torch.no_grad()
def check_models(target: Target, draft: Draft, tokens, taps: list[int], block: int, mask_id: int) -> dict:
    """Equivalence checks in float64; raises AssertionError on mismatch. tokens [2, S]."""
    target, draft = target.double(), draft.double()
    full_logits, full_taps = target(tokens, taps=tuple(taps))
    cache, pieces = KVCache(target.g.num_hidden_layers), []
    for s, e in [(0, 7), (7, 8), (8, 15), (15, tokens.shape[1])]:
        pieces.append(target(tokens[:, s:e], cache, taps=tuple(taps)))
    inc_logits, inc_taps = (torch.cat(t, dim=1) for t in zip(*pieces, strict=True))
    target_diff = max((full_logits - inc_logits).abs().max().item(), (full_taps - inc_taps).abs().max().item())
    assert target_diff < 1e-9, f"cached target forward differs from full forward by {target_diff}"

    seq = tokens.shape[1]
    embed = target.embed_tokens.weight
    anchors = torch.tensor([[1, 5, seq - 3, 9, seq // 2], [seq - 1, 2, 12, 3, seq - block]])
    lengths = torch.tensor([[block, 4, block, 2, block - 1], [block, 3, block, 5, block]])
    logits, _, _ = draft_train_logits(draft, embed, full_taps, tokens, anchors, lengths, block, mask_id)
    draft_diff = 0.0
    for b, (row, row_lengths) in enumerate(zip(anchors.tolist(), lengths.tolist(), strict=True)):
        for i, (a, n) in enumerate(zip(row, row_lengths, strict=True)):
            ref = draft_block_reference(draft, embed, tokens[b, a].item(), mask_id, full_taps[b, :a], n)
            diff = (ref - logits[b, i * block + 1 : i * block + n]).abs().max().item()
            assert diff < 1e-5, f"anchor {a}, block {n}: batched draft forward != reference ({diff})"
            draft_diff = max(draft_diff, diff)
    target.float(), draft.float()
    log(f"check: cached target max|diff| {target_diff:.2e}; batched vs one-block draft max|diff| {draft_diff:.2e}")
    return {"target_cache_max_abs_diff": target_diff, "draft_batched_vs_reference_max_abs_diff": draft_diff}


def perturb_norms(model: nn.Module, gen: torch.Generator) -> None:
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=gen))


def stage_check(args) -> None:
    """Checks on random models (norm weights perturbed so that every weight matters) and random tokens."""
    gen = torch.Generator().manual_seed(args.seed)
    g = target_geometry(args, 512)
    target, draft = Target(g), Draft(replace(g, num_hidden_layers=args.draft_layers), args.num_taps)
    for model in (target, draft):
        init_weights(model, gen)
        perturb_norms(model, gen)
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(5.0 if p.dim() == 2 else 1.0)  # larger weights: sharper attention, a stricter test
    tokens = torch.randint(2, g.vocab_size, (2, 40), generator=gen)
    check_models(target, draft, tokens, tap_ids(g.num_hidden_layers, args.num_taps), args.block_size, 1)
