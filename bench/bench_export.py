"""Export of a draft shaped like z-lab/Qwen3-4B-DFlash-b16 in each weight format, against the
I/O floor measured in the same run.

Writes random bf16 checkpoints (the draft, and a target holding only what a draft export reads: embedding, lm_head,
final norm, under a full Qwen3-4B config), then for each format runs `ovbuild export` in a fresh subprocess and
records wall time and that process's peak RSS. The floor is the time to read every tensor the export reads once and
to write a file of the output's size; the compute column is the weight policy's arithmetic alone (every tensor
through `WeightPolicy.matrix`, nothing written). Targets: wall <= 3 x (floor + compute), peak RSS <= 1.25 x .bin +
300 MB. With `--rounds N` the export, the floor and the compute run N times each in a new order per round
(bench/harness.py), every export's .bin byte-identical to the first.

    python bench/bench_export.py [--workdir DIR] [--formats keep,fp16] [--keep] [--rounds 1]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ovbuild.export.weight_formats import WEIGHT_FORMATS

import harness
from shapes import QWEN3_4B, write_draft, write_target

MB = 1e6
# An untied target (its own lm_head next to the embedding), so the export reads two vocabulary tables.
TARGET_CONFIG = {**QWEN3_4B, "tie_word_embeddings": False}


def io_floor(files: list[Path], out_bytes: int, scratch: Path) -> tuple[float, float]:
    """Seconds to read every byte of `files` once, and to write `out_bytes` to a new file (no fsync, like export)."""
    buf = bytearray(64 << 20)
    t0 = time.perf_counter()
    for path in files:
        with open(path, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass
    t1 = time.perf_counter()
    with open(scratch, "wb", buffering=0) as f:
        left = out_bytes
        while left:
            left -= f.write(memoryview(buf)[: min(left, len(buf))])
    t2 = time.perf_counter()
    scratch.unlink()
    return t1 - t0, t2 - t1


COMPUTE = """
import sys, time
from ovbuild.weights.checkpoint import Checkpoint
from ovbuild.export.weight_formats import make_policy
policy = make_policy(sys.argv[3])
t0 = time.perf_counter()
for folder in sys.argv[1:3]:
    ckpt = Checkpoint.open(folder)
    for name in ckpt.tensor_names:
        t = ckpt.get(name)
        if t.array.ndim == 2:
            role = "embedding" if "embed" in name else "lm_head" if "lm_head" in name else "linear"
            policy.matrix(t, name, role=role)
        ckpt.release(name)
print(time.perf_counter() - t0)
"""


def digest(path: Path) -> str:
    """sha256 of a file, read in 64 MB pieces."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while piece := f.read(64 << 20):
            h.update(piece)
    return h.hexdigest()


