"""The ``target`` stage: next-token training of the Qwen3 target on random windows of the training stream."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from .checkpoints import export_target, load_target, target_geometry
from .common import log, write_json
from .corpus import load_tokenizer
from .grow import grow_target
from .train import make_optimizer, train_loop
from demo_model import Target, init_weights, param_count


def stage_target(args) -> None:
    tok = load_tokenizer(args.out / "target")
    train_ids = torch.from_numpy(np.load(args.work / "train_tokens.npy").astype(np.int64))
    heldout_ids = torch.from_numpy(np.load(args.work / "heldout_tokens.npy").astype(np.int64))
    gen = torch.Generator().manual_seed(args.seed)
    if args.grow_from:  # depth up-scaling of a trained target (grow.py); its geometry but args.layers deep
        small = load_target(args.grow_from)
        model = grow_target(small, args.layers, gen).train().requires_grad_(True)
        g = model.g
        log(f"target grown from {args.grow_from} ({small.g.num_hidden_layers} layers) to {g.num_hidden_layers}")
    else:
        g = target_geometry(args, tok.get_vocab_size())
        model = Target(g)
        init_weights(model, gen)
    log(f"target: {param_count(model) / 1e6:.2f} M parameters, {g}")
    optimizer = make_optimizer(model, args.target_lr, 0.1)
    seq = args.seq_len
    val_starts = torch.linspace(0, len(heldout_ids) - seq - 2, 64).long()

    def windows(ids, starts):
        idx = starts[:, None] + torch.arange(seq + 1)
        return ids[idx[:, :-1]], ids[idx[:, 1:]]

    def loss_fn(_step):
        x, y = windows(train_ids, torch.randint(0, len(train_ids) - seq - 1, (args.target_batch,), generator=gen))
        logits, _ = model(x)
        return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())

    @torch.no_grad()
    def evaluate():
        model.eval()
        x, y = windows(heldout_ids, val_starts)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits, _ = model(x)
        model.train()
        return {"heldout_loss": F.cross_entropy(logits.flatten(0, 1).float(), y.flatten()).item()}

    if args.grow_from:
        log(f"target at step 0: {evaluate()}")

    def checkpoint():
        export_target(model, args.out / "target", tok)

    history = train_loop(model, optimizer, args.target_steps, args.target_lr, loss_fn, evaluate, "target", checkpoint)
    checkpoint()
    write_json(args.work / "target_history.json", history)
