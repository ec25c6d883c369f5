"""Mutation check: plant realistic bugs one at a time in a copy of the repository and see whether the tests catch them.

Each mutant (the table is tools/mutants.py) is a plain text substitution in one file, applied to a fresh temporary
copy of the working tree; the test files relevant to it run there (pytest -x, with a timeout). Outcomes:
  caught   - a test failed on an assertion (including pytest.raises / pytest.fail);
  survived - every test passed: the suite cannot see this bug;
  crashed  - the tests failed, but only by an exception, a signal (segfault) or the timeout: a bug the suite stumbles
             on rather than detects;
  stale    - the text to replace is no longer in the file exactly once (update the mutant).

    python tools/mutation_check.py              # every mutant, two at a time
    python tools/mutation_check.py --list
    python tools/mutation_check.py --stale      # only check that every mutant's text is in its file exactly once
    python tools/mutation_check.py --only graph-rope-yarn-cos-only --only kv-begins-from-reserved
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mutants import MUTANTS, Mutant

ROOT = Path(__file__).resolve().parents[1]


def working_tree_files() -> list[str]:
    """Tracked and untracked-but-not-ignored files: the tree as it is now, uncommitted edits included."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return [f for f in out.stdout.splitlines() if (ROOT / f).is_file()]


def copy_tree(files: list[str], dest: Path) -> None:
    for f in files:
        (dest / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, dest / f)


def apply(mutant: Mutant, tree: Path) -> bool:
    """Plant the mutant; False when its text is not in the file exactly once."""
    path = tree / mutant.path
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    if text.count(mutant.old) != 1:
        return False
    path.write_text(text.replace(mutant.old, mutant.new), encoding="utf-8")
    return True


def is_planted(mutant: Mutant) -> bool:
    """Whether the mutant's text is in its file of the working tree exactly once (else it is stale)."""
    path = ROOT / mutant.path
    return path.exists() and path.read_text(encoding="utf-8").count(mutant.old) == 1


def classify(returncode: int, report: Path) -> tuple[str, str]:
    """(outcome, detail) of one pytest run from its exit code and JUnit report."""
    if returncode == 0:
        return "survived", ""
    if returncode < 0 or not report.exists():
        return "crashed", f"exit {returncode} (signal)" if returncode < 0 else f"exit {returncode}, no report"
    failures = [
        (case.get("classname", "") + "::" + case.get("name", ""), element)
        for case in ET.parse(report).iter("testcase")
        for element in case
        if element.tag in ("failure", "error")
    ]
    for test, element in failures:
        message = element.get("message", "")
        if element.tag == "failure" and message.startswith(("AssertionError", "assert", "Failed:")):
            return "caught", f"{test.split('.')[-1]}: {message.splitlines()[0][:90]}"
    if failures:
        test, element = failures[0]
        return "crashed", f"{test.split('.')[-1]}: {element.get('message', '').splitlines()[0][:90]}"
    return "crashed", f"exit {returncode}"


def run(mutant: Mutant, files: list[str], timeout: float) -> tuple[str, str, float]:
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"mutant-{mutant.name}-") as tmp:
        tree = Path(tmp) / "repo"
        copy_tree(files, tree)
        if not apply(mutant, tree):
            return "stale", f"text not found exactly once in {mutant.path}", 0.0
        report = Path(tmp) / "report.xml"
        env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
        command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", f"--junitxml={report}"]
        try:
            proc = subprocess.run(
                [*command, *mutant.tests], cwd=tree, env=env, capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            return "crashed", f"timeout after {timeout:.0f} s", time.perf_counter() - start
        outcome, detail = classify(proc.returncode, report)
        return outcome, detail, time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", default=[], metavar="NAME", help="run this mutant (repeatable)")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--stale", action="store_true", help="list the stale mutants (no tests run) and exit")
    parser.add_argument("--jobs", type=int, default=2, help="mutants run at once (default 2)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per mutant's test run")
    args = parser.parse_args()
    if args.list:
        for m in MUTANTS:
            print(f"{m.name:42} {m.path}")
        return 0
    if args.stale:
        stale = [m for m in MUTANTS if not is_planted(m)]
        for m in stale:
            print(f"{m.name:42} stale: text not found exactly once in {m.path}")
        print(f"{len(stale)} stale of {len(MUTANTS)} mutants")
        return 1 if stale else 0
    unknown = set(args.only) - {m.name for m in MUTANTS}
    if unknown:
        parser.error(f"unknown mutant(s): {', '.join(sorted(unknown))} (see --list)")
    chosen = [m for m in MUTANTS if not args.only or m.name in args.only]
    files = working_tree_files()

    def run_one(m: Mutant) -> tuple[str, str, float]:
        outcome = run(m, files, args.timeout)
        print(f"  {m.name}: {outcome[0]}", file=sys.stderr, flush=True)  # progress; the table comes at the end
        return outcome

    with ThreadPoolExecutor(max_workers=max(1, min(args.jobs, 2))) as pool:
        results = list(pool.map(run_one, chosen))
    print(f"{'mutant':42} {'outcome':9} {'time':>6}  detail")
    for m, (outcome, detail, seconds) in zip(chosen, results, strict=True):
        print(f"{m.name:42} {outcome:9} {seconds:5.0f}s  {detail}")
    counts = {o: sum(r[0] == o for r in results) for o in ("caught", "survived", "crashed", "stale")}
    print(", ".join(f"{n} {o}" for o, n in counts.items()) + f" of {len(results)} mutants")
    return 0 if counts["caught"] == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