def run_measured(argv: list[str]) -> tuple[float, int]:
    """Wall seconds and peak RSS (bytes) of one fresh subprocess."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed ({os.waitstatus_to_exitcode(status)}): {' '.join(argv)}")
    return wall, usage.ru_maxrss * 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, help="where checkpoints and exports go (default: a temp folder)")
    parser.add_argument("--formats", help="comma-separated weight formats (default: all)")
    parser.add_argument("--keep", action="store_true", help="keep the workdir")
    parser.add_argument("--write-checkpoints", type=Path, help=argparse.SUPPRESS)  # internal: the child that writes
    harness.add_arguments(parser, rounds=1)
    args = parser.parse_args()
    if args.write_checkpoints:
        write_draft(args.write_checkpoints / "draft")
        write_target(args.write_checkpoints / "target", TARGET_CONFIG, layers=False)
        return
    harness.start("Export of a draft shaped like z-lab/Qwen3-4B-DFlash-b16 per weight format, against the I/O floor")
    work = args.workdir or Path(tempfile.mkdtemp(prefix="ovbuild-bench-export-"))
    formats = args.formats.split(",") if args.formats else list(WEIGHT_FORMATS)
    draft, target = work / "draft", work / "target"
    python = sys.executable
    if not (draft / "config.json").exists():
        print(f"writing checkpoints in {work} ...", flush=True)
        # In a child: Linux carries a parent's peak RSS at fork into its children's ru_maxrss, so this process must
        # stay small for the exports it measures (written here, the checkpoints' 2.4 GB showed up in every export).
        subprocess.run([python, __file__, "--write-checkpoints", str(work)], check=True)
    in_bytes = sum(p.stat().st_size for p in [*draft.glob("*.safetensors"), *target.glob("*.safetensors")])
    _, base_rss = run_measured([python, "-c", "import ovbuild.cli, ovbuild.export, openvino"])
    rows = []
    sources = [*draft.glob("*.safetensors"), *target.glob("*.safetensors")]
    for fmt in formats:
        out = work / f"out-{fmt}"
        cmd = [python, "-m", "ovbuild.cli", "export", "-m", str(draft), str(out), "--target-model", str(target)]
        peaks: list[int] = []

        def export_case(cmd: list[str] = cmd, out: Path = out, fmt: str = fmt, peaks: list[int] = peaks):
            wall, rss = run_measured([*cmd, "--weight-format", fmt, "--overwrite", "--quiet"])
            peaks.append(rss)
            return harness.Measured(wall, digest(out / "openvino_model.bin"))

        def floor_case(out: Path = out) -> harness.Measured:
            read_s, write_s = io_floor(sources, (out / "openvino_model.bin").stat().st_size, work / "x")
            return harness.Measured(read_s + write_s, (read_s, write_s))

        def compute_case(fmt: str = fmt) -> harness.Measured:
            argv = [python, "-c", COMPUTE, str(draft), str(target), fmt]
            return harness.Measured(float(subprocess.run(argv, capture_output=True, text=True, check=True).stdout))

        export_case()  # the floor reads the output's size; and the export's digest every round must equal this one
        first, floors = digest(out / "openvino_model.bin"), []

        def check(name: str, output, first: str = first, floors: list = floors, fmt: str = fmt) -> None:
            if name == "export" and output != first:
                raise harness.OutputsDiffer(f"{fmt}: an export wrote other bytes than the first")
            if name == "floor":
                floors.append(output)

        cases = {"export": export_case, "floor": floor_case, "compute": compute_case}
        timed = harness.interleave(cases, args.rounds, seed=args.seed, warmup=False, check=check)
        bound = [f + c for f, c in zip(timed.seconds["floor"], timed.seconds["compute"], strict=True)]
        ratio = harness.ratio_of(timed.seconds["export"], bound)
        read_s, write_s = (statistics.median(f[i] for f in floors) for i in (0, 1))
        bin_bytes = (out / "openvino_model.bin").stat().st_size
        rows.append(
            (fmt, timed.median("export"), read_s, write_s, timed.median("compute"), max(peaks), bin_bytes, ratio)
        )
        shutil.rmtree(out)
    print(f"\ncheckpoints read: {in_bytes / MB:.0f} MB bf16; python + openvino + ovbuild alone: {base_rss / MB:.0f} MB")
    print(f"medians over {args.rounds} rounds; wall/(floor+compute) taken within rounds: median (range)")
    head = "format  wall s  read s  write s  compute s  wall/(floor+compute)  peak RSS MB  .bin MB  RSS limit MB  ok"
    print(head)
    for fmt, wall, read_s, write_s, compute_s, rss, bin_bytes, ratio in rows:
        limit = 1.25 * bin_bytes + 300 * MB
        ok = "yes" if ratio.median <= 3 and rss <= limit else "NO"
        print(
            f"{fmt:<6}  {wall:6.1f}  {read_s:6.1f}  {write_s:7.1f}  {compute_s:9.1f}  {ratio!s:>20}  "
            f"{rss / MB:11.0f}  {bin_bytes / MB:7.0f}  {limit / MB:12.0f}  {ok}"
        )
    if not args.keep and not args.workdir:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
