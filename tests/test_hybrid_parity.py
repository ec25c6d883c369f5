"""The compiled hybrid target IR (f32, f32 KV cache) against the numpy reference over packed multi-sequence calls:
chunked prefill, decode, verification calls whose tails are rejected (states restored from the state_rows outputs,
keys rolled back by past_lens) and then overwritten, a sequence joining late."""

from __future__ import annotations

import numpy as np
import pytest

from ovbuild.graph.hybrid_target import build_hybrid_target
from ovbuild.ir import read_ir, save_ir
from ovbuild.reference.hybrid import HybridReference
from ovbuild.runtime.cache.kv_cache import SequenceRows
from ovbuild.runtime.model.paged_model import PagedModel
from ovbuild.targets import load_target
from ovbuild.testing import F32_NMSE, nmse
from ovbuild.testing.tiny_hybrid import write_tiny_hybrid_target
from ovbuild.weights.checkpoint import Checkpoint

from paged_helpers import RESERVED_TOKENS

TAPS = (0, 2, 3)
RNG = np.random.default_rng(11)


def tokens(n: int) -> list[int]:
    return RNG.integers(0, 256, n).tolist()


# (seq, tokens, rows kept): prefill of 3 sequences in chunks -> decode -> verification of 5 rows keeping 2, of 4
# keeping 4, of 6 keeping 1 -> the rejected positions overwritten by decode and a second verification -> a 4th
# sequence joins while another verifies and keeps nothing.
SCHEDULE = [
    [(0, tokens(5), 5), (1, tokens(37), 37), (2, tokens(12), 12)],
    [(0, tokens(9), 9), (1, tokens(1), 1), (2, tokens(20), 20)],
    [(0, tokens(5), 2), (1, tokens(4), 4), (2, tokens(6), 1)],
    [(2, tokens(1), 1), (0, tokens(1), 1), (1, tokens(5), 3)],
    [(3, tokens(7), 7), (1, tokens(1), 1), (0, tokens(6), 0), (2, tokens(4), 4)],
    [(0, tokens(3), 3), (3, tokens(2), 2), (1, tokens(1), 1)],
]


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    return load_target(Checkpoint.open(write_tiny_hybrid_target(tmp_path_factory.mktemp("hy") / "t")))


class Outputs:
    """Everything the IR and the reference produced, per name, in one order, for NMSE."""

    def __init__(self):
        self.ir: dict[str, list[np.ndarray]] = {}
        self.ref: dict[str, list[np.ndarray]] = {}

    def add(self, name: str, ir: np.ndarray, ref: np.ndarray) -> None:
        self.ir.setdefault(name, []).append(np.asarray(ir, np.float64).ravel())
        self.ref.setdefault(name, []).append(np.asarray(ref, np.float64).ravel())

    def nmse(self, name: str) -> float:
        return nmse(np.concatenate(self.ir[name]), np.concatenate(self.ref[name]))


