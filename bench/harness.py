"""The one harness every benchmark runs on: interleaved rounds, per-round ratios, the machine line, equal outputs.

A speed claim is a ratio of cases measured side by side in one process. Each round runs every case once, in a new
random order, so a busy moment of a shared machine falls on all of them alike; a ratio is taken within each round and
reported as the median over rounds with its range (min-max). Every benchmark prints `machine_line()` first (CPU model
and the flags that change OpenVINO's kernels, OpenVINO version, commit, date), and checks that the cases it compares
produced equal outputs before it prints a ratio between them.

    rounds = interleave({"plain": run_plain, "speculative": run_speculative}, n_rounds=5)
    require_equal(rounds.outputs, "plain")
    report(rounds, base="plain")

A case is a callable without arguments. The harness times its call and keeps what it returns; a case that times itself
(a median over calls, a server's own figure) returns `Measured(seconds, output)` instead.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import statistics
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ovbuild.runtime.model.machine import ISA_ENV

# Flags (in /proc/cpuinfo's spelling) that change which kernels OpenVINO's CPU plugin picks.
FEATURE_PATTERN = re.compile(r"^(avx2|avx512.*|amx.*|.*vnni.*|.*bf16.*|.*fp16.*|f16c)$")
REPOSITORY = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Measured:
    """What a case returns when it times itself: its seconds and its output (for the equality checks)."""

    seconds: float
    output: Any = None


@dataclass(frozen=True)
class Ratio:
    """A ratio taken within each round: median over rounds and range."""

    median: float
    low: float
    high: float

    def __str__(self) -> str:
        return f"{self.median:.2f}x ({self.low:.2f}-{self.high:.2f})"


@dataclass
class Rounds:
    """Seconds of each case per round (in the order the cases were given), and each case's last output."""

    seconds: dict[str, list[float]]
    outputs: dict[str, Any] = field(default_factory=dict)

    def median(self, name: str) -> float:
        """The median seconds of case `name` over rounds."""
        return statistics.median(self.seconds[name])

    def ratio(self, numerator: str, denominator: str) -> Ratio:
        """seconds[numerator] / seconds[denominator] within each round (the speed-up of `denominator` over
        `numerator`): median and range."""
        return ratio_of(self.seconds[numerator], self.seconds[denominator])


def ratio_of(numerators: Iterable[float], denominators: Iterable[float]) -> Ratio:
    """Per-round ratios of two paired series: median and range."""
    ratios = [a / b for a, b in zip(numerators, denominators, strict=True)]
    return Ratio(statistics.median(ratios), min(ratios), max(ratios))


def timed(case: Callable[[], Any]) -> Measured:
    """One call of `case`: wall seconds (or the case's own Measured) and its output."""
    start = time.perf_counter()
    output = case()
    seconds = time.perf_counter() - start
    return output if isinstance(output, Measured) else Measured(seconds, output)


def interleave(
    cases: dict[str, Callable[[], Any]],
    n_rounds: int,
    seed: int = 0,
    warmup: bool = True,
    check: Callable[[str, Any], None] | None = None,
) -> Rounds:
    """Run every case once per round, in a new random order each round (after one untimed warm-up call of each when
    `warmup`), and keep each case's seconds per round and its last output. `check(name, output)`, when given, sees
    every timed output (to raise on one that differs, or to count)."""
    rng = np.random.default_rng(seed)
    names = list(cases)
    if warmup:
        for i in rng.permutation(len(names)):  # indices: case names keep their own type (str, float, ...)
            cases[names[i]]()
    rounds = Rounds({name: [] for name in names})
    for _ in range(n_rounds):
        # a new order every round: a case always run after the same neighbour would carry that neighbour's effect on
        # caches and clocks into every ratio
        for name in (names[i] for i in rng.permutation(len(names))):
            measured = timed(cases[name])
            rounds.seconds[name].append(measured.seconds)
            rounds.outputs[name] = measured.output
            if check is not None:
                check(name, measured.output)
    return rounds


class OutputsDiffer(AssertionError):
    """Cases that should have produced the same output did not: their ratio would compare different work."""


