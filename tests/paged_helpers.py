"""Drive a compiled paged IR and its numpy reference side by side over a schedule of packed calls."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ovbuild.runtime.cache.kv_cache import MIN_CONTEXT_BOUND, SequenceRows
from ovbuild.runtime.model.paged_model import PagedModel
from ovbuild.testing import nmse

# Each sequence reserves blocks for this many tokens when it first appears, as the scheduler reserves a request's
# worst case on admission: the tables hold reserved blocks the calls never reach, and sequences' blocks interleave.
RESERVED_TOKENS = 200


@dataclass
class Outputs:
    """Per-call, per-sequence outputs of the IR and of the reference, for NMSE and isolation checks."""

    ir: list[dict[int, dict[str, np.ndarray]]] = field(default_factory=list)
    ref: list[dict[int, dict[str, np.ndarray]]] = field(default_factory=list)

    def nmse(self, name: str) -> float:
        a = np.concatenate([c[s][name].ravel() for c in self.ir for s in sorted(c)])
        b = np.concatenate([c[s][name].ravel() for c in self.ref for s in sorted(c)])
        return nmse(a, b)


def run_target(model: PagedModel, ref, taps: tuple[int, ...], schedule, row_subsequences: bool = False) -> Outputs:
    """schedule: calls of [(seq, token_ids, n_commit)]; rows beyond n_commit are rolled back afterwards.
    row_subsequences: every row a 1-row subsequence of its own (as the scheduler runs verification rows on CPU)."""
    out, committed, caches = Outputs(), {}, {}
    for call in schedule:
        rows, ids, pos = [], [], []
        for seq, toks, _ in call:
            past = committed.get(seq, 0)
            if row_subsequences:
                rows += [SequenceRows(seq, past + i, 1) for i in range(len(toks))]
            else:
                rows.append(SequenceRows(seq, past, len(toks)))
            ids += list(toks)
            pos += range(past, past + len(toks))
        n = len(ids)
        check_layout(model, rows)
        result = model.run(
            rows,
            {
                "input_ids": np.array(ids, np.int64),
                "position_ids": np.array(pos, np.int64),
                "logits_indices": np.arange(n, dtype=np.int64),
            },
        )
        ir_call, ref_call, begin = {}, {}, 0
        for seq, toks, commit in call:
            end = begin + len(toks)
            ir_call[seq] = {k: v[begin:end].copy() for k, v in result.items()}
            cache = caches.setdefault(seq, ref.new_cache())
            logits, hidden = ref.forward(cache, np.array(toks), taps)
            ref_call[seq] = {"logits": logits, "hidden_states": hidden}
            committed[seq] = committed.get(seq, 0) + commit
            cache.truncate(committed[seq])
            begin = end
        out.ir.append(ir_call)
        out.ref.append(ref_call)
    return out


def run_draft(model: PagedModel, ref, schedule, seed: int = 0) -> Outputs:
    """schedule: calls of [(seq, n_context_rows, block_ids)]; context rows are random taps, committed; blocks not."""
    cfg = ref.cfg
    rng = np.random.default_rng(seed)
    out, committed, caches = Outputs(), {}, {}
    width = cfg.num_taps * cfg.target_hidden_size
    for call in schedule:
        rows, ids, pos, tt, hidden, cand = [], [], [], [], [], []
        taps_of, start = {}, 0
        for seq, n_ctx, block in call:
            past = committed.get(seq, 0)
            taps_of[seq] = rng.standard_normal((n_ctx, width)).astype(np.float32)
            n = n_ctx + len(block)
            rows.append(SequenceRows(seq, past, n))
            ids += [cfg.mask_token_id] * n_ctx + list(block)
            pos += range(past, past + n)
            tt += [0] * n_ctx + [1] * len(block)
            hidden += [taps_of[seq], np.zeros((len(block), width), np.float32)]
            cand += range(start + n_ctx + cfg.candidate_offset, start + n)
            start += n
        check_layout(model, rows)
        result = model.run(
            rows,
            {
                "input_ids": np.array(ids, np.int64),
                "position_ids": np.array(pos, np.int64),
                "token_type_ids": np.array(tt, np.int32),
                "hidden_states": np.concatenate(hidden),
                "candidate_indices": np.array(cand, np.int64),
            },
        )
        ir_call, ref_call, begin = {}, {}, 0
        for seq, n_ctx, block in call:
            end = begin + max(len(block) - cfg.candidate_offset, 0)
            ir_call[seq] = {k: v[begin:end].copy() for k, v in result.items()}
            cache = caches.setdefault(seq, ref.new_cache())
            logits, h = ref.forward(cache, taps_of[seq].astype(np.float64), np.array(block, np.int64))
            ref_call[seq] = {"logits": logits, "last_hidden_state": h}
            committed[seq] = committed.get(seq, 0) + n_ctx
            begin = end
        out.ir.append(ir_call)
        out.ref.append(ref_call)
    return out


def check_layout(model: PagedModel, rows: list[SequenceRows]) -> None:
    """Reserve each new sequence's worst case, then check the call's paged inputs against the block tables: only the
    blocks holding the call's tokens are listed, per sequence in table order (a bad layout fails here, not in the
    plugin)."""
    allocator = model.cache.allocator
    for r in rows:
        if r.seq_id not in allocator.tables:
            allocator.reserve(r.seq_id, RESERVED_TOKENS)
    layout = {name: np.asarray(value) for name, value in model.cache.layout(rows).items()}
    size = allocator.block_size
    blocks = [allocator.tables[r.seq_id][: -(-(r.past_len + r.num_rows) // size)] for r in rows]
    begins = layout["block_indices_begins"]
    assert len(begins) == len(rows) + 1 and begins[0] == 0 and begins[-1] == len(layout["block_indices"]), (
        f"block_indices_begins {begins.tolist()} do not frame {len(layout['block_indices'])} block indices"
    )
    for i, (r, used) in enumerate(zip(rows, blocks, strict=True)):
        listed = layout["block_indices"][begins[i] : begins[i + 1]].tolist()
        assert listed == used, f"sequence {r.seq_id}: blocks {listed}, expected the used blocks {used}"
    assert layout["past_lens"].tolist() == [r.past_len for r in rows], f"past_lens {layout['past_lens']}"
    begins = np.cumsum([0] + [r.num_rows for r in rows]).tolist()
    assert layout["subsequence_begins"].tolist() == begins, f"subsequence_begins {layout['subsequence_begins']}"
    longest = max(r.past_len + r.num_rows for r in rows)
    bound = int(layout["max_context_len"])
    assert longest <= bound <= max(2 * longest, MIN_CONTEXT_BOUND), (
        f"max_context_len {bound} for a longest sequence of {longest}"
    )
