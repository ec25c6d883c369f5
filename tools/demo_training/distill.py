"""The ``distill`` stage: the target's greedy continuations of training prompts, with its tapped hidden states."""

from __future__ import annotations

import numpy as np
import torch

from .checkpoints import load_target
from .common import EOS, log, write_json
from .corpus import load_tokenizer
from .grow import target_taps
from demo_model import KVCache, Target


@torch.no_grad()
def greedy_batch(target: Target, prompts, new_tokens: int):
    """Greedy continuation of equally long prompts [B, P] -> [B, P + new_tokens] (KV cache, float32)."""
    cache = KVCache(target.g.num_hidden_layers, prompts.shape[1] + new_tokens)
    logits, _ = target(prompts, cache)
    out = [prompts, logits[:, -1].argmax(-1, keepdim=True)]
    for _ in range(new_tokens - 1):
        logits, _ = target(out[-1], cache)
        out.append(logits[:, -1].argmax(-1, keepdim=True))
    return torch.cat(out, dim=1)


def sample_prompts(ids: np.ndarray, n: int, length: int, eos: int, rng: np.random.Generator) -> np.ndarray:
    """n windows of the training stream that lie inside one file (no eos)."""
    prompts = []
    while len(prompts) < n:
        s = int(rng.integers(0, len(ids) - length))
        window = ids[s : s + length]
        if eos not in window:
            prompts.append(window)
    return np.stack(prompts).astype(np.int64)


def stage_distill(args) -> None:
    tok = load_tokenizer(args.out / "target")
    target = load_target(args.out)
    taps = target_taps(args, target.g.num_hidden_layers)
    rng = np.random.default_rng(args.seed + 1)
    prompts = sample_prompts(np.load(args.work / "train_tokens.npy"), args.distill_seqs, args.prompt_len,
                             tok.token_to_id(EOS), rng)  # fmt: skip
    seq = args.prompt_len + args.gen_len
    n, width = len(prompts), len(taps) * target.g.hidden_size
    tokens = np.lib.format.open_memmap(args.work / "distill_tokens.npy", "w+", np.int64, (n, seq))
    tapped = np.lib.format.open_memmap(args.work / "distill_taps.npy", "w+", np.int16, (n, seq, width))
    agree = total = 0
    for b in range(0, n, args.gen_batch):
        batch = greedy_batch(target, torch.from_numpy(prompts[b : b + args.gen_batch]), args.gen_len)
        with torch.no_grad():
            logits, h = target(batch, taps=tuple(taps))
        pred = logits[:, args.prompt_len - 1 : -1].argmax(-1)
        agree += (pred == batch[:, args.prompt_len :]).sum().item()
        total += pred.numel()
        tokens[b : b + len(batch)] = batch.numpy()
        tapped[b : b + len(batch)] = h.to(torch.bfloat16).view(torch.int16).numpy()
        log(f"distill {b + len(batch)}/{n} sequences")
    tokens.flush()
    tapped.flush()
    meta = {"prompt_len": args.prompt_len, "target_layer_ids": taps, "greedy_agreement": agree / total}
    write_json(args.work / "distill_meta.json", meta)
    sample = tok.decode(tokens[0, args.prompt_len :].tolist())
    log(f"teacher-forced argmax agrees with the greedy tokens on {agree / total:.5f}; sample:\n{sample}")
