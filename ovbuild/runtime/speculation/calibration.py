"""Timing a few calls of the target and the draft once, so that the first draft-length plan has call costs to go by
(they are then updated from every call the scheduler makes).

The timings are kept on disk per pair and machine (CalibrationCache): `ovbuild generate` of a few prompts spent more
time calibrating (1.8 s) than in its target calls (1.6 s), every time. The key is what call times depend on: the
models' graphs (the IR files' SHA-256, the weight files' sizes; not their folder or weight values), the CPU and
OpenVINO version, and how the models were compiled (device, precisions, static copies). A cached entry seeds the cost
models exactly as a calibration would, and every call then updates them as before, so the first plans stand on the
same ground either way; two calls timed against the entry tell whether it still holds (a calibration taken while the
machine was busy is replaced). `recalibrate` times the calls again and replaces the entry.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ovbuild.errors import CacheExhaustedError
from ovbuild.ir.ports import INPUT_IDS, LOGITS_INDICES, POSITION_IDS
from ovbuild.runtime.cache.rows import sequence_rows
from ovbuild.runtime.model.paged_model import PagedModel
from ovbuild.runtime.model.static_rows import COPY_ROWS
from ovbuild.runtime.speculation.drafters.base import Drafter, DraftItem
from ovbuild.runtime.speculation.planner import Speculation

# Row counts timed on each model: one row and every static copy's (ovbuild.runtime.model.static_rows), so that each
# bucket a plan prices starts from a calibrated call. With only 1, 2, 4, ... 64 timed, the first 24-row call of a run
# (4 requests drafting 4 or 5 each) took 326 ms on a Qwen3-4B-shaped target where its 19 calls' median was 241, and
# priced alone, it kept plans from drafting 4 for every request until their 25th.
CALIBRATION_ROWS = (1, *COPY_ROWS)
SCRATCH = -1  # the sequence id the timed calls write under; its blocks are freed right after


def calibrate(speculation: Speculation, target: PagedModel, drafter: Drafter) -> None:
    """Time calls of CALIBRATION_ROWS rows on each model, once per planner; when either cache lacks the blocks for
    it, the costs are learnt from the scheduler's own calls instead."""
    if speculation.calibrated or speculation.calibration_tried:
        return
    speculation.calibration_tried = True
    cache = speculation.calibration_cache

    def target_call(rows: int) -> float:
        inputs = {
            INPUT_IDS: np.zeros(rows, np.int64),
            POSITION_IDS: np.arange(rows),
            LOGITS_INDICES: np.arange(rows),
        }
        # rows laid out as verification lays them out (1-row subsequences on CPU: they take another attention kernel
        # than one subsequence of as many rows), states reported after every row (a hybrid target; else ignored)
        layout = sequence_rows(SCRATCH, 0, rows, target.row_subsequences)
        return timed(lambda: target.run(layout, inputs, [list(range(rows))]))

    def draft_call(rows: int) -> float:
        k = min(drafter.max_candidates, rows - drafter.candidate_offset)  # a block of k + offset rows, context the rest
        context_rows = rows - (k + drafter.candidate_offset if k > 0 else 0)
        context = np.zeros((context_rows, drafter.tap_width), np.float32) if context_rows else None
        item = DraftItem(SCRATCH, context, 0 if k > 0 else None, max(k, 0))
        seconds = timed(lambda: drafter.propose([item]))
        ran[rows] = drafter.rows_run(rows)  # a draft without copies runs its calls padded (Drafter.rows_run)
        drafter.free(SCRATCH)
        return seconds

    timings: dict[str, dict[int, float]] = {"target": {}, "draft": {}}
    ran: dict[int, int] = {}  # draft rows asked -> rows the call computed
    try:
        if cache is not None and cache.restore(speculation, target_call, draft_call):
            return
        time_target, time_draft = _kept(target_call, timings["target"]), _kept(draft_call, timings["draft"])
        observe_calls(speculation, time_target, time_draft, lambda rows: ran.get(rows, rows))
    except CacheExhaustedError:
        return
    finally:
        target.free(SCRATCH)
        drafter.free(SCRATCH)
    if cache is not None:
        cache.save(timings, ran)


def observe_calls(
    speculation: Speculation,
    time_target: Callable[[int], float],
    time_draft: Callable[[int], float],
    draft_rows_run: Callable[[int], int] | None = None,
) -> None:
    """Time calls of CALIBRATION_ROWS rows on each model (the best of three each) into the planner's cost models;
    draft_rows_run: the rows a draft call of so many rows computed, padding included (Drafter.rows_run), where its
    time is kept."""
    for rows in CALIBRATION_ROWS:
        speculation.target_cost.observe(rows, min(time_target(rows) for _ in range(3)))
        seconds = min(time_draft(rows) for _ in range(3))
        speculation.draft_cost.observe(draft_rows_run(rows) if draft_rows_run else rows, seconds)


def _kept(time_call: Callable[[int], float], fastest: dict[int, float]) -> Callable[[int], float]:
    """time_call, keeping the fastest time of each row count in `fastest` (what observe_calls observes)."""

    def call(rows: int) -> float:
        seconds = time_call(rows)
        fastest[rows] = min(seconds, fastest.get(rows, seconds))
        return seconds

    return call


