"""The training loop both models share: warmup + cosine learning rate, AdamW, bf16 autocast, periodic evaluation."""

from __future__ import annotations

import math
import time

import numpy as np
import torch
from torch import nn

from .common import log


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    """Linear warmup, then cosine decay to 10 % of peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def make_optimizer(model: nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95))


def train_loop(
    model, optimizer, steps: int, peak_lr: float, loss_fn, evaluate, label: str, checkpoint=None
) -> list[dict]:
    """Runs `steps` AdamW steps of bf16-autocast `loss_fn(step)`; logs and evaluates every tenth of the run, then
    calls `checkpoint()` (if given) so that an interrupted run leaves its latest model on disk."""
    history, start, running = [], time.time(), []
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, steps, peak_lr, warmup=min(200, steps // 10))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = loss_fn(step)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        running.append(loss.item())
        if (step + 1) % max(1, steps // 10) == 0 or step + 1 == steps:
            entry = {"step": step + 1, "train_loss": float(np.mean(running)), "seconds": round(time.time() - start)}
            entry |= evaluate()
            history.append(entry)
            running = []
            log(
                f"{label} " + " ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in entry.items())
            )
            if checkpoint is not None:
                checkpoint()
    return history
