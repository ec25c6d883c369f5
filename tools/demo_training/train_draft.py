"""The ``draft`` stage: the DFlash v1 draft trained on the distillation set, many anchors per sequence per pass."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch
import torch.nn.functional as F

from .checkpoints import export_draft, load_draft, load_target
from .checks import check_models
from .common import MASK, log, read_json, write_json
from .corpus import load_tokenizer
from .draft import draft_train_logits
from .train import make_optimizer, train_loop
from demo_model import Draft, init_weights, param_count


def stage_draft(args) -> None:
    tok = load_tokenizer(args.out / "target")
    mask_id = tok.token_to_id(MASK)
    target = load_target(args.out)
    meta = read_json(args.work / "distill_meta.json")
    tokens = torch.from_numpy(np.load(args.work / "distill_tokens.npy"))
    taps_mm = np.load(args.work / "distill_taps.npy", mmap_mode="r")
    taps = meta["target_layer_ids"]
    prompt_len, block = meta["prompt_len"], args.block_size
    n, seq = tokens.shape
    embed = target.embed_tokens.weight
    gen = torch.Generator().manual_seed(args.seed + 2)
    draft = Draft(replace(target.g, num_hidden_layers=args.draft_layers), len(taps))
    init_weights(draft, gen)
    if args.grow_from:  # the trained draft of the smaller target reads the same features at the grown tap positions
        old, _ = load_draft(args.grow_from)
        draft.load_state_dict(old.state_dict())
        log(f"draft started from {args.grow_from / 'draft'}")
    log(f"draft: {param_count(draft) / 1e6:.2f} M parameters, taps {taps}, mask id {mask_id}, {n} sequences")

    def batch_taps(idx):
        return torch.from_numpy(np.ascontiguousarray(taps_mm[idx.numpy()])).view(torch.bfloat16).float()

    check_idx = torch.tensor([0, 1])
    checks = check_models(target, draft, tokens[check_idx], taps, block, mask_id)
    n_val = max(8, n // 50)
    val_idx = torch.arange(n - n_val, n)
    val_anchors = torch.linspace(prompt_len, seq - 2, args.anchors).round().long().expand(n_val, -1)
    weights = torch.exp(-(torch.arange(block) - 1).clamp(min=0) / args.loss_decay).repeat(args.anchors)
    optimizer = make_optimizer(draft, args.draft_lr, 0.01)
    order = torch.randperm(n - n_val, generator=gen)

    def loss_and_acc(idx, anchors, lengths):
        logits, labels, valid = draft_train_logits(
            draft, embed, batch_taps(idx), tokens[idx], anchors, lengths, block, mask_id
        )
        ce = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), reduction="none").view_as(labels)
        w = weights * valid
        acc = ((logits.argmax(-1) == labels) & valid).view(len(idx), -1, block).float().sum((0, 1))
        return (ce * w).sum() / w.sum(), acc[1:] / valid.view(len(idx), -1, block).float().sum((0, 1))[1:]

    def loss_fn(step):
        first = step * args.draft_batch % len(order)
        idx = order[first : first + args.draft_batch]
        score = torch.rand(len(idx), seq - 1 - prompt_len, generator=gen)
        anchors = prompt_len + score.topk(args.anchors, dim=1).indices.sort(dim=1).values
        lengths = torch.randint(2, block + 1, anchors.shape, generator=gen)  # any num_assistant_tokens 1..block-1
        return loss_and_acc(idx, anchors, lengths)[0]

    @torch.no_grad()
    def evaluate():
        draft.eval()
        full = torch.full((8, args.anchors), block)
        loss, acc = zip(*(loss_and_acc(val_idx[i : i + 8], val_anchors[i : i + 8], full[: len(val_idx[i : i + 8])])
                          for i in range(0, n_val, 8)), strict=True)  # fmt: skip
        draft.train()
        acc = torch.stack(acc).mean(0)
        return {"heldout_loss": float(torch.stack(loss).mean()), "acc_row1": acc[0].item(), "acc_row7": acc[-1].item()}

    draft.train()
    if args.grow_from:
        log(f"draft at step 0: {evaluate()}")

    def checkpoint():
        export_draft(draft, args.out / "draft", tok, target.g.num_hidden_layers, taps, block)

    history = train_loop(draft, optimizer, args.draft_steps, args.draft_lr, loss_fn, evaluate, "draft", checkpoint)
    checkpoint()
    write_json(args.work / "draft_history.json", {"checks": checks, "history": history})
