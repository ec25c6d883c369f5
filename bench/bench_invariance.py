"""Batch invariance at Qwen3-4B width: does one row compute bitwise the same whatever else its call holds?

Greedy speculation is exact only if a verification row computes as the target alone's decode row does. This bench
writes a random target at Qwen3-4B's width (hidden 2560, 32 query / 8 KV heads of 128, MLP 9728; the vocabulary
cut to --vocab, 32768 by default, and --layers layers, 2 by default, to save memory and time; weights drawn by
ovbuild/testing's writer) and a DFlash v1 draft at the same width, builds them in each weight format and math
precision, and computes one probe row (sequence at context C, its next token at position C) in the runtime's own
layouts (ovbuild.runtime.paged_model: decode and verification rows are 1-row subsequences; a 1-row call gets a
padding row):

    alone        the target alone's decode: the probe row in a call of its own (the reference; the context's last 16
                 rows were written by such calls too)
    again        the same call once more (run-to-run determinism)
    raw 1 row    the probe alone without the padding row (what MIN_ROWS avoids)
    verify k     verification rows C-k..C of k+1 rows (k = 7, 15), every row compared with its alone decode
    first of 16  the probe as row 0 of 16 verification rows C..C+15
    beside n     the probe beside n other sequences' decode rows (n = 3, 15)
    4 x verify   4 sequences verifying 16 rows each (64 rows), the probe's 16 rows compared
    beside long  the probe beside a sequence 4x as long (the call's max_context_len is another)
    beside chunk the probe beside a 256-row prompt chunk of another sequence

at contexts --contexts (64 and 2000 tokens). Each cell says `=` (logits and last hidden state bitwise equal to the
alone reference) or the max abs difference of the logits (and of the hidden state); with --bisect, a differing
case runs again in a copy of the model with every layer's ops as extra outputs, and the first op whose probe row
differs is named (the extra outputs may change the plugin's fusions: the line says whether the logits still
differ). Then a prompt of C tokens cut into chunks in several ways (2 calls cut at a block or mid-block, the last 2
rows or the last row in a call of their own, as 1-row subsequences, beside decode rows or a longer sequence) against
the prompt as one chunk alone. The draft: one request's block rows alone against the same request packed with 3
others, two steps.

--cost times what the row rules cost (each A/B interleaved in one process over --rounds rounds, ratio of medians)
at context 2000: a lone prompt row against the 33-row chunk run instead, and a prompt as one chunk against the
same prompt as 1-row subsequences (the rule not taken).

    python bench/bench_invariance.py [--layers 2] [--vocab 32768] [--formats fp16,bf16,int8,int4]
        [--maths f32,bf16] [--contexts 64,2000] [--bisect] [--no-target] [--no-prompts] [--no-draft] [--cost]
        [--rounds 5] [--property NAME=VALUE] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import openvino as ov

from ovbuild.families import load_draft
from ovbuild.graph.dflash import build_dflash_draft
from ovbuild.graph.target import build_target
from ovbuild.graph.weights import WeightPolicy
from ovbuild.ir.ports import LOGITS, TAPS
from ovbuild.runtime.cache.kv_cache import SequenceRows
from ovbuild.runtime.model import machine
from ovbuild.runtime.model.paged_model import PagedModel, bf16_to_f32
from ovbuild.runtime.speculation.drafters import BlockDrafter
from ovbuild.runtime.speculation.drafters.base import DraftItem
from ovbuild.targets import load_target
from ovbuild.testing import write_tiny_dflash, write_tiny_target
from ovbuild.weights.checkpoint import Checkpoint

sys.path.insert(0, str(Path(__file__).parent))
import harness

# Qwen3-4B's width and head layout; the vocabulary and depth are set by the command line.
WIDTH_4B = dict(
    hidden_size=2560, intermediate_size=9728, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
    max_position_embeddings=40960, tie_word_embeddings=True, rope_theta=1000000.0,
)  # fmt: skip
MASK_ID = 5  # the draft's mask token (any id of the vocabulary: weights are random)
BLOCK = 16
LONG = 999  # the sequence id of Probe.long_sequence
CHAIN = 16  # the context's last rows, written by alone decode calls as the target alone writes them
PROBED_OPS = (
    "input_layernorm", "self_attn/qkv_proj", "q/rope", "k/rope", "self_attn/attention", "self_attn/o_proj",
    "attn_residual", "post_attention_layernorm", "mlp/gate_up_proj", "mlp/act", "mlp/down_proj", "output",
)  # fmt: skip


def write_pair(root: Path, layers: int, vocab: int) -> tuple[Path, Path]:
    """The random bf16 target and draft (made once under `root`)."""
    shape = {**WIDTH_4B, "vocab_size": vocab, "num_hidden_layers": layers, "layer_types": ["full_attention"] * layers}
    target, draft = root / f"target-{layers}x{vocab}", root / f"draft-{layers}x{vocab}"
    if not (target / "config.json").exists():
        write_tiny_target(target, dtype="bf16", **shape)
    if not (draft / "config.json").exists():
        dflash = {"mask_token_id": MASK_ID, "target_layer_ids": list(range(layers)), "block_size": BLOCK}
        write_tiny_dflash(
            draft, dtype="bf16", target_hidden_size=2560, **{**shape, "tie_word_embeddings": False},
            num_target_layers=layers, dflash_config=dflash,
        )  # fmt: skip
    return target, draft


def probed(model: ov.Model, math: str) -> ov.Model:
    """A copy of the target with every layer's PROBED_OPS as extra outputs named after the op (in the math
    precision, so that no f32 output keeps bf16 math in f32 behind it)."""
    copy = model.clone()
    ops = {op.get_friendly_name(): op for op in copy.get_ordered_ops()}  # in the order they compute
    names = [n for n in ops if any(n.endswith(p) for p in PROBED_OPS) and n.startswith("layers")]
    for name in names:
        result = ov.opset16.result(ops[name].output(0))
        result.output(0).get_tensor().set_names({name})
        copy.add_results([result])
    if math != "bf16":
        return copy
    post = ov.preprocess.PrePostProcessor(copy)
    for name in names:
        post.output(name).tensor().set_element_type(ov.Type.bf16)
    return post.build()


def as_f32(value: np.ndarray) -> np.ndarray:
    """An output as f32 (bf16 outputs come as 16-bit numbers)."""
    value = np.asarray(value)
    return bf16_to_f32(value) if value.dtype in (np.uint16, np.int16) else value.astype(np.float32)


@dataclass
class Part:
    """One sequence's rows in a call: as 1-row subsequences (decode, verification) or one subsequence (a prompt)."""

    seq: int
    past: int
    ids: list[int]
    chunk: bool = False


