"""The ``eval`` stage: greedy vs speculative decoding of held-out prompts, acceptance summary and decode timings."""

from __future__ import annotations

import re
import sysconfig
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from .checkpoints import load_draft, load_target
from .common import EOS, log, read_json, write_json
from .corpus import load_tokenizer
from .draft import draft_block_reference
from demo_model import Draft, KVCache, Target


@torch.no_grad()
def greedy_generate(target: Target, prompt: list[int], max_new: int, eos: int) -> list[int]:
    cache = KVCache(target.g.num_hidden_layers)
    logits, _ = target(torch.tensor([prompt]), cache)
    out = [int(logits[0, -1].argmax())]
    while len(out) < max_new and out[-1] != eos:
        logits, _ = target(torch.tensor([[out[-1]]]), cache)
        out.append(int(logits[0, -1].argmax()))
    return out


@torch.no_grad()
def speculative_generate(target, draft, dflash: dict, prompt: list[int], k: int, max_new: int, eos: int):
    """Greedy DFlash decoding (docs/formulas.md, "The speculative step") with blocks of k+1 rows.

    Returns (new tokens, accepted count per step)."""
    taps = tuple(dflash["target_layer_ids"])
    embed = target.embed_tokens.weight
    cache = KVCache(target.g.num_hidden_layers)
    logits, ctx = target(torch.tensor([prompt]), cache, taps)
    ctx = ctx[0]
    out = [*prompt, int(logits[0, -1].argmax())]
    start, accepted = len(prompt), []
    while len(out) - len(prompt) < max_new and eos not in out[len(prompt) :]:
        draft_logits = draft_block_reference(draft, embed, out[start], dflash["mask_token_id"], ctx, k + 1)
        candidates = draft_logits.argmax(-1).tolist()
        logits, new_taps = target(torch.tensor([[out[start], *candidates]]), cache, taps)
        verified = logits[0].argmax(-1).tolist()
        a = 0
        while a < k and candidates[a] == verified[a]:
            a += 1
        out += [*candidates[:a], verified[a]]
        ctx = torch.cat([ctx, new_taps[0, : a + 1]])
        start += a + 1
        cache.length = start
        accepted.append(a)
    return truncate(out[len(prompt) :], max_new, eos), accepted


def truncate(tokens: list[int], max_new: int, eos: int) -> list[int]:
    tokens = tokens[:max_new]
    return tokens[: tokens.index(eos) + 1] if eos in tokens else tokens


def loops(tokens: list[int], n: int) -> bool:
    """True when some n-gram occurs twice: the mark of a greedy loop."""
    grams = Counter(tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1))
    return any(c > 1 for c in grams.values())


def eval_prompts(args, tok) -> list[list[int]]:
    """Prompts = the first eval_prompt_len tokens from a def/class line of a held-out file, at most eval_per_file per
    file, spread evenly over all such lines (sorted by file and line)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    starts = []
    for rel in read_json(args.work / "heldout_files.json"):
        text = (root / rel).read_text(encoding="utf-8", errors="replace")
        starts += [(rel, m.start()) for m in re.finditer(r"^[ \t]*(?:async def|def|class) \w", text, re.M)]
    chosen, per_file = [], Counter()
    for i in np.linspace(0, len(starts) - 1, 4 * args.eval_prompts).round().astype(int):
        rel, offset = starts[i]
        if per_file[rel] < args.eval_per_file and (rel, offset) not in chosen:
            chosen.append((rel, offset))
            per_file[rel] += 1
    prompts = []
    for rel, offset in chosen[: args.eval_prompts]:
        text = (root / rel).read_text(encoding="utf-8", errors="replace")[offset:]
        prompts.append(tok.encode(text).ids[: args.eval_prompt_len])
    return prompts


def acceptance_summary(accepted: list[int], k: int) -> dict:
    hist = np.bincount(accepted, minlength=k + 1).tolist()
    mean = 1 + float(np.mean(accepted)) if accepted else None
    return {"steps": len(accepted), "mean_acceptance_length": mean, "histogram": hist}


@torch.no_grad()
def decode_timings(target: Target, draft: Draft, dflash: dict, prompt: list[int], block: int) -> dict:
    """Milliseconds (float32, batch 1, this machine) for one target token, one target verify and one draft block."""
    eos = -1
    t0 = time.perf_counter()
    greedy_generate(target, prompt, 128, eos)
    per_token = (time.perf_counter() - t0) / 128
    taps = tuple(dflash["target_layer_ids"])
    cache = KVCache(target.g.num_hidden_layers)
    _, ctx = target(torch.tensor([prompt]), cache, taps)
    t0 = time.perf_counter()
    for _ in range(20):
        target(torch.tensor([prompt[:block]]), cache, taps)
        cache.length = len(prompt)
    verify = (time.perf_counter() - t0) / 20
    t0 = time.perf_counter()
    for _ in range(20):
        draft_block_reference(draft, target.embed_tokens.weight, prompt[-1], dflash["mask_token_id"], ctx[0], block)
    draft_block = (time.perf_counter() - t0) / 20
    return {
        "target_ms_per_token": 1e3 * per_token,
        "target_verify_ms": 1e3 * verify,
        "draft_block_ms": 1e3 * draft_block,
    }


def stage_eval(args) -> None:
    tok = load_tokenizer(args.out / "target")
    eos = tok.token_to_id(EOS)
    target, (draft, dflash) = load_target(args.out), load_draft(args.out)
    prompts = eval_prompts(args, tok)
    timings = decode_timings(target, draft, dflash, prompts[0], args.block_size)
    log("float32 timings: " + ", ".join(f"{k} {v:.2f}" for k, v in timings.items()))
    target, draft = target.double(), draft.double()
    greedy = [greedy_generate(target, p, args.eval_new, eos) for p in prompts]
    kept = [i for i, g in enumerate(greedy) if not loops(g, args.loop_ngram)]
    log(f"eval: {len(prompts)} prompts, {len(kept)} whose greedy continuation has no repeated {args.loop_ngram}-gram")
    results = {"prompts": len(prompts), "non_looping_prompts": len(kept), "timings_ms_float32": timings}
    for k in args.assistant_tokens:
        per_prompt, same = [], True
        for p, g in zip(prompts, greedy, strict=True):
            spec, accepted = speculative_generate(target, draft, dflash, p, k, args.eval_new, eos)
            same &= spec == g
            per_prompt.append(accepted)
        assert same, f"speculative output differs from greedy output (k={k})"
        row = {
            "non_looping": acceptance_summary([a for i in kept for a in per_prompt[i]], k),
            "all": acceptance_summary([a for acc in per_prompt for a in acc], k),
            "speculative_equals_greedy": same,
        }
        results[f"num_assistant_tokens={k}"] = row
        log(f"k={k}: non-looping {row['non_looping']}; all {row['all']}; speculative == greedy: {same}")
    sample = prompts[kept[0]] if kept else prompts[0]
    log("sample prompt + greedy continuation:\n" + tok.decode(sample + greedy[prompts.index(sample)]))
    write_json(args.work / "eval.json", results)
