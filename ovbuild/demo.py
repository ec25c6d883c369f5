"""The built-in demo: export a target + DFlash draft pair, then run code-completion prompts with the draft and with
the target alone, one request at a time and all at once, and compare outputs, acceptance and speed.

The default pair is the small trained one shipped in `ovbuild/data/demo` (docs/demo_training.md); `tiny=True` uses
the random test pair instead (it accepts almost nothing: it shows the mechanics, not the speed-up).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ovbuild.errors import ExportError
from ovbuild.export import export
from ovbuild.runtime.metrics import RunMetrics
from ovbuild.runtime.pipeline import Pipeline, RuntimeOptions
from ovbuild.runtime.request import Request

# Starts of Python code whose 96-token greedy continuation by the shipped target has no repeated 16-token run: a
# target this small loops on most prompts (a loop is trivial to draft and would flatter the acceptance), so these
# were picked from a longer list of code starts by that rule; tests/test_demo_pair.py checks it still holds.
DEMO_PROMPTS = (
    "class Stack:\n    def __init__(self):\n",
    "        except KeyError:\n            ",
    '    def close(self):\n        """Close the file."""\n',
    "class Timer:\n",
)


@dataclass
class Comparison:
    """One way of serving the prompts, with the draft and with the target alone."""

    name: str
    speculative: list[Request]
    alone: list[Request]
    speculative_metrics: RunMetrics
    alone_metrics: RunMetrics

    @property
    def identical(self) -> bool:
        return [r.generated for r in self.speculative] == [r.generated for r in self.alone]

    @property
    def speedup(self) -> float:
        return self.speculative_metrics.tokens_per_second / max(self.alone_metrics.tokens_per_second, 1e-9)


@dataclass
class DemoRun:
    """The prompts, and both ways of serving them: one request at a time, then all requests at once."""

    prompts: list[str]
    one_at_a_time: Comparison
    concurrent: Comparison

    @property
    def identical(self) -> bool:
        return self.one_at_a_time.identical and self.concurrent.identical


def shipped_pair() -> tuple[Path, Path]:
    """The trained demo checkpoints that ship with the package."""
    root = Path(str(resources.files("ovbuild") / "data" / "demo"))
    target, draft = root / "target", root / "draft"
    if not (target / "config.json").exists() or not (draft / "config.json").exists():
        raise ExportError(f"{root}: the demo checkpoints are missing from this installation")
    return target, draft


def export_pair(target_ckpt: Path, draft_ckpt: Path, out: Path) -> tuple[Path, Path]:
    """Export the pair as the README shows: the target with the draft's taps, the draft with the target's tables."""
    target = export(target_ckpt, out / "target", draft_of=draft_ckpt, quiet=True).out
    draft = export(draft_ckpt, out / "draft", target_model=target_ckpt, quiet=True).out
    return target, draft


def compare(
    pipeline: Pipeline, name: str, batches: list[list[str]], max_new_tokens: int, k: int | None, repeats: int = 3
) -> Comparison:
    """Serve each batch of prompts as concurrent requests, with the draft and alone, alternating; each side keeps
    its fastest of `repeats` rounds (every round produces the same tokens), totals over all batches."""
    rounds: dict[bool, list] = {True: [], False: []}
    for _ in range(repeats):
        for use_draft in (True, False):
            requests, metrics = [], RunMetrics()
            for batch in batches:
                done, run = pipeline.generate(batch, max_new_tokens, k, use_draft=use_draft)
                requests.extend(done)
                metrics.merge(run)
            rounds[use_draft].append((metrics.wall_s, requests, metrics))
    (_, spec, spec_metrics), (_, alone, alone_metrics) = (min(rounds[d], key=lambda r: r[0]) for d in (True, False))
    return Comparison(name, spec, alone, spec_metrics, alone_metrics)


def run_demo(
    prompts: list[str] | None = None,
    max_new_tokens: int = 96,
    tiny: bool = False,
    options: RuntimeOptions | None = None,
    num_assistant_tokens: int | None = None,
) -> DemoRun:
    """Export the pair into a temporary folder, then serve the prompts one at a time and all at once."""
    prompts = list(prompts or DEMO_PROMPTS)
    with tempfile.TemporaryDirectory(prefix="ovbuild_demo_") as tmp:
        tmp = Path(tmp)
        if tiny:
            from ovbuild.testing import write_tiny_dflash, write_tiny_target

            sources = write_tiny_target(tmp / "ckpt" / "target"), write_tiny_dflash(tmp / "ckpt" / "draft")
        else:
            sources = shipped_pair()
        pipeline = Pipeline(*export_pair(*sources, tmp / "exported"), options)
        pipeline.generate(prompts[:1], max_new_tokens=4)  # warm-up: first-call allocations stay out of the timing
        single = compare(
            pipeline, "one request at a time", [[p] for p in prompts], max_new_tokens, num_assistant_tokens
        )
        together = compare(
            pipeline, f"{len(prompts)} concurrent requests", [prompts], max_new_tokens, num_assistant_tokens
        )
    return DemoRun(prompts, single, together)
