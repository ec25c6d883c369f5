"""LatticeDrafter: a backbone plus a Markov head IR that scores a packed Top-K lattice (DFlash v2's selector).

Per step: one backbone call (the block drafter's), one head call on the candidate rows of every sequence, then the
greedy walk over the lattice from each sequence's anchor.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import openvino as ov

from ovbuild.contract import MODEL_FILE, DraftIR
from ovbuild.errors import ExportError
from ovbuild.graph.ir import core, read_ir
from ovbuild.runtime.drafters.base import DraftItem
from ovbuild.runtime.drafters.block import BlockDrafter
from ovbuild.runtime.lattice import greedy_walk


class LatticeDrafter(BlockDrafter):
    """Proposals from the lattice walk instead of the per-row argmax."""

    def __init__(self, model: ov.Model, head: ov.Model, device: str = "CPU", **options):
        super().__init__(model, device, **options)
        # The selector compares scores of near-equal candidates: it runs in f32 (GenAI requires f32 inputs too).
        self.head = core().compile_model(head, device, {"INFERENCE_PRECISION_HINT": "f32"}).create_infer_request()

    @classmethod
    def from_folder(cls, folder: str | Path, model: ov.Model | None = None, **options) -> LatticeDrafter:
        model = read_ir(folder) if model is None else model
        head = DraftIR.from_model(model, Path(folder) / MODEL_FILE).markov_head_file(folder)
        if head is None:
            raise ExportError(f"{Path(folder) / MODEL_FILE}: this DFlash v2 draft names no Markov head IR")
        return cls(model, read_ir(head), **options)

    def choose(
        self, items: list[DraftItem], outputs: dict[str, np.ndarray], candidate_begins: np.ndarray
    ) -> list[list[int]]:
        if candidate_begins[-1] == 0:
            return [[] for _ in items]
        start = time.perf_counter()
        self.head.infer(
            {
                "logits": outputs["logits"],
                "draft_hidden_states": outputs["last_hidden_state"],
                "prev_token_ids": np.array([item.anchor or 0 for item in items], np.int64),
                "candidate_begins": candidate_begins.astype(np.int32),
            }
        )
        self.infer_s += time.perf_counter() - start
        paths = greedy_walk(
            self.head.get_tensor("candidate_ids").data, self.head.get_tensor("edge_scores").data, candidate_begins
        )
        return [path[: item.num_tokens].tolist() for path, item in zip(paths, items, strict=True)]