def equal(a: Any, b: Any) -> bool:
    """Exact equality of outputs: arrays by value, lists, tuples and dicts element by element."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(np.asarray(a), np.asarray(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def require_equal(outputs: dict[str, Any], reference: str, names: Iterable[str] | None = None) -> None:
    """Raise OutputsDiffer unless every case in `names` (default: all) produced what `reference` produced."""
    for name in names if names is not None else outputs:
        if not equal(outputs[name], outputs[reference]):
            raise OutputsDiffer(f"{name!r} produced other output than {reference!r}")


def report(rounds: Rounds, base: str, unit: str = "ms", scale: float = 1e3) -> None:
    """One line per case: median time over rounds and `base`'s time over the case's, taken within rounds."""
    width = max(len(name) for name in rounds.seconds)
    for name in rounds.seconds:
        print(
            f"  {name:<{width}}  {rounds.median(name) * scale:9.3f} {unit}   {base} / this {rounds.ratio(base, name)}"
        )


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (the platform's processor string where that is unreadable)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_features() -> list[str]:
    """The CPU's flags that change OpenVINO's kernels (avx2, avx512*, amx*, vnni, bf16, f16), in cpuinfo's order."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    for line in text.splitlines():
        if line.startswith("flags"):
            return [f for f in line.split(":", 1)[1].split() if FEATURE_PATTERN.match(f)]
    return []


def commit() -> str:
    """The repository's commit (short hash, `+changes` when tracked files differ from it), or `unknown`."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPOSITORY, capture_output=True, text=True, check=True
        ).stdout.strip()
        changed = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPOSITORY, capture_output=True, text=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+changes" if changed else "")


def machine_line() -> str:
    """One line: CPU model and cores, its kernel-relevant flags, OpenVINO version and CPU plugin precisions, commit,
    date."""
    import openvino as ov

    core = ov.Core()
    capabilities = ",".join(core.get_property("CPU", "OPTIMIZATION_CAPABILITIES"))
    default = core.get_property("CPU", "INFERENCE_PRECISION_HINT").get_type_name()
    features = " ".join(cpu_features()) or "none of avx2/avx512/amx/vnni/bf16/f16"
    limit = os.environ.get(ISA_ENV)  # as set, even a level ovbuild's table does not know: oneDNN reads it
    if limit:  # the kernels run as on a CPU without the extensions above it (ovbuild.runtime.model.machine)
        features += f"; KERNELS LIMITED TO {limit.strip().upper()} ({ISA_ENV})"
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (
        f"machine: {cpu_model()}, {os.cpu_count()} cores; flags: {features}; OpenVINO {ov.get_version()} "
        f"(CPU plugin: {capabilities}, default {default}); commit {commit()}; {date}"
    )


def add_arguments(parser: argparse.ArgumentParser, rounds: int = 5) -> None:
    """The options every benchmark takes: --rounds and --seed (of the round order)."""
    parser.add_argument("--rounds", type=int, default=rounds, help="interleaved rounds (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the order of cases in each round")


def start(title: str) -> None:
    """Print the benchmark's title and the machine line."""
    print(title)
    print(machine_line())


def plot_speedups(path: Path, title: str, xlabel: str, series: dict[str, dict[int, Ratio]], machine: str) -> None:
    """Draw each series' median ratio (with its range as an error bar) against x, as a PNG at `path`: the picture a
    README shows beside its table (matplotlib, the bench extra)."""
    import matplotlib

    matplotlib.use("Agg")  # no display: write the file only
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    for name, points in series.items():
        xs = sorted(points)
        medians = [points[x].median for x in xs]
        spread = [[points[x].median - points[x].low for x in xs], [points[x].high - points[x].median for x in xs]]
        ax.errorbar(xs, medians, yerr=spread, marker="o", capsize=3, label=name)
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted({x for points in series.values() for x in points}))
    ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_xlabel(xlabel)
    ax.set_ylabel("speed-up (median, range over rounds)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.text(0.01, 0.01, machine, fontsize=5, color="grey")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(path)
    plt.close(fig)
