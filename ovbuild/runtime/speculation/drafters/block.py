"""BlockDrafter: runs a per-row DFlash-family backbone IR (context rows then block rows per sequence).

DFlash v1 proposes the argmax of each candidate row, or for a sampling request a draw from the row's processed
distribution (its rows are independent: each sees the anchor and mask tokens only); families with a Markov head
override `choose`.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import openvino as ov

from ovbuild.ir import DraftIR, read_ir
from ovbuild.ir.ports import CANDIDATE_INDICES, GREEDY_IDS, INPUT_IDS, LOGITS, POSITION_IDS, TAPS_IN, TOKEN_TYPE_IDS
from ovbuild.runtime.cache.cache_manager import CacheManager
from ovbuild.runtime.cache.kv_cache import SequenceRows
from ovbuild.runtime.model.padding import DRAFT_PADDING
from ovbuild.runtime.model.paged_model import PagedModel
from ovbuild.runtime.speculation.drafters.base import Drafter, DraftItem, Proposal, sampled_proposal


class BlockDrafter(Drafter):
    """A DFlash-family draft: every step, each sequence gets its new context rows and one full block."""

    def __init__(
        self,
        model: ov.Model,
        device: str = "CPU",
        kv_cache_precision: str = "u8",
        inference_precision: str | None = None,
        *,
        cache_mb: float = 256,
        num_blocks: int | None = None,
        static_rows: bool | None = None,
    ):
        self.ir = DraftIR.from_model(model)
        self.block_size, self.mask_token_id = self.ir.block_size, self.ir.mask_token_id
        self.candidate_offset, self.target_layer_ids = self.ir.candidate_offset, self.ir.target_layer_ids
        self.max_candidates = self.block_size - self.candidate_offset
        self.tap_width = model.input(TAPS_IN).get_partial_shape()[1].get_length()
        # a draft call's context rows (each request's accepted rows) change every step: its calls run padded
        self.model = PagedModel(
            model,
            device,
            kv_cache_precision,
            inference_precision,
            cache_mb=cache_mb,
            num_blocks=num_blocks,
            padding=DRAFT_PADDING,
            static_rows=static_rows,
        )
        self.committed: dict[int, int] = {}
        self.infer_s = 0.0

    @classmethod
    def from_folder(cls, folder: str | Path, model: ov.Model | None = None, **options) -> BlockDrafter:
        """Load the draft IR(s) of an exported folder."""
        return cls(read_ir(folder) if model is None else model, **options)

    @property
    def cache_manager(self) -> CacheManager:
        return self.model.cache_manager

    @property
    def compile_s(self) -> float:  # type: ignore[override]
        return self.model.compile_s

    def compile_copies(self) -> None:
        self.model.compile_copies()

    def computed_rows(self, rows: int) -> int:
        return self.model.computed_rows(rows)

    def rows_run(self, rows: int) -> int:
        """A static copy's rows, else the rows the infer request last ran: without copies a call runs padded up to the
        recent calls' row count (DRAFT_PADDING), so its time is that of more rows than it asked for. Kept at the rows
        asked, a Qwen3-4B-sized draft's 13-row calls after 22-row ones cost what 24 rows do, and plans drafting 15 saw
        drafting 7 cost as much in the draft and kept drafting 15."""
        if self.model.static is not None:
            return self.model.computed_rows(rows)
        return max(rows, int(self.model.request.get_tensor(POSITION_IDS).get_shape()[0]))

    def describe(self) -> str:
        return self.model.describe()

    prefix_caching = True  # a context row's keys and values depend on its taps alone, which its prefix fixes

    def resume(self, seq_id: int, length: int) -> None:
        self.committed[seq_id] = length

    def free(self, seq_id: int) -> None:
        self.model.free(seq_id)
        self.committed.pop(seq_id, None)

    def propose(self, items: list[DraftItem]) -> list[Proposal]:
        rows, blocks = [], []
        for item in items:
            # a block only as long as the proposals need (the DFlash authors' loop drafts shorter blocks too): the
            # draft's work shrinks with the draft length the scheduler chose
            block = min(self.block_size, item.num_tokens + self.candidate_offset) if item.anchor is not None else 0
            block = block if item.num_tokens > 0 else 0
            rows.append(SequenceRows(item.seq_id, self.committed.get(item.seq_id, 0), _rows(item.context) + block))
            blocks.append(block)
        inputs, candidate_begins = self._inputs(items, rows, blocks)
        start = time.perf_counter()
        outputs = self.model.run(rows, inputs)
        self.infer_s += time.perf_counter() - start
        for item in items:
            self.committed[item.seq_id] = self.committed.get(item.seq_id, 0) + _rows(item.context)
        return self.choose(items, outputs, candidate_begins)

    def choose(
        self, items: list[DraftItem], outputs: dict[str, np.ndarray], candidate_begins: np.ndarray
    ) -> list[Proposal]:
        """The first `num_tokens` candidate rows of each block: their argmax, or draws for a sampling request."""
        best, logits = outputs[GREEDY_IDS], outputs[LOGITS]  # [R], [R, V]
        proposals = []
        for i, item in enumerate(items):
            rows = slice(candidate_begins[i], candidate_begins[i + 1])
            sampled = item.sampling is not None and item.num_tokens > 0
            if sampled:
                proposals.append(sampled_proposal(item, logits[rows]))
            else:  # the rows' logits ride along (a view, read before the next call) for a constraint to mask
                tokens = best[rows][: item.num_tokens].tolist()
                proposals.append(Proposal(tokens, logits=logits[rows][: item.num_tokens]))
        return proposals

    def _inputs(
        self, items: list[DraftItem], rows: list[SequenceRows], blocks: list[int]
    ) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Packed per-row inputs: [context rows (type 0) ; block rows (type 1)] per sequence."""
        # Lists, one array per input at the end: a step packs a few rows per sequence, where numpy's per-call
        # overhead costs more than the work.
        mask, offset = self.mask_token_id, self.candidate_offset
        ids, token_types, positions, candidates, candidate_begins = [], [], [], [], [0]
        hidden = np.zeros((sum(r.num_rows for r in rows), self.tap_width), np.float32)
        for item, r, block in zip(items, rows, blocks, strict=True):
            n_ctx = r.num_rows - block
            if n_ctx:
                hidden[len(ids) : len(ids) + n_ctx] = item.context
            positions += range(r.past_len, r.past_len + r.num_rows)
            token_types += [0] * n_ctx + [1] * block
            if block:
                ids += [mask] * n_ctx + [item.anchor] + [mask] * (block - 1)
                # the block's rows see each other; only the candidate rows reach the lm_head
                first = len(ids) - block + offset
                candidates += range(first, first + item.num_tokens)
            else:
                ids += [mask] * n_ctx
            candidate_begins.append(len(candidates))
        inputs = {
            INPUT_IDS: np.array(ids, np.int64),
            TOKEN_TYPE_IDS: np.array(token_types, np.int32),
            TAPS_IN: hidden,
            POSITION_IDS: np.array(positions, np.int64),
            CANDIDATE_INDICES: np.array(candidates, np.int64),
        }
        return inputs, np.array(candidate_begins)


def _rows(context: np.ndarray | None) -> int:
    return 0 if context is None else len(context)
