"""The built-in demo: export a target + DFlash draft pair, then run code-completion prompts concurrently with the
draft and with the target alone, and compare outputs, acceptance and speed.

The default pair is the small trained one shipped in `ovbuild/data/demo`; `tiny=True` uses the random test pair
instead (it accepts almost nothing: it shows the mechanics, not the speed-up).
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

# Starts of real code that a small model trained on Python sources continues without looping at once.
DEMO_PROMPTS = (
    'def binary_search(items, target):\n    """Return the index of target in the sorted list items."""\n',
    'class Stack:\n    """A last-in, first-out stack."""\n\n    def __init__(self):\n',
    "import os\n\n\ndef list_python_files(folder):\n",
    "def parse_args(argv=None):\n    parser = argparse.ArgumentParser(",
)


@dataclass
class DemoRun:
    """Both runs of the demo over the same prompts."""

    prompts: list[str]
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


def run_demo(
    prompts: list[str] | None = None,
    max_new_tokens: int = 96,
    tiny: bool = False,
    options: RuntimeOptions | None = None,
    num_assistant_tokens: int | None = None,
) -> DemoRun:
    """Export the pair into a temporary folder and run every prompt with the draft, then with the target alone."""
    prompts = list(prompts or DEMO_PROMPTS)
    with tempfile.TemporaryDirectory(prefix="ovbuild_demo_") as tmp:
        tmp = Path(tmp)
        if tiny:
            from ovbuild.testing import write_tiny_dflash, write_tiny_target

            sources = write_tiny_target(tmp / "ckpt" / "target"), write_tiny_dflash(tmp / "ckpt" / "draft")
        else:
            sources = shipped_pair()
        target, draft = export_pair(*sources, tmp / "exported")
        pipeline = Pipeline(target, draft, options)
        pipeline.generate(prompts[:1], max_new_tokens=4)  # warm-up: first-call allocations stay out of the timing
        speculative, spec_metrics = pipeline.generate(prompts, max_new_tokens, num_assistant_tokens)
        alone, alone_metrics = pipeline.generate(prompts, max_new_tokens, use_draft=False)
    return DemoRun(prompts, speculative, alone, spec_metrics, alone_metrics)
