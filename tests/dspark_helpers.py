"""Shared pieces of the DSpark tests: tiny checkpoints of every kind, packed schedules, and head inputs."""

from __future__ import annotations

import numpy as np

from ovbuild.families import load_draft
from ovbuild.testing import write_tiny_dspark
from ovbuild.testing.tokenizer import MASK_ID
from ovbuild.weights.checkpoint import Checkpoint

BLOCK = 7


def block(anchor: int, rows: int = BLOCK) -> list[int]:
    return [anchor] + [MASK_ID] * (rows - 1)


# (seq, context rows, block): full blocks of 7 rows (candidate offset 0: 7 candidates each), a context-only step,
# a 2-row block, a sequence joining late, one crossing a 32-token cache block.
SCHEDULE = [
    [(0, 5, block(11)), (1, 37, block(12)), (2, 12, block(13))],
    [(0, 3, block(14)), (1, 1, block(15)), (2, 0, block(16))],
    [(2, 8, block(17)), (0, 2, []), (1, 30, block(18, 2))],
    [(1, 4, block(19)), (0, 1, block(20)), (3, 6, block(21))],
]


SEEDS = {"vanilla": 3, "gated": 4, "deepspec_dflash": 5}  # a backbone of its own for every kind


def load_kind(folder, kind: str, dtype: str = "f32", **options):
    """(DSparkConfig, WeightSource) of a freshly written tiny draft."""
    path = write_tiny_dspark(folder / f"{kind}_{dtype}", kind, seed=SEEDS[kind], dtype=dtype, **options)
    return load_draft(Checkpoint.open(path))


def pack_blocks(call: dict[int, dict[str, np.ndarray]], anchors: dict[int, int]) -> dict[str, np.ndarray]:
    """Head inputs from one call's per-sequence candidate rows, sequences in id order (rowless ones included)."""
    seqs = sorted(call)
    counts = [len(call[s]["logits"]) for s in seqs]
    return {
        "logits": np.concatenate([call[s]["logits"] for s in seqs]).astype(np.float32),
        "draft_hidden_states": np.concatenate([call[s]["last_hidden_state"] for s in seqs]).astype(np.float32),
        "prev_token_ids": np.array([anchors.get(s, 0) for s in seqs], np.int64),
        "candidate_begins": np.concatenate([[0], np.cumsum(counts)]).astype(np.int32),
    }


def run_head(compiled, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Infer a compiled head on the inputs it declares; outputs by name."""
    names = {p.get_any_name() for p in compiled.inputs}
    result = compiled({k: v for k, v in inputs.items() if k in names})
    return {port.get_any_name(): value for port, value in result.items()}