@dataclass
class Rows:
    """The outputs of some sequence's rows in one call: logits and the last hidden state, and probed ops."""

    logits: np.ndarray
    hidden: np.ndarray
    ops: dict[str, np.ndarray] = field(default_factory=dict)


def call(model: PagedModel, parts: list[Part], seq: int, raw: bool = False) -> Rows:
    """One call laid out as the runtime lays it out; the outputs of sequence `seq`'s rows. raw: a 1-row call without
    the padding row the runtime adds."""
    rows, ids, positions, wanted, mine = [], [], [], [], []
    for p in parts:
        lengths = [len(p.ids)] if p.chunk else [1] * len(p.ids)
        past = p.past
        for n in lengths:
            rows.append(SequenceRows(p.seq, past, n))
            past += n
        first = len(ids)
        ids += p.ids
        positions += range(p.past, p.past + len(p.ids))
        wanted += [first + len(p.ids) - 1] if p.chunk else range(first, first + len(p.ids))
        if p.seq == seq:
            mine = list(range(first, first + len(p.ids)))
    inputs = {
        "input_ids": np.array(ids, np.int64),
        "position_ids": np.array(positions, np.int64),
        "logits_indices": np.array(wanted, np.int64),
    }
    out = model.infer(rows, inputs, None, model.request, model.binder, 0) if raw else model.run(rows, inputs)
    picked = [wanted.index(i) for i in mine if i in wanted]
    extra = {n: as_f32(v)[mine] for n, v in out.items() if n not in (LOGITS, TAPS, "greedy_ids")}
    return Rows(np.array(out[LOGITS])[picked], as_f32(out[TAPS])[mine], extra)


