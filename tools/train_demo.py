#!/usr/bin/env python3
"""Train the ovbuild demo pair: a small Qwen3 target and a DFlash v1 draft for it, on Python stdlib code.

Development tool only. It needs torch (the ``train`` extra: ``pip install -e .[train]``); the ovbuild package and its
tests never import torch. The checkpoints it writes follow the Hugging Face layout (bf16 safetensors) and the formulas
written out in ``docs/formulas.md`` (building blocks, Qwen3 target with taps, DFlash v1 draft step, the speculative
step), so an independent numpy/OpenVINO implementation can run them.

Stages (each re-runnable on its own; later stages read what earlier ones wrote):

* ``tokenizer``: the corpus is the ``*.py`` source of this interpreter's standard library (tests, idlelib, lib2to3,
  encodings, pydoc_data and a few other repetitive folders left out), in sorted path order; a file is held out when
  the SHA-256 of its relative path is 0..4 mod 100 (about 5 %). A byte-level BPE tokenizer is trained on the
  training files, with ``<|endoftext|>`` (eos = bos = pad) and ``<|mask|>`` (the DFlash mask token, never fed to
  the target). Token streams go to the work directory, never into the repository.
* ``target``: next-token training of a Qwen3 dense decoder (plain torch, tied embeddings) on random 256-token
  windows, AdamW, warmup + cosine; written bf16 to ``<out>/target``.
* ``distill``: the target's greedy continuations of prompts sampled from the training stream, plus its tapped
  hidden states (outputs of ``target_layer_ids``) for every position; stored in the work directory.
* ``draft``: a 2-layer DFlash v1 draft trained on those continuations, many anchors per sequence in one pass with
  a block-sparse mask, each anchor with a block length drawn from 2..block_size (runtimes draft
  num_assistant_tokens + 1 rows), cross-entropy against the target's greedy tokens, row j weighted exp(-(j-1)/4);
  written bf16 to ``<out>/draft`` (no embed_tokens, no lm_head: the draft uses the target's).
* ``eval``: greedy speculative decoding (docs/formulas.md, "The speculative step") on held-out prompts, in float64
  from the shipped bf16 weights; reports acceptance per num_assistant_tokens and asserts it reproduces plain greedy
  decoding.

``--check`` runs the equivalence checks alone: cached target decoding equals the full forward, and the batched
training-time draft forward equals a direct one-block implementation of the DFlash v1 draft step (docs/formulas.md)
for every anchor. The ``draft`` stage runs the same checks on the real target before training.

Reproduce everything (about 50 minutes on 2 idle CPU cores; see docs/demo_training.md)::

    python tools/train_demo.py
"""

from __future__ import annotations

import os

# The machine is shared: busy-waiting OpenMP threads make 2-thread torch up to 10x slower than 1 thread whenever
# another process holds a core. Passive waiting must be chosen before torch (and its OpenMP runtime) loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import hashlib
import json
import math
import re
import sys
import sysconfig
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from demo_model import (
    Draft,
    Geometry,
    KVCache,
    Target,
    apply_rope,
    init_weights,
    param_count,
    rms_norm,
    rope_tables,
    tap_ids,
)

EOS = "<|endoftext|>"
MASK = "<|mask|>"
REPO = Path(__file__).resolve().parents[1]
EXCLUDED_DIRS = {
    "test", "tests", "idlelib", "lib2to3", "site-packages", "encodings", "pydoc_data", "ensurepip", "turtledemo",
    "__phello__", "__pycache__",
}  # fmt: skip
STAGES = ("tokenizer", "target", "distill", "draft", "eval")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ----------------------------------------------------------------------------------------------------------- corpus