def run_hybrid(model: PagedModel, ref: HybridReference, schedule) -> Outputs:
    """Drive the IR and the reference side by side; the IR's states live here, keyed by sequence, as a runtime's
    state pool would keep them: after each call a sequence keeps the state of its last kept row."""
    cfg = ref.cfg
    out, committed, caches = Outputs(), {}, {}
    conv_shape = (cfg.conv_dim, cfg.linear_conv_kernel_dim - 1)
    rec_shape = (cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim)
    states = {}
    for call in schedule:
        rows, ids, pos, begin = [], [], [], 0
        for seq, toks, _ in call:
            past = committed.get(seq, 0)
            model.cache.allocator.reserve(seq, RESERVED_TOKENS)
            rows.append(SequenceRows(seq, past, len(toks)))
            ids += toks
            pos += range(past, past + len(toks))
        inputs = {
            "input_ids": np.array(ids, np.int64),
            "position_ids": np.array(pos, np.int64),
            "logits_indices": np.arange(len(ids), dtype=np.int64),
            "state_rows": np.arange(len(ids), dtype=np.int64),  # every row's states, to check them all
        }
        for i in cfg.linear_layers:
            zero = (np.zeros(conv_shape, np.float32), np.zeros(rec_shape, np.float32))
            held = [states.get(seq, {}).get(i, zero) for seq, _, _ in call]
            inputs[f"conv_state.{i}"] = np.stack([c for c, _ in held])
            inputs[f"recurrent_state.{i}"] = np.stack([r for _, r in held])
        result = {k: v.copy() for k, v in model.run(rows, inputs).items()}
        for seq, toks, keep in call:
            end = begin + len(toks)
            cache = caches.setdefault(seq, ref.new_cache())
            saved = cache.snapshot()
            logits, taps = ref.forward(cache, np.array(toks), TAPS, record_rows=True)
            out.add("logits", result["logits"][begin:end], logits)
            out.add("hidden_states", result["hidden_states"][begin:end], taps)
            assert np.array_equal(result["greedy_ids"][begin:end], result["logits"][begin:end].argmax(-1))
            for i in cfg.linear_layers:
                for r, row in enumerate(cache.row_states):
                    if ref.chunk and r < len(toks) - 1:
                        continue  # the chunked form knows the state at the end of the call only
                    out.add("conv_state", result[f"conv_state_out.{i}"][begin + r], row[i][0])
                    out.add("recurrent_state", result[f"recurrent_state_out.{i}"][begin + r], row[i][1])
            if keep:
                states[seq] = {
                    i: (
                        result[f"conv_state_out.{i}"][begin + keep - 1],
                        result[f"recurrent_state_out.{i}"][begin + keep - 1],
                    )
                    for i in cfg.linear_layers
                }
            if keep < len(toks):  # the rejected tail: back to the state before the call, then the kept rows again
                cache.restore(saved)
                ref.forward(cache, np.array(toks[:keep], np.int64))
            committed[seq] = committed.get(seq, 0) + keep
            begin = end
    return out


def test_hybrid_target_matches_reference(hybrid):
    cfg, weights = hybrid
    model = PagedModel(build_hybrid_target(cfg, weights, TAPS), kv_cache_precision="f32")
    out = run_hybrid(model, HybridReference(cfg, weights), SCHEDULE)
    figures = {name: out.nmse(name) for name in ("logits", "hidden_states", "conv_state", "recurrent_state")}
    print("hybrid target vs reference NMSE: " + ", ".join(f"{k} {v:.1e}" for k, v in figures.items()))
    for name, value in figures.items():
        assert value < F32_NMSE, f"{name} NMSE {value:.2e}"


def test_hybrid_target_matches_chunked_reference_and_reads_back_from_disk(hybrid, tmp_path):
    """The IR read from disk against the reference running the chunked form of the delta rule."""
    cfg, weights = hybrid
    path = save_ir(build_hybrid_target(cfg, weights, TAPS), tmp_path / "openvino_model.xml")
    model = PagedModel(read_ir(path), kv_cache_precision="f32")
    out = run_hybrid(model, HybridReference(cfg, weights, chunk=4), SCHEDULE)
    figures = {name: out.nmse(name) for name in ("logits", "hidden_states", "conv_state", "recurrent_state")}
    print("from disk vs chunked reference NMSE: " + ", ".join(f"{k} {v:.1e}" for k, v in figures.items()))
    for name, value in figures.items():
        assert value < F32_NMSE, f"{name} NMSE {value:.2e}"


def test_sequences_are_isolated(hybrid):
    """Changing one sequence's tokens changes only its own outputs, whatever else is packed with it."""
    cfg, weights = hybrid
    changed = [[(s, list(reversed(t)) if s == 1 else t, k) for s, t, k in call] for call in SCHEDULE]
    outputs = []
    for schedule in (SCHEDULE, changed):
        model = PagedModel(build_hybrid_target(cfg, weights, TAPS), kv_cache_precision="f32")
        outputs.append(run_hybrid(model, HybridReference(cfg, weights), schedule))
    base, other = outputs
    assert base.nmse("logits") < F32_NMSE and other.nmse("logits") < F32_NMSE
    sizes = [len(t) for call in SCHEDULE for _, t, _ in call]
    seqs = [s for call in SCHEDULE for s, _, _ in call]
    for seq, a, b, n in zip(seqs, base.ir["logits"], other.ir["logits"], sizes, strict=True):
        assert a.size == n * cfg.vocab_size
        assert np.array_equal(a, b) == (seq != 1), f"sequence {seq}"