class Probe:
    """A sequence at context C on one compiled target: its context prefilled, its last CHAIN rows and the probe row
    decoded alone (the references), and forks of it for each case."""

    def __init__(self, model: PagedModel, context: int, seed: int):
        self.model, self.context = model, context
        rng = np.random.default_rng(seed)
        self.tokens = rng.integers(10, model.vocab_size, context + 2 * BLOCK).tolist()
        self.other = rng.integers(10, model.vocab_size, (16, 2 * BLOCK)).tolist()  # other sequences' next tokens
        self.next_id, self.long = 1, 0
        start = context - CHAIN
        call(model, [Part(0, 0, self.tokens[:start], chunk=True)], 0)
        self.alone: dict[int, Rows] = {}  # position -> its row computed alone
        for pos in range(start, context + 1):
            self.alone[pos] = call(model, [Part(0, pos, [self.tokens[pos]])], 0)

    def fork(self, shared: int) -> int:
        """A new sequence whose first `shared` tokens are the probe sequence's (its blocks, the last one copied)."""
        seq, self.next_id = self.next_id, self.next_id + 1
        partial = self.model.cache.allocator.fork(seq, 0, shared, shared)
        if partial is not None:
            self.model.cache.copy_block(*partial)
        return seq

    def long_sequence(self) -> int:
        """A sequence 4x the probe's context (at least 2000 tokens), prefilled once: beside it, the call's
        max_context_len is its bound, not the probe's (kv_cache.context_bound)."""
        if self.long == 0:
            self.long = max(4 * self.context, 2000)
            ids = [self.tokens[i % self.context] for i in range(self.long)]
            for begin in range(0, self.long, 2048):  # chunks as the scheduler cuts prompts
                call(self.model, [Part(LONG, begin, ids[begin : begin + 2048], chunk=True)], LONG)
        return LONG

    def free(self) -> None:
        for seq in range(1, self.next_id):
            self.model.free(seq)
        self.next_id = 1

    def close(self) -> None:
        """Free every sequence of the probe."""
        self.free()
        self.model.free(0)
        self.model.free(LONG)

    def case(self, name: str) -> tuple[Rows, list[int]]:
        """The probe sequence's rows computed as case `name`, and the positions they hold."""
        c, t = self.context, self.tokens
        if name in ("again", "raw 1 row"):
            seq = self.fork(c)
            return call(self.model, [Part(seq, c, [t[c]])], seq, raw=name == "raw 1 row"), [c]
        if name.startswith("verify"):
            k = int(name.split()[-1])
            seq = self.fork(c - k)
            return call(self.model, [Part(seq, c - k, t[c - k : c + 1])], seq), list(range(c - k, c + 1))
        if name == "first of 16":
            seq = self.fork(c)
            got = call(self.model, [Part(seq, c, t[c : c + BLOCK])], seq)
            return Rows(got.logits[:1], got.hidden[:1], {n: v[:1] for n, v in got.ops.items()}), [c]
        if name in ("beside 3", "beside 15"):
            n = int(name.split()[-1])
            seq, others = self.fork(c), [self.fork(c) for _ in range(n)]
            parts = [Part(seq, c, [t[c]])] + [Part(o, c, self.other[i][:1]) for i, o in enumerate(others)]
            return call(self.model, parts, seq), [c]
        if name == "4 x verify 15":
            k = BLOCK - 1
            seqs = [self.fork(c - k) for _ in range(4)]
            parts = [Part(seqs[0], c - k, t[c - k : c + 1])]
            parts += [Part(s, c - k, self.other[i][:BLOCK]) for i, s in enumerate(seqs[1:])]
            return call(self.model, parts, seqs[0]), list(range(c - k, c + 1))
        if name == "beside long":
            seq, long = self.fork(c), self.long_sequence()
            parts = [Part(seq, c, [t[c]]), Part(long, self.long, self.other[0][:1])]
            return call(self.model, parts, seq), [c]
        if name == "beside chunk":
            seq, prompt = self.fork(c), self.next_id
            self.next_id += 1
            chunk = [t[i % c] for i in range(256)]
            return call(self.model, [Part(seq, c, [t[c]]), Part(prompt, 0, chunk, chunk=True)], seq), [c]
        raise ValueError(name)