def corpus_files() -> list[tuple[str, Path]]:
    """(relative path, path) of every stdlib ``*.py`` file kept in the corpus, in sorted order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if any(p in EXCLUDED_DIRS or p.startswith("config-") for p in rel.parts[:-1]):
            continue
        if rel.name.startswith("_sysconfigdata"):
            continue
        files.append((rel.as_posix(), path))
    return files


def is_heldout(rel: str) -> bool:
    return int(hashlib.sha256(rel.encode()).hexdigest(), 16) % 100 < 5


def read_corpus() -> tuple[list[str], dict[str, str]]:
    """Training texts and held-out texts (by relative path)."""
    train, heldout = [], {}
    for rel, path in corpus_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        if is_heldout(rel):
            heldout[rel] = text
        else:
            train.append(text)
    return train, heldout


# -------------------------------------------------------------------------------------------------------- tokenizer


def train_tokenizer(texts: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS, MASK],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return tok


def save_tokenizer(tok, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": EOS,
        "eos_token": EOS,
        "pad_token": EOS,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "model_max_length": 4096,
        "clean_up_tokenization_spaces": False,
    }
    write_json(out / "tokenizer_config.json", config)


def load_tokenizer(path: Path):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path / "tokenizer.json"))


def encode_stream(tok, texts: list[str]) -> np.ndarray:
    """All texts as one uint16 stream, each followed by eos."""
    eos = tok.token_to_id(EOS)
    ids = []
    for enc in tok.encode_batch(texts):
        ids.extend(enc.ids)
        ids.append(eos)
    return np.asarray(ids, dtype=np.uint16)


def stage_tokenizer(args) -> None:
    train, heldout = read_corpus()
    log(f"corpus: {len(train)} training files ({sum(map(len, train)) / 1e6:.1f} MB), {len(heldout)} held out")
    tok = train_tokenizer(train, args.vocab)
    save_tokenizer(tok, args.out / "target")
    train_ids, heldout_ids = encode_stream(tok, train), encode_stream(tok, list(heldout.values()))
    np.save(args.work / "train_tokens.npy", train_ids)
    np.save(args.work / "heldout_tokens.npy", heldout_ids)
    write_json(args.work / "heldout_files.json", sorted(heldout))
    chars = sum(map(len, train))
    log(f"tokenizer: vocab {tok.get_vocab_size()}, mask id {tok.token_to_id(MASK)}, eos id {tok.token_to_id(EOS)}")
    log(f"tokens: train {len(train_ids)} ({chars / len(train_ids):.2f} chars/token), held out {len(heldout_ids)}")


# ------------------------------------------------------------------------------------------------------ checkpoints


def write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n")


def read_json(path: Path):
    return json.loads(path.read_text())


def hf_config(g: Geometry, bos: int, eos: int) -> dict:
    return {
        "vocab_size": g.vocab_size,
        "hidden_size": g.hidden_size,
        "intermediate_size": g.intermediate_size,
        "num_hidden_layers": g.num_hidden_layers,
        "num_attention_heads": g.num_attention_heads,
        "num_key_value_heads": g.num_key_value_heads,
        "head_dim": g.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "rms_norm_eps": g.rms_norm_eps,
        "rope_theta": g.rope_theta,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_sliding_window": False,
        "sliding_window": None,
        "layer_types": ["full_attention"] * g.num_hidden_layers,
        "initializer_range": 0.02,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "torch_dtype": "bfloat16",
    }


def save_weights(model: nn.Module, path: Path, prefix: str = "") -> None:
    tensors = {prefix + k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, str(path), metadata={"format": "pt"})


def load_weights(model: nn.Module, path: Path, prefix: str = "") -> None:
    tensors = load_file(str(path))
    model.load_state_dict({k.removeprefix(prefix): v.to(torch.float32) for k, v in tensors.items()}, strict=True)


def export_target(model: Target, out: Path, tok) -> None:
    out.mkdir(parents=True, exist_ok=True)
    eos = tok.token_to_id(EOS)
    config = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}
    config |= hf_config(model.g, eos, eos) | {"tie_word_embeddings": True, "use_cache": True}
    write_json(out / "config.json", config)
    write_json(out / "generation_config.json", {"bos_token_id": eos, "eos_token_id": eos, "do_sample": False})
    save_weights(model, out / "model.safetensors", prefix="model.")


def export_draft(model: Draft, out: Path, tok, num_target_layers: int, taps: list[int], block: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    eos, mask = tok.token_to_id(EOS), tok.token_to_id(MASK)
    config = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
    }
    config |= hf_config(model.g, eos, eos) | {
        "tie_word_embeddings": False,
        "num_target_layers": num_target_layers,
        "block_size": block,
        "dflash_config": {"mask_token_id": mask, "target_layer_ids": taps, "block_size": block},
    }
    write_json(out / "config.json", config)
    save_weights(model, out / "model.safetensors")


def geometry_from_config(config: dict) -> Geometry:
    return Geometry(**{k: config[k] for k in Geometry.__dataclass_fields__})


def load_target(out: Path) -> Target:
    model = Target(geometry_from_config(read_json(out / "target" / "config.json")))
    load_weights(model, out / "target" / "model.safetensors", prefix="model.")
    return model.eval().requires_grad_(False)


def load_draft(out: Path) -> tuple[Draft, dict]:
    config = read_json(out / "draft" / "config.json")
    dflash = config["dflash_config"]
    model = Draft(geometry_from_config(config), len(dflash["target_layer_ids"]))
    load_weights(model, out / "draft" / "model.safetensors")
    return model.eval().requires_grad_(False), dflash


def target_geometry(args, vocab: int) -> Geometry:
    return Geometry(
        vocab_size=vocab,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.head_dim,
        rope_theta=args.rope_theta,
    )


# ---------------------------------------------------------------------------------------------------------- training


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


def train_loop(model, optimizer, steps: int, peak_lr: float, loss_fn, evaluate, label: str) -> list[dict]:
    """Runs `steps` AdamW steps of bf16-autocast `loss_fn(step)`; logs and evaluates every tenth of the run."""
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
    return history


def stage_target(args) -> None:
    tok = load_tokenizer(args.out / "target")
    train_ids = torch.from_numpy(np.load(args.work / "train_tokens.npy").astype(np.int64))
    heldout_ids = torch.from_numpy(np.load(args.work / "heldout_tokens.npy").astype(np.int64))
    g = target_geometry(args, tok.get_vocab_size())
    gen = torch.Generator().manual_seed(args.seed)
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

    history = train_loop(model, optimizer, args.target_steps, args.target_lr, loss_fn, evaluate, "target")
    export_target(model, args.out / "target", tok)
    write_json(args.work / "target_history.json", history)


# ------------------------------------------------------------------------------------------------------ distillation


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
    taps = tap_ids(target.g.num_hidden_layers, args.num_taps)
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


# ------------------------------------------------------------------------------------------------------------- draft


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
    history = train_loop(draft, optimizer, args.draft_steps, args.draft_lr, loss_fn, evaluate, "draft")
    export_draft(draft, args.out / "draft", tok, target.g.num_hidden_layers, taps, block)
    write_json(args.work / "draft_history.json", {"checks": checks, "history": history})


# -------------------------------------------------------------------------------------------------------- evaluation


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


# -------------------------------------------------------------------------------------------------------------- main


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "stages", nargs="*", metavar="STAGE", help=f"stages to run, in order: {', '.join(STAGES)} (default: all)"
    )
    p.add_argument("--check", action="store_true", help="run the equivalence checks on random models and exit")
    p.add_argument("--out", type=Path, default=REPO / "ovbuild" / "data" / "demo", help="checkpoint folder")
    p.add_argument("--work", type=Path, default=Path.home() / ".cache" / "ovbuild_train_demo", help="scratch")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    g = p.add_argument_group("geometry")
    g.add_argument("--vocab", type=int, default=4096)
    g.add_argument("--hidden", type=int, default=256)
    g.add_argument("--intermediate", type=int, default=512)
    g.add_argument("--layers", type=int, default=8)
    g.add_argument("--heads", type=int, default=4)
    g.add_argument("--kv-heads", type=int, default=2)
    g.add_argument("--head-dim", type=int, default=64)
    g.add_argument("--rope-theta", type=float, default=10000.0)
    g.add_argument("--draft-layers", type=int, default=2)
    g.add_argument("--num-taps", type=int, default=3)
    g.add_argument("--block-size", type=int, default=8)
    t = p.add_argument_group("training")
    t.add_argument("--seq-len", type=int, default=256)
    t.add_argument("--target-steps", type=int, default=600)
    t.add_argument("--target-batch", type=int, default=32)
    t.add_argument("--target-lr", type=float, default=2e-3)
    t.add_argument("--distill-seqs", type=int, default=6144)
    t.add_argument("--prompt-len", type=int, default=96)
    t.add_argument("--gen-len", type=int, default=160)
    t.add_argument("--gen-batch", type=int, default=128)
    t.add_argument("--draft-steps", type=int, default=2000)
    t.add_argument("--draft-batch", type=int, default=8)
    t.add_argument("--anchors", type=int, default=64, help="anchors per sequence per step")
    t.add_argument("--loss-decay", type=float, default=4.0, help="row j weighted exp(-(j-1)/decay)")
    t.add_argument("--draft-lr", type=float, default=2e-3)
    e = p.add_argument_group("evaluation")
    e.add_argument("--eval-prompts", type=int, default=96)
    e.add_argument("--eval-per-file", type=int, default=12)
    e.add_argument("--eval-prompt-len", type=int, default=64)
    e.add_argument("--eval-new", type=int, default=128)
    e.add_argument("--loop-ngram", type=int, default=16, help="a repeated n-gram marks a looping continuation")
    e.add_argument("--assistant-tokens", type=int, nargs="+", default=[3, 5, 7])
    args = p.parse_args(argv)
    unknown = set(args.stages) - set(STAGES)
    if unknown:
        p.error(f"unknown stage(s) {sorted(unknown)}; choose from {', '.join(STAGES)}")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    if args.check:
        stage_check(args)
        return
    args.work.mkdir(parents=True, exist_ok=True)
    timings_path = args.work / "timings.json"
    timings = read_json(timings_path) if timings_path.exists() else {}
    for stage in args.stages or STAGES:
        log(f"=== {stage}")
        t0 = time.time()
        globals()[f"stage_{stage}"](args)
        timings[stage] = round(time.time() - t0, 1)
        write_json(timings_path, timings)
        log(f"=== {stage} done in {timings[stage]:.0f} s")
    write_json(args.work / "args.json", {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()})


if __name__ == "__main__":
    sys.exit(main())
