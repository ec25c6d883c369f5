"""Pipeline: exported target (and draft) folders -> text in, text out, many requests at once."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tokenizers import Tokenizer

from ovbuild.errors import CompatibilityError, ConfigError, ExportError
from ovbuild.graph.ir import read_ir
from ovbuild.graph.rt_info import get_rt_info
from ovbuild.runtime.drafters import DRAFTERS, Drafter
from ovbuild.runtime.metrics import RunMetrics
from ovbuild.runtime.paged_model import PagedModel
from ovbuild.runtime.request import GenerationConfig, Request
from ovbuild.runtime.scheduler import Scheduler


@dataclass(frozen=True)
class ModelOptions:
    """How one model runs: KV cache precision, inference precision hint (None = the device default), cache size."""

    kv_cache_precision: str
    inference_precision: str | None
    cache_mb: float


# Exactness decides the target's defaults. Speculative decoding verifies k+1 rows where the target alone runs one
# and writes rows it later rolls back; greedy output equals the target alone only if neither changes the committed
# numbers. f32 math keeps row-count effects below ties, and an f16 cache stores each token on its own, whereas u8
# keys are quantized per channel across a cache block, so a rolled-back row shifts its neighbours' scales
# (measured on the tiny pair: 16/16 requests identical with f16 + f32, 9/16 with the u8 + bf16 device defaults).
# The draft only affects acceptance, never output, so it runs as fast as the device allows.
EXACT_TARGET = ModelOptions(kv_cache_precision="f16", inference_precision="f32", cache_mb=512)
FAST_DRAFT = ModelOptions(kv_cache_precision="u8", inference_precision=None, cache_mb=256)


@dataclass(frozen=True)
class RuntimeOptions:
    """Where and how the target and the draft run."""

    device: str = "CPU"
    target: ModelOptions = EXACT_TARGET
    draft: ModelOptions = FAST_DRAFT
    max_num_batched_tokens: int = 2048
    # Options of the draft family's drafter, e.g. {"confidence_threshold": 0.5, "markov_mode": "lattice"} for DSpark.
    draft_options: dict = field(default_factory=dict)


class Pipeline:
    """A compiled target with its tokenizer, and optionally a drafter; `generate` serves prompts concurrently."""

    def __init__(
        self, target_dir: str | Path, draft_dir: str | Path | None = None, options: RuntimeOptions | None = None
    ):
        self.options = options or RuntimeOptions()
        o = self.options
        target_dir = Path(target_dir)
        model = read_ir(target_dir)
        t = o.target
        self.target = PagedModel(model, o.device, t.kv_cache_precision, t.inference_precision, cache_mb=t.cache_mb)
        self.tokenizer = load_tokenizer(target_dir)
        self.eos_token_ids = eos_token_ids(target_dir)
        self.drafter = load_drafter(draft_dir, o) if draft_dir is not None else None
        if self.drafter is not None:
            taps = get_rt_info(model, "ovbuild/target_layer_ids", "")
            if taps != ",".join(str(t) for t in self.drafter.target_layer_ids):
                raise CompatibilityError(
                    f"{draft_dir}: the draft reads target layers {self.drafter.target_layer_ids} "
                    f"but {target_dir} was exported with taps [{taps}] (export the target with "
                    "--draft-of this draft)"
                )

    def scheduler(self, trace: bool = False, use_draft: bool = True) -> Scheduler:
        """A fresh scheduler over this pipeline's compiled models and caches (`use_draft=False`: the target alone)."""
        drafter = self.drafter if use_draft else None
        return Scheduler(self.target, drafter, self.options.max_num_batched_tokens, self.decode, trace)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def generate(
        self,
        prompts: list[str],
        max_new_tokens: int = 64,
        num_assistant_tokens: int | None = None,
        stop_strings: tuple[str, ...] = (),
        trace: bool = False,
        on_step: Callable[[Scheduler], None] | None = None,
        use_draft: bool = True,
        **sampling,
    ) -> tuple[list[Request], RunMetrics]:
        """Run every prompt as a concurrent request; returns finished requests (in prompt order) and run totals.
        `sampling`: GenerationConfig's do_sample, temperature, top_k, top_p, rng_seed (greedy by default)."""
        config = GenerationConfig(
            max_new_tokens, self.eos_token_ids, tuple(stop_strings), num_assistant_tokens, **sampling
        )
        scheduler = self.scheduler(trace, use_draft)
        for prompt in prompts:
            scheduler.add_request(self.encode(prompt), config)
        while scheduler.has_unfinished():
            scheduler.step()
            if on_step is not None:
                on_step(scheduler)
        return sorted(scheduler.finished, key=lambda r: r.id), scheduler.metrics


def load_drafter(folder: str | Path, options: RuntimeOptions) -> Drafter:
    """The drafter class registered for the folder's family, loaded with the runtime options."""
    model_file = Path(folder) / "openvino_model.xml"
    if not model_file.exists():
        raise ExportError(f"{folder}: no openvino_model.xml (not an exported draft folder)")
    model = read_ir(model_file)
    family = get_rt_info(model, "ovbuild/family")
    if family not in DRAFTERS:
        raise ExportError(f"{model_file}: no drafter for family {family!r} (known: {', '.join(DRAFTERS)})")
    drafter = DRAFTERS[family]
    unknown = sorted(set(options.draft_options) - set(drafter.OPTIONS))
    if unknown:
        raise ConfigError(
            f"{model_file}: a {family} draft takes no option '{unknown[0]}' "
            f"(its options: {', '.join(drafter.OPTIONS) or 'none'})"
        )
    return drafter.from_folder(
        folder,
        model,
        device=options.device,
        kv_cache_precision=options.draft.kv_cache_precision,
        inference_precision=options.draft.inference_precision,
        cache_mb=options.draft.cache_mb,
        **options.draft_options,
    )


def load_tokenizer(folder: Path) -> Tokenizer:
    path = folder / "tokenizer.json"
    if not path.exists():
        raise ExportError(f"{path}: tokenizer not found (export the target with its tokenizer)")
    return Tokenizer.from_file(str(path))


def eos_token_ids(folder: Path) -> tuple[int, ...]:
    """End-of-sequence ids from generation_config.json, else config.json."""
    for name in ("generation_config.json", "config.json"):
        path = folder / name
        if path.exists():
            value = json.loads(path.read_text()).get("eos_token_id")
            if value is not None:
                return tuple(value) if isinstance(value, list) else (value,)
    return ()