CASES = (
    "again", "raw 1 row", "verify 7", "verify 15", "first of 16", "beside 3", "beside 15", "4 x verify 15",
    "beside long", "beside chunk",
)  # fmt: skip


def difference(got: Rows, positions: list[int], alone: dict[int, Rows]) -> tuple[float, float] | None:
    """None when every row is bitwise its alone reference; else the max abs difference of logits and hidden."""
    ref = Rows(
        np.concatenate([alone[p].logits for p in positions]), np.concatenate([alone[p].hidden for p in positions])
    )
    return rows_difference(got, ref)


def rows_difference(got: Rows, ref: Rows) -> tuple[float, float] | None:
    """None when `got` is bitwise `ref` (logits and hidden); else the max abs difference of each."""
    if np.array_equal(got.logits, ref.logits) and np.array_equal(got.hidden, ref.hidden):
        return None
    return float(np.abs(got.logits - ref.logits).max()), float(np.abs(got.hidden - ref.hidden).max())


def first_op(got: Rows, positions: list[int], alone: dict[int, Rows]) -> str:
    """The first probed op (in layer and op order) whose rows differ from the alone reference, with its max diff."""
    names = list(alone[positions[0]].ops)  # in the order the outputs were added: layer by layer, op by op
    for name in names:
        ref = np.concatenate([alone[p].ops[name] for p in positions])
        if not np.array_equal(got.ops[name], ref):
            return f"{name} ({np.abs(got.ops[name] - ref).max():.2g})"
    return "none of the probed ops"


def cell(diff: tuple[float, float] | None) -> str:
    return "=" if diff is None else f"{diff[0]:.1e}/{diff[1]:.1e}"


def compile_target(model: ov.Model, math: str, properties: dict | None = None) -> PagedModel:
    """The target as the runtime compiles it at Qwen3-4B size: dynamic shapes (no static copies), f16 cache."""
    return PagedModel(model, "CPU", "f16", math, cache_mb=256, static_rows=False, properties=properties)


def compiled_targets(args, target_dir: Path) -> Iterator[tuple[str, str, ov.Model, PagedModel]]:
    """The target built in each weight format and compiled at each math precision of the run: (format, math, its
    IR, the compiled model)."""
    cfg, weights = load_target(Checkpoint.open(target_dir))
    for fmt in args.formats:
        ir = build_target(cfg, weights, (args.layers - 1,), WeightPolicy(weight_format=fmt))
        for math in args.maths:
            yield fmt, math, ir, compile_target(ir, math, args.properties)


