"""Run the `ovbuild` CLI in-process and check what it leaves on disk."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ovbuild.cli import main
from ovbuild.testing.tokenizer import MASK_ID

# (seq, context rows, block): two sequences packed, then one continuing with fresh context.
DRAFT_SCHEDULE = [
    [(0, 5, [11] + [MASK_ID] * 7), (1, 9, [12] + [MASK_ID] * 7)],
    [(0, 3, [14] + [MASK_ID] * 7), (1, 1, [15, MASK_ID, MASK_ID])],
]
RNG = np.random.default_rng(3)
# (seq, tokens, committed): prefill of two sequences, then verification rows of which some are rolled back.
TARGET_SCHEDULE = [
    [(0, RNG.integers(0, 256, 7).tolist(), 7), (1, RNG.integers(0, 256, 35).tolist(), 35)],
    [(0, RNG.integers(0, 256, 4).tolist(), 2), (1, RNG.integers(0, 256, 1).tolist(), 1)],
]


@dataclass
class Run:
    code: int
    out: str
    err: str


def ovbuild(capsys, *argv) -> Run:
    """`ovbuild ARGV` in this process; stdout and stderr as captured."""
    capsys.readouterr()
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return Run(code, captured.out, captured.err)


def snapshot(folder: Path) -> set[str]:
    """Every path under `folder` (hidden ones included), relative."""
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


def assert_clean_error(run: Run, message: str) -> None:
    """Exit code 2 and exactly one stderr line `ovbuild: error: ...` containing `message`."""
    lines = run.err.strip().splitlines()
    assert run.code == 2, f"exit code {run.code}, stderr {run.err!r}"
    assert len(lines) == 1 and lines[0].startswith("ovbuild: error: "), f"stderr is not one error line: {run.err!r}"
    assert message in lines[0], f"{message!r} not in {lines[0]!r}"
