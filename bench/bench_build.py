"""Build-and-save benchmark of a draft shaped like z-lab/Qwen3-4B-DFlash-b16, per weight format.

Writes random bf16 checkpoints to a temporary folder (the draft: hidden 2560, 5 layers, 32/8 heads of 128,
intermediate 9728, 5 taps of a 36-layer target; and the target's embedding table, vocab 151936, which the draft IR
holds as its embedding and, tied as in Qwen3-4B, as its lm_head), then builds and saves the draft IR once per
weight format, each in a fresh process so that its peak RSS (VmHWM) is its own. Peak RSS counts the checkpoint
pages mapped from the page cache.

    python bench/bench_build.py [--formats keep,fp16,int8,int4] [--group-size 128] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ovbuild.families import build_draft_models, load_draft
from ovbuild.graph.weights import WeightPolicy
from ovbuild.ir import save_ir
from ovbuild.targets import load_target
from ovbuild.weights.checkpoint import Checkpoint

from shapes import write_draft, write_target


def write_checkpoints(root: Path) -> tuple[Path, Path]:
    """The random draft and the tables of the target that the draft IR holds (tied embedding / lm_head)."""
    return write_draft(root / "draft"), write_target(root / "target", layers=False)


def peak_rss_bytes() -> int:
    """VmHWM of this process."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def measure(weight_format: str, group_size: int, draft: Path, target: Path, out: Path) -> dict[str, float]:
    """Build and save the draft IR in this process; times in seconds, sizes in bytes."""
    begin = time.perf_counter()
    cfg, draft_weights = load_draft(Checkpoint.open(draft))
    _, target_weights = load_target(Checkpoint.open(target))
    models = build_draft_models(cfg, draft_weights, target_weights, WeightPolicy(weight_format, group_size=group_size))
    built = time.perf_counter()
    for stem, model in models.items():
        save_ir(model, out / f"{stem}.xml")
    saved = time.perf_counter()
    size = sum(p.stat().st_size for p in out.glob("*.bin"))
    return {"build_s": built - begin, "save_s": saved - built, "peak_rss": peak_rss_bytes(), "bin": size}


def table(results: dict[str, dict[str, float]], base: str) -> str:
    """Markdown table with ratios to `base` measured in the same run."""
    ref = results[base]
    lines = [
        f"| format | build s | save s | peak RSS GiB | .bin GiB | build / {base} | peak RSS / {base} | .bin / {base} |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        ratios = " | ".join(f"{r[k] / ref[k]:.2f}" for k in ("build_s", "peak_rss", "bin"))
        lines.append(
            f"| {name} | {r['build_s']:.1f} | {r['save_s']:.1f} | {r['peak_rss'] / 2**30:.2f} | {r['bin'] / 2**30:.3f} "
            f"| {ratios} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--formats", default="keep,fp16,int8,int4")
    parser.add_argument("--group-size", type=int, default=128)
    parser.add_argument("--workdir", help="where to write the checkpoints and IRs (default: a temporary folder)")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # internal: measure one format, print JSON
    args = parser.parse_args()
    root = Path(args.workdir or tempfile.mkdtemp(prefix="ovbuild_bench_"))
    if args.child:
        out = root / f"ir_{args.child}"
        print(json.dumps(measure(args.child, args.group_size, root / "draft", root / "target", out)))
        shutil.rmtree(out)
        return 0
    try:
        begin = time.perf_counter()
        write_checkpoints(root)
        print(f"random bf16 checkpoints written to {root} in {time.perf_counter() - begin:.0f} s", flush=True)
        results = {}
        for fmt in args.formats.split(","):
            cmd = [
                sys.executable,
                __file__,
                "--child",
                fmt,
                "--group-size",
                str(args.group_size),
                "--workdir",
                str(root),
            ]
            child = subprocess.run(cmd, capture_output=True, text=True)
            if child.returncode:
                raise SystemExit(f"{fmt}: build failed\n{child.stderr}")
            results[fmt] = json.loads(child.stdout)
            print(f"{fmt}: {results[fmt]}", flush=True)
        print(table(results, "fp16" if "fp16" in results else next(iter(results))))
    finally:
        if not args.workdir:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