def target_table(args, target_dir: Path) -> None:
    """The invariance table of the target: one line per weight format, math and context."""
    print(f"\ntarget: {args.layers} layers at Qwen3-4B width, vocabulary {args.vocab}, f16 KV cache; cells: '=' "
          "bitwise equal to alone, else max |diff| logits/last hidden state")  # fmt: skip
    print("| weights | math | context | " + " | ".join(CASES) + " |")
    print("|---|---|---|" + "---|" * len(CASES))
    for fmt, math, ir, model in compiled_targets(args, target_dir):
        for context in args.contexts:
            probe = Probe(model, context, seed=context)
            cells, differing = [], []
            for name in CASES:
                got, positions = probe.case(name)
                diff = difference(got, positions, probe.alone)
                cells.append(cell(diff))
                if diff is not None:
                    differing.append(name)
            probe.close()
            print(f"| {fmt} | {math} | {context} | " + " | ".join(cells) + " |", flush=True)
            if args.bisect and differing:
                bisect(ir, math, context, differing, args.properties)
        del model
        gc.collect()


PROMPT_CASES = (
    "2 calls at a block", "2 calls mid-block", "last 2 rows", "last row alone", "1-row subsequences",
    "beside 3 decode rows", "beside long",
)  # fmt: skip


def prompt_case(model: PagedModel, ids: list[int], name: str, seq: int) -> Rows:
    """A prompt of len(ids) tokens prefilled as case `name` on sequence `seq`: the last row's logits, every row's
    last hidden state (the reference is one chunk in a call of its own)."""
    n = len(ids)
    cuts = {
        "2 calls at a block": n // 64 * 32,
        "2 calls mid-block": n // 2 + 5,
        "last 2 rows": n - 2,
        "last row alone": n - 1,
    }
    split = cuts.get(name)
    if name == "1-row subsequences":  # every row as verification rows run (a call of at most 64 rows)
        outputs = [call(model, [Part(seq, b, ids[b : b + 64])], seq) for b in range(0, n, 64)]
        ops = {k: np.concatenate([o.ops[k] for o in outputs]) for k in outputs[0].ops}
        return Rows(outputs[-1].logits[-1:], np.concatenate([o.hidden for o in outputs]), ops)
    if split is None:
        others = {"": [], "beside 3 decode rows": [(seq + 1 + i, 1) for i in range(3)], "beside long": [(LONG, 1)]}
        parts = [Part(seq, 0, ids, chunk=True)] + [Part(o, past, [7]) for o, past in others[name]]
        return call(model, parts, seq)
    first = call(model, [Part(seq, 0, ids[:split], chunk=True)], seq)
    last = call(model, [Part(seq, split, ids[split:], chunk=True)], seq)
    ops = {k: np.concatenate([first.ops[k], last.ops[k]]) for k in first.ops}
    return Rows(last.logits, np.concatenate([first.hidden, last.hidden]), ops)


def prompt_table(args, target_dir: Path) -> None:
    """Whether a prompt's rows compute bitwise alike however the prompt is cut into chunks and whatever shares its
    calls (the scheduler sizes a chunk by the rows its call has left: verification rows take more than decode rows)."""
    print("\nprompt rows (one subsequence per chunk) against the prompt as one chunk in a call of its own; cells: "
          "max |diff| of the last row's logits / every row's last hidden state")  # fmt: skip
    print("| weights | math | prompt | " + " | ".join(PROMPT_CASES) + " |")
    print("|---|---|---|" + "---|" * len(PROMPT_CASES))
    for fmt, math, ir, model in compiled_targets(args, target_dir):
        for context in args.contexts:
            probe = Probe(model, context, seed=context)
            probe.long_sequence()
            ids = probe.tokens[:context]
            alone = prompt_case(model, ids, "", 100)
            model.free(100)
            cells, differing = [], []
            for i, name in enumerate(PROMPT_CASES):
                got = prompt_case(model, ids, name, 200 + 10 * i)
                for seq in range(200 + 10 * i, 204 + 10 * i):
                    model.free(seq)
                diff = rows_difference(got, alone)
                cells.append(cell(diff))
                if diff is not None:
                    differing.append(name)
            probe.close()
            print(f"| {fmt} | {math} | {context} | " + " | ".join(cells) + " |", flush=True)
            if args.bisect and differing:
                bisect_prompt(ir, math, ids, differing, args.properties)
        del model
        gc.collect()