CHECK_ROWS = 8  # the draft call timed to tell whether a kept calibration still holds (a block of 8 rows)
STALE_FACTOR = 1.5  # a kept time this many times off the one measured now is stale
CACHE_ENV = "OVBUILD_CACHE_DIR"
CACHE_VERSION = 3  # raised when what is stored, or how it is timed, changes


def cache_dir() -> Path:
    """Where ovbuild keeps what it measured on this machine: $OVBUILD_CACHE_DIR, else $XDG_CACHE_HOME/ovbuild, else
    ~/.cache/ovbuild."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ovbuild"


# Node and tensor names: OpenVINO numbers unnamed nodes from a process-wide counter, so two exports of one model
# differ in them and nowhere else that timing depends on.
_NAMES = re.compile(rb' \w*names?="[^"]*"')


def folder_identity(folder: str | Path) -> dict:
    """What a folder's call times depend on: its IR files' SHA-256 without node names (graph, shapes, types; small
    files) and its weight files' sizes (hashing gigabytes of weights would cost more than calibrating)."""
    folder = Path(folder)
    return {
        "graphs": {
            f.name: hashlib.sha256(_NAMES.sub(b"", f.read_bytes())).hexdigest() for f in sorted(folder.glob("*.xml"))
        },
        "weights": {f.name: f.stat().st_size for f in sorted(folder.glob("*.bin"))},
    }


def calibration_key(target_dir: str | Path, draft_dir: str | Path, settings: str) -> str:
    """The cache key of a pair served with `settings` (how the models were compiled) on this machine."""
    import openvino as ov

    from ovbuild.runtime.model.machine import describe

    about = {
        "version": CACHE_VERSION,
        "target": folder_identity(target_dir),
        "draft": folder_identity(draft_dir),
        "machine": describe(),
        "cpus": os.cpu_count(),
        "openvino": ov.get_version(),
        "settings": settings,
    }
    return hashlib.sha256(json.dumps(about, sort_keys=True).encode()).hexdigest()[:32]


@dataclass
class CalibrationCache:
    """One pair's calibration timings on this machine, in a small JSON file; `refresh`: time again and replace it."""

    path: Path
    refresh: bool = False

    @classmethod
    def for_pair(cls, target_dir: str | Path, draft_dir: str | Path, settings: str, refresh: bool = False):
        key = calibration_key(target_dir, draft_dir, settings)
        return cls(cache_dir() / "calibration" / f"{key}.json", refresh)

    def restore(
        self, speculation: Speculation, time_target: Callable[[int], float], time_draft: Callable[[int], float]
    ) -> bool:
        """Seed the planner's cost models from the file, as observe_calls would; False when there is none
        to use (absent, refreshed, unreadable, from another calibration, or stale: it is then timed again and
        rewritten). Stale: a target call of 1 row or a draft call of CHECK_ROWS rows, timed now (best of 2), is
        more than STALE_FACTOR away from the kept time; a calibration taken while the machine was busy would
        otherwise steer every later run's first plans (the draft's costs are only measured again when it drafts)."""
        if self.refresh:
            return False
        try:
            stored = json.loads(self.path.read_text())
            tables = [[(int(rows), float(seconds)) for rows, seconds in stored[name]] for name in ("target", "draft")]
        except (OSError, ValueError, KeyError, TypeError):
            return False
        if any(sorted(rows for rows, _ in table) != sorted(CALIBRATION_ROWS) for table in tables):
            return False
        if any(not (np.isfinite(seconds) and seconds > 0) for table in tables for _, seconds in table):
            return False
        for time_call, table, rows in ((time_target, tables[0], 1), (time_draft, tables[1], CHECK_ROWS)):
            kept = dict(table)[rows]
            now = min(time_call(rows) for _ in range(2))
            if not kept / STALE_FACTOR <= now <= kept * STALE_FACTOR:
                return False
        ran = {int(rows): int(run) for rows, run in stored.get("draft_rows_run", [])}
        for rows, seconds in tables[0]:
            speculation.target_cost.observe(rows, seconds)
        for rows, seconds in tables[1]:
            speculation.draft_cost.observe(ran.get(rows, rows), seconds)
        return True

    def save(self, timings: dict[str, dict[int, float]], draft_rows_run: dict[int, int] | None = None) -> None:
        """Keep a calibration's timings and the rows each draft call computed (written to a temporary file, then
        moved into place; a cache that cannot be written is only a missed saving, never an error)."""
        stored: dict[str, list] = {name: sorted(table.items()) for name, table in timings.items()}
        stored["draft_rows_run"] = sorted((draft_rows_run or {}).items())
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            partial = self.path.with_suffix(f".{os.getpid()}.tmp")
            partial.write_text(json.dumps(stored) + "\n")
            partial.replace(self.path)
        except OSError:
            return
        self.refresh = False


def timed(call: Callable[[], object]) -> float:
    """Wall seconds of one call."""
    start = time.perf_counter()
    call()
    return time.perf_counter() - start
