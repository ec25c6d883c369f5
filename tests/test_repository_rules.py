"""Rules for the repository as a whole: it speaks of what the code does, not of the work that made it (no milestone
numbers); every measurement in the docs names its command, the CPU and the commit or date; the benchmarks all run on
bench/harness.py; README.md stays a first screen and a map; the package's files stay short."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# A work milestone by number: the words the project's history used for its stages and tasks.
MILESTONE = re.compile(r"\b(stop|issue) [0-9]+", re.IGNORECASE)
RATIO = re.compile(r"\b\d+\.\d+x\b")  # a measured ratio, "1.23x"
COMMAND = re.compile(r"`(python|ovbuild|pytest|cd bench)[^`]*`|/usr/bin/time")
CPU = re.compile(r"EPYC|AVX|CPU|Xeon|Core i")
WHEN = re.compile(r"\b[0-9a-f]{7,40}\b|\b20\d\d-\d\d-\d\d\b")  # a commit hash or an ISO date


def tracked_files() -> list[Path]:
    """The repository's files as git tracks them (every file under the root, hidden folders aside, without git)."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return [p for p in ROOT.rglob("*") if p.is_file() and not any(s.startswith(".") for s in p.parts[-3:])]
    return [ROOT / name for name in listed.decode().split("\0") if name and (ROOT / name).is_file()]


def milestones(text: str) -> list[str]:
    """Milestone numbers in `text` (what `grep -niE "stop [0-9]+|issue [0-9]+"` finds)."""
    return [m.group(0) for m in MILESTONE.finditer(text)]


def unnamed_measurements(markdown: str) -> list[str]:
    """Headings of the sections that report a ratio without a command, a CPU or a commit or date anywhere in them."""
    out = []
    for section in re.split(r"(?m)^(?=#{1,3} )", markdown):
        if RATIO.search(section) and not all(r.search(section) for r in (COMMAND, CPU, WHEN)):
            out.append(section.splitlines()[0])
    return out


def test_the_checks_catch_what_they_look_for():
    stop, issue = "Stop" + " 12", "issue" + " 7"  # spelt apart, so that this file itself passes the grep
    assert milestones(f"as measured in {stop} (see {issue})") == [stop, issue]
    assert milestones("a stop string; issue a request; 12 stops") == []
    assert unnamed_measurements("## Fast\n\nIt ran 1.30x as fast.\n") == ["## Fast"]
    named = "## Fast\n\n`python bench/bench_x.py` ran 1.30x as fast on a 2-core AMD EPYC (commit ba0c78e).\n"
    assert unnamed_measurements(named) == []


def test_no_milestone_numbers_in_tracked_files():
    found = {}
    for path in tracked_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary files (weights, IRs) hold no prose
        if hits := milestones(text):
            found[str(path.relative_to(ROOT))] = hits
    assert not found, f"milestone numbers (say what they mean instead): {found}"


@pytest.mark.parametrize("doc", ["README.md", *sorted(p.name for p in (ROOT / "docs").glob("*.md"))])
def test_measurements_name_command_cpu_and_commit_or_date(doc):
    path = ROOT / doc if doc == "README.md" else ROOT / "docs" / doc
    assert not unnamed_measurements(path.read_text()), (
        f"{doc}: a section reports a ratio without its command, CPU and commit or date"
    )


def test_every_benchmark_runs_on_the_harness():
    bench = ROOT / "bench"
    files = sorted(p.name for p in bench.iterdir() if p.is_file())
    # 12: the benchmarks of this wave are invariance and vision
    assert len(files) <= 12, f"bench/ holds the benchmarks a user runs, at most 12 files: {files}"
    for script in bench.glob("bench_*.py"):
        text = script.read_text()
        assert "import harness" in text and "harness.start(" in text, f"{script.name}: not on bench/harness.py"


def test_readme_is_a_first_screen_and_a_map():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; details belong in docs/"


def test_package_files_stay_short():
    """One concept per file: none in the package over 400 lines."""
    long = {
        str(path.relative_to(ROOT)): n
        for path in (ROOT / "ovbuild").rglob("*.py")
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > 400
    }
    assert not long, f"files over 400 lines, to split by concept: {long}"