def bisect_prompt(ir: ov.Model, math: str, ids: list[int], names: list[str], properties: dict | None) -> None:
    """Each differing prompt case again on the target with its ops as outputs: the first op that differs."""
    model = compile_target(probed(ir, math), math, properties)
    alone = prompt_case(model, ids, "", 100)
    for i, name in enumerate(names):
        got = prompt_case(model, ids, name, 200 + 10 * i)
        positions = list(range(len(ids)))
        still = "logits still differ" if not np.array_equal(got.logits, alone.logits) else "logits equal, ops probed"
        rows = {p: Rows(alone.logits, alone.hidden[p : p + 1], {k: v[p : p + 1] for k, v in alone.ops.items()})
                for p in positions}  # fmt: skip
        print(f"    {name}: first differs at {first_op(got, positions, rows)}; {still}", flush=True)
    del model
    gc.collect()


def bisect(ir: ov.Model, math: str, context: int, names: list[str], properties: dict | None) -> None:
    """Each differing case again on the target with its ops as outputs: the first op that differs."""
    model = compile_target(probed(ir, math), math, properties)
    probe = Probe(model, context, seed=context)
    for name in names:
        got, positions = probe.case(name)
        still = "logits still differ" if difference(got, positions, probe.alone) else "logits equal with ops probed"
        print(f"    {name}: first differs at {first_op(got, positions, probe.alone)}; {still}", flush=True)
    probe.close()


def draft_table(args, target_dir: Path, draft_dir: Path) -> None:
    """The draft's candidate logits for one request alone against the same request packed with 3 others."""
    _, tweights = load_target(Checkpoint.open(target_dir))
    dcfg, dweights = load_draft(Checkpoint.open(draft_dir))
    tap_width = 2560 * len(dcfg.target_layer_ids)
    rng = np.random.default_rng(7)
    contexts = [rng.standard_normal((n, tap_width)).astype(np.float32) for n in (64, 4)]
    others = [[rng.standard_normal((n, tap_width)).astype(np.float32) for n in (64, 4)] for _ in range(3)]
    print(f"\ndraft: DFlash v1, {args.layers} layers at Qwen3-4B width, u8 KV cache; block {BLOCK}, 15 candidates; "
          "step 1: 64 context rows + block, step 2: 4 more + block")  # fmt: skip
    print("| weights | math | step 1 packed with 3 | step 2 packed with 3 |")
    print("|---|---|---|---|")
    for fmt in args.formats:
        ir = build_dflash_draft(dcfg, dweights, tweights, WeightPolicy(weight_format=fmt))
        for math in args.maths:
            drafter = BlockDrafter(ir, "CPU", "u8", math, cache_mb=256, static_rows=False)
            seen = capture_logits(drafter.model)
            cells = []
            for step in range(2):
                drafter.propose([DraftItem(0, contexts[step], 7, BLOCK - 1)])
                alone = seen[-1]
                items = [DraftItem(10 + i, others[i][step], 8 + i, BLOCK - 1) for i in range(3)]
                drafter.propose([DraftItem(1, contexts[step], 7, BLOCK - 1), *items])
                packed = seen[-1][: BLOCK - 1]
                equal = np.array_equal(packed, alone)
                cells.append("=" if equal else f"{np.abs(packed - alone).max():.1e}")
            print(f"| {fmt} | {math} | " + " | ".join(cells) + " |", flush=True)
            del drafter
            gc.collect()


def capture_logits(model: PagedModel) -> list[np.ndarray]:
    """Every call's logits from now on, copied into the list returned (the caller reads the last one)."""
    seen: list[np.ndarray] = []
    run = model.run

    def run_and_keep(rows, inputs, *args):
        outputs = run(rows, inputs, *args)
        seen.append(np.array(outputs[LOGITS]))
        return outputs

    model.run = run_and_keep
    return seen


