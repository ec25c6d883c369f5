"""MarkovDrafter: a per-row backbone plus the Markov head IR its rt_info names (DFlash v2's selector, DSpark's head).

Per step: one backbone call (the block drafter's), then one head call on the candidate rows of every sequence. The
families differ only in how they turn the head's outputs into proposals (`choose`).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import openvino as ov

from ovbuild.ir import MODEL_FILE, DraftIR, MarkovHeadIR, core, read_ir
from ovbuild.ir.ports import (
    CANDIDATE_BEGINS,
    DRAFT_HIDDEN_STATES,
    HEAD_LOGITS,
    LAST_HIDDEN_STATE,
    LOGITS,
    PREV_TOKEN_IDS,
)
from ovbuild.runtime.speculation.drafters.base import DraftItem
from ovbuild.runtime.speculation.drafters.block import BlockDrafter


class MarkovDrafter(BlockDrafter):
    """A backbone with an optional Markov head IR (`head`; None: the backbone alone)."""

    def __init__(
        self,
        model: ov.Model,
        head: ov.Model | None,
        device: str = "CPU",
        kv_cache_precision: str = "u8",
        inference_precision: str | None = None,
        *,
        cache_mb: float = 256,
        num_blocks: int | None = None,
        static_rows: bool | None = None,
    ):
        super().__init__(
            model,
            device=device,
            kv_cache_precision=kv_cache_precision,
            inference_precision=inference_precision,
            cache_mb=cache_mb,
            num_blocks=num_blocks,
            static_rows=static_rows,
        )
        self.head = self.head_ir = None
        self.head_inputs: set[str] = set()
        self.head_outputs: set[str] = set()
        if head is not None:
            self.head_ir = MarkovHeadIR.from_model(head)
            # f32 unless asked otherwise: the head is tiny, and its argmaxes over near-equal scores must not flip on
            # rounding (the CPU's default inference precision may be bf16).
            config = {"INFERENCE_PRECISION_HINT": inference_precision or "f32"}
            self.head = core().compile_model(head, device, config).create_infer_request()
            self.head_inputs = {i.get_any_name() for i in head.inputs}
            self.head_outputs = {o.get_any_name() for o in head.outputs}

    @classmethod
    def from_folder(cls, folder: str | Path, model: ov.Model | None = None, **options) -> MarkovDrafter:
        """The backbone IR and, when the backbone names one, the Markov head IR of an exported folder."""
        model = read_ir(folder) if model is None else model
        head = DraftIR.from_model(model, Path(folder) / MODEL_FILE).markov_head_file(folder)
        return cls(model, read_ir(head) if head is not None else None, **options)

    def run_head(
        self, items: list[DraftItem], outputs: dict[str, np.ndarray], candidate_begins: np.ndarray
    ) -> dict[str, np.ndarray]:
        """The head's outputs for the candidate rows of the backbone's `outputs` (each sequence starting from its
        anchor), by name."""
        inputs = {
            HEAD_LOGITS: outputs[LOGITS],
            DRAFT_HIDDEN_STATES: outputs[LAST_HIDDEN_STATE],
            PREV_TOKEN_IDS: np.array([item.anchor or 0 for item in items], np.int64),
            CANDIDATE_BEGINS: candidate_begins.astype(np.int32),
        }
        start = time.perf_counter()
        # shared inputs: infer() would otherwise copy the backbone's logits (rows x vocab) into the head's request
        result = self.head.infer({k: v for k, v in inputs.items() if k in self.head_inputs}, share_inputs=True)
        self.infer_s += time.perf_counter() - start
        return {port.get_any_name(): value for port, value in result.items()}
