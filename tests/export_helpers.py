"""Run the `ovbuild` CLI in-process or in a child process, and check what it leaves on disk."""

from __future__ import annotations

import os
import subprocess
import sys
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


# Runs `ovbuild ARGV` with one function wrapped so that its N-th call first prints "paused" and waits for the file
# GO (or a signal): the test then knows where the child is. SIGINT gets Python's usual handler, as on a terminal
# (a non-interactive shell starts background jobs with SIGINT ignored, and pytest may run under one).
PAUSED_CHILD = """
import importlib, os, signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
where, nth, go, fallback, *argv = sys.argv[1:]
if fallback == "1":
    import ovbuild.export.renames as renames
    renames._renameat2 = None
module, _, name = where.partition(":")
owner = importlib.import_module(module)
*parents, attr = name.split(".")
for parent in parents:
    owner = getattr(owner, parent)
original, calls = getattr(owner, attr), [0]
def paused(*args, **kwargs):
    calls[0] += 1
    if calls[0] == int(nth):
        print("paused", flush=True)
        while not os.path.exists(go):
            time.sleep(0.01)
    return original(*args, **kwargs)
setattr(owner, attr, paused)
from ovbuild.cli import main
from ovbuild.graph.dflash import build_dflash_draft
from ovbuild.ir import save_ir
from ovbuild.graph.target import build_target
sys.exit(main(argv))
"""
REPO = Path(__file__).resolve().parents[1]


def start_paused(where: str, argv: list, go: Path, nth: int = 1, fallback: bool = False) -> subprocess.Popen:
    """`ovbuild ARGV` in a child process that stops before the `nth` call of `where` ("module:attr.attr") until
    the file `go` exists; returns once it has stopped there."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    args = [sys.executable, "-c", PAUSED_CHILD, where, str(nth), str(go), "1" if fallback else "0", *map(str, argv)]
    child = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    line = child.stdout.readline()
    if line != "paused\n":
        child.kill()
        out, err = child.communicate(timeout=60)
        raise AssertionError(f"child did not reach {where}: exit {child.returncode}, {line + out!r}, {err!r}")
    return child


def finish(child: subprocess.Popen) -> Run:
    """Wait for a child of `start_paused`; its exit code, stdout and stderr."""
    out, err = child.communicate(timeout=120)
    return Run(child.returncode, out, err)


def assert_one_line(run: Run, code: int, line: str) -> None:
    """Exit `code` and stderr exactly `line` (so no traceback)."""
    assert run.code == code and run.err.splitlines() == [line], f"exit {run.code}, stderr {run.err!r}"