def cost(args, target_dir: Path) -> None:
    """What the row rules cost, A/B interleaved in rounds at context 2000: the lone prompt row a prefix hit or a
    budget would leave against the 33-row chunk ovbuild runs instead (a prefix hit one block shorter), and a
    2000-token prompt as one chunk against 2000 1-row subsequences (every row in the decode kernel: the other way
    to keep one kernel per row, not taken)."""
    print(f"\ncost at context 2000 (median of {args.rounds} interleaved rounds; ratio to the first of each pair, "
          "median and range):")  # fmt: skip
    for fmt, math, _ir, model in compiled_targets(args, target_dir):
        probe = Probe(model, 2000, seed=1)
        c, t = probe.context, probe.tokens

        def rows_after(past: int, chunk: bool, probe=probe, model=model, t=t, c=c) -> None:
            seq = probe.fork(past)
            call(model, [Part(seq, past, t[past : c + 1], chunk=chunk)], seq)
            probe.free()

        def prompt(chunk: bool, model=model, t=t, c=c) -> None:
            if chunk:
                call(model, [Part(500, 0, t[:c], chunk=True)], 500)
            # 1-row subsequences 64 a call, as 4 requests' verification rows come
            for begin in range(0, 0 if chunk else c, 64):
                call(model, [Part(500, begin, t[begin : min(begin + 64, c)])], 500)
            model.free(500)

        cases = {
            "lone prompt row": lambda c=c: rows_after(c, True),
            "33-row chunk": lambda c=c: rows_after(c - 32, True),
            "prompt as a chunk": lambda: prompt(True),
            "prompt as 1-row subsequences": lambda: prompt(False),
        }
        rounds = harness.interleave(cases, args.rounds, args.seed)
        for name, base in (
            ("33-row chunk", "lone prompt row"),
            ("prompt as 1-row subsequences", "prompt as a chunk"),
        ):
            print(f"  {fmt} weights, {math} math: {name} {rounds.median(name) * 1e3:.0f} ms, {base} "
                  f"{rounds.median(base) * 1e3:.0f} ms: {rounds.ratio(name, base)}", flush=True)  # fmt: skip
        probe.close()
        del model, probe
        gc.collect()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--formats", default="fp16,bf16,int8,int4")
    parser.add_argument("--maths", default="f32,bf16")
    parser.add_argument("--contexts", default="64,2000")
    parser.add_argument("--bisect", action="store_true", help="name the first op where a differing case differs")
    parser.add_argument("--no-draft", action="store_true")
    parser.add_argument("--no-target", action="store_true")
    parser.add_argument("--no-prompts", action="store_true")
    parser.add_argument("--cost", action="store_true", help="time the invariance choices")
    parser.add_argument("--property", action="append", default=[], help="NAME=VALUE plugin property for every model")
    parser.add_argument("--workdir", default=str(Path(tempfile.gettempdir()) / "ovbuild_bench_invariance"))
    harness.add_arguments(parser, rounds=5)
    args = parser.parse_args()
    args.formats, args.maths = args.formats.split(","), args.maths.split(",")
    args.contexts = [int(c) for c in args.contexts.split(",")]
    args.properties = dict(p.split("=", 1) for p in args.property) or None
    harness.start("Batch invariance of one row at Qwen3-4B width (bench/bench_invariance.py)")
    print(f"CPU: {machine.describe()}; plugin properties asked: {args.properties or 'none'}")
    start = time.perf_counter()
    target_dir, draft_dir = write_pair(Path(args.workdir), args.layers, args.vocab)
    print(f"checkpoints in {args.workdir} ({time.perf_counter() - start:.0f} s)", flush=True)
    if not args.no_target:
        target_table(args, target_dir)
    if not args.no_prompts:
        prompt_table(args, target_dir)
    if not args.no_draft:
        draft_table(args, target_dir, draft_dir)
    if args.cost:
        cost(args, target_dir)


if __name__ == "__main__":
    main()
