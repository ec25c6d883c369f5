"""Pipeline: exported target (and draft) folders -> text in, text out, many requests at once."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import openvino as ov
from tokenizers import Tokenizer

from ovbuild.errors import ConfigError, ExportError, RequestError, UnsupportedError
from ovbuild.ir import MODEL_FILE, Identity, read_ir, read_json
from ovbuild.runtime.cache.cache_manager import BlocksAndSlots
from ovbuild.runtime.cache.state_pool import state_specs
from ovbuild.runtime.folders import check_pair, context_length, exported_model, require_draft, require_target
from ovbuild.runtime.images import image_prompts
from ovbuild.runtime.metrics import RunMetrics
from ovbuild.runtime.model.devices import (
    check_kv_precision,
    draft_inference_precision,
    target_inference_precision,
)
from ovbuild.runtime.model.machine import device_kind
from ovbuild.runtime.model.paged_model import PagedModel
from ovbuild.runtime.prompts import prompt_list
from ovbuild.runtime.request import GenerationConfig, Request
from ovbuild.runtime.scheduler import DEFAULT_MAX_NUM_SEQS, Scheduler
from ovbuild.runtime.speculation.calibration import CalibrationCache
from ovbuild.runtime.speculation.drafters import DRAFTERS, Drafter
from ovbuild.runtime.speculation.planner import Speculation
from ovbuild.runtime.streaming import step_until_done
from ovbuild.runtime.structured.grammar import Grammars
from ovbuild.runtime.validation import check_cache_mb, check_positive_int, check_prompt, check_utf8


@dataclass(frozen=True)
class ModelOptions:
    """How one model runs: KV cache precision, inference precision hint (None = the device default), cache size,
    and whether its calls run in copies compiled per row count (None = where that pays:
    ovbuild.runtime.model.static_rows)."""

    kv_cache_precision: str
    inference_precision: str | None
    cache_mb: float
    static_rows: bool | None = None


# Exactness decides the target's defaults. Speculative decoding verifies k+1 rows where the target alone runs one
# and writes rows it later rolls back; greedy output equals the target alone only if neither changes the committed
# numbers. An f16 cache stores each token on its own, whereas the plugin's u8 keys are quantized per channel across
# a cache block, so a rolled-back row shifts its neighbours' scales (measured on the tiny pair: 16/16 requests
# identical with f16 + f32, 9/16 with the u8 + bf16 device defaults, before verification rows ran as 1-row
# subsequences). The math is chosen per device (inference precision None: ovbuild.runtime.model.devices.
# target_inference_precision): bf16 where it was measured exact, else f32.
# The draft only affects acceptance, never output, so it runs as fast as the device allows (its inference precision
# None: ovbuild.runtime.model.devices.draft_inference_precision picks it for the device).
EXACT_TARGET = ModelOptions(kv_cache_precision="f16", inference_precision=None, cache_mb=512)
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
    # Longest prompt + max_new_tokens served; None = the target's max_position_embeddings (it can only lower it).
    max_model_len: int | None = None
    # Reuse cached blocks of equal prefixes (vLLM's and GenAI's name); requests running at once (vLLM's name).
    enable_prefix_caching: bool = True
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    # A hybrid target's linear-attention state is copied aside every state_snapshot_interval tokens (rounded to whole
    # cache blocks), at most max_state_snapshots copies: a prefix hit resumes from the last one (docs/serving.md).
    state_snapshot_interval: int = 256
    max_state_snapshots: int = 16
    # Keep the draft-length planner's calibration per pair and machine and reuse it
    # (ovbuild.runtime.speculation.calibration); recalibrate: time the calls again and replace what was kept.
    calibration_cache: bool = True
    recalibrate: bool = False


class Pipeline:
    """A compiled target with its tokenizer, and optionally a drafter; `generate` serves prompts concurrently."""

    def __init__(
        self, target_dir: str | Path, draft_dir: str | Path | None = None, options: RuntimeOptions | None = None
    ):
        self.options = options or RuntimeOptions()
        o = self.options
        check_options(o, with_draft=draft_dir is not None)
        # Both folders are read and checked against each other before anything is compiled.
        target_dir = Path(target_dir)
        model = read_ir(target_dir)
        target = exported_model(target_dir, model)
        require_target(target)
        draft_model = None
        if draft_dir is not None:
            draft_model = read_draft_ir(draft_dir)
            draft = exported_model(draft_dir, draft_model)
            require_draft(draft)
            drafter_class(draft_dir, draft_model, o)  # options the family does not take are refused first
            check_pair(target, draft)
        self.max_model_len = context_length(target, o.max_model_len)
        self.tokenizer = load_tokenizer(target_dir)
        self.target_dir = target_dir
        self.eos_token_ids = eos_token_ids(target_dir)
        t = o.target
        math = target_precision(o, stateful=bool(state_specs(model)))
        self.target = PagedModel(
            model, o.device, t.kv_cache_precision, math, cache_mb=t.cache_mb, static_rows=t.static_rows
        )
        cache = self.target.cache_manager
        if isinstance(cache, BlocksAndSlots):
            interval = max(1, round(o.state_snapshot_interval / cache.block_size)) * cache.block_size
            cache.keep_snapshots(interval, o.max_state_snapshots)
        self.drafter = load_drafter(draft_dir, o, draft_model) if draft_dir is not None else None
        # one planner for every scheduler of this pipeline: call costs are measured once and keep improving, and the
        # run-wide acceptance carries over from one generate call to the next
        self.speculation = Speculation.for_pair(self.target, self.drafter) if self.drafter else None
        if self.speculation is not None and o.calibration_cache:
            settings = f"{o.device}; {o.target}; {o.draft}; {sorted(o.draft_options.items())}; {self.describe()}"
            cache = CalibrationCache.for_pair(target_dir, draft_dir, settings, o.recalibrate)
            self.speculation.calibration_cache = cache

    def describe(self) -> str:
        """How the target (and the draft) run, as the device compiled them: device, math, KV cache precision."""
        draft = f"; draft {self.drafter.describe()}" if self.drafter is not None else ""
        return f"target {self.target.describe()}{draft}"

    def compile_copies(self) -> None:
        """Compile every static copy of both models now (ovbuild.runtime.model.static_rows): a server's first requests
        would otherwise compile them, 0.1 to 0.4 s each on the demo pair, in the middle of their latency."""
        self.target.compile_copies()
        if self.drafter is not None:
            self.drafter.compile_copies()

    def scheduler(self, trace: bool = False, use_draft: bool = True) -> Scheduler:
        """A fresh scheduler over this pipeline's compiled models and caches (`use_draft=False`: the target alone)."""
        drafter = self.drafter if use_draft else None
        return Scheduler(
            self.target,
            drafter,
            self.options.max_num_batched_tokens,
            self.decode,
            trace,
            self.max_model_len,
            self.speculation if use_draft else None,
            enable_prefix_caching=self.options.enable_prefix_caching,
            max_num_seqs=self.options.max_num_seqs,
            grammars=self.grammars,
        )

    @functools.cached_property
    def grammars(self) -> Grammars:
        """The target's grammar compiler for structured output (llguidance reads the tokenizer when first used)."""
        return Grammars(self.target_dir / "tokenizer.json", self.eos_token_ids, self.target.vocab_size)

    def encode(self, text: str, what: str = "prompt") -> list[int]:
        """Token ids of `text`, which must be valid UTF-8 (`what` names it in the error)."""
        if not isinstance(text, str):
            raise RequestError(f"{what} must be text (str), got {type(text).__name__}")
        check_utf8(text, what)
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def generate(
        self,
        prompts: str | list[int] | list[str | list[int]],
        max_new_tokens: int = 64,
        num_assistant_tokens: int | None = None,
        stop_strings: tuple[str, ...] = (),
        trace: bool = False,
        on_step: Callable[[Scheduler], None] | None = None,
        use_draft: bool = True,
        images=None,
        **sampling,
    ) -> tuple[list[Request], RunMetrics]:
        """Run every prompt (text or token ids; a str or an id list is one prompt) as a concurrent request; returns
        finished requests (in prompt order) and run totals. `sampling`: GenerationConfig's do_sample, temperature,
        top_k, top_p, rng_seed (greedy by default). `images`: the ImageInputs one prompt shows (embeddings at its
        placeholder tokens), or for several prompts one list (or ImagePrompt, or None) each."""
        config = GenerationConfig(
            max_new_tokens, self.eos_token_ids, tuple(stop_strings), num_assistant_tokens, **sampling
        )
        items, single = prompt_list(prompts)
        prompt_ids = [
            np.array(self.encode(p, f"prompt {i + 1}") if isinstance(p, str) else p, np.int64)
            for i, p in enumerate(items)
        ]
        for i, ids in enumerate(prompt_ids):  # every prompt, before the first is queued
            check_prompt(ids, max_new_tokens, self.target.vocab_size, self.max_model_len, f"prompt {i + 1}")
        shown = image_prompts(images, [len(ids) for ids in prompt_ids], single)
        scheduler = self.scheduler(trace, use_draft)
        for ids, pictures in zip(prompt_ids, shown, strict=True):
            scheduler.add_request(ids, config, images=pictures)
        # an error or Ctrl-C mid-run must not leave blocks or drafter state behind for the next call: the loop aborts
        step_until_done(scheduler, on_step)
        return sorted(scheduler.finished, key=lambda r: r.id), scheduler.metrics


def load_drafter(folder: str | Path, options: RuntimeOptions, model: ov.Model | None = None) -> Drafter:
    """The drafter class registered for the folder's family, loaded with the runtime options (`model`: the folder's
    openvino_model.xml when the caller has read it already)."""
    model = read_draft_ir(folder) if model is None else model
    return drafter_class(folder, model, options).from_folder(
        folder,
        model,
        device=options.device,
        kv_cache_precision=options.draft.kv_cache_precision,
        inference_precision=draft_precision(options),
        cache_mb=options.draft.cache_mb,
        static_rows=options.draft.static_rows,
        **options.draft_options,
    )


def drafter_class(folder: str | Path, model: ov.Model, options: RuntimeOptions) -> type[Drafter]:
    """The drafter registered for the draft's family, once it is known to take the options given."""
    model_file = Path(folder) / MODEL_FILE
    family = Identity.from_model(model, model_file).family
    if family not in DRAFTERS:
        raise ExportError(f"{model_file}: no drafter for family {family!r} (known: {', '.join(DRAFTERS)})")
    drafter = DRAFTERS[family]
    names = [option.name for option in drafter.OPTIONS]
    unknown = sorted(set(options.draft_options) - set(names))
    if unknown:
        raise ConfigError(
            f"{model_file}: a {family} draft takes no option '{unknown[0]}' (its options: {', '.join(names) or 'none'})"
        )
    return drafter


def target_precision(options: RuntimeOptions, stateful: bool = False) -> str | None:
    """The target's inference precision on the options' device
    (ovbuild.runtime.model.devices.target_inference_precision); stateful: the target has linear-attention states."""
    target = options.target
    return target_inference_precision(options.device, target.inference_precision, target.kv_cache_precision, stateful)


def draft_precision(options: RuntimeOptions) -> str | None:
    """The draft's inference precision on the options' device
    (ovbuild.runtime.model.devices.draft_inference_precision)."""
    draft = options.draft
    return draft_inference_precision(options.device, draft.inference_precision, draft.kv_cache_precision)


def read_draft_ir(folder: str | Path) -> ov.Model:
    """The main IR of a draft folder."""
    if not (Path(folder) / MODEL_FILE).exists():
        raise ExportError(f"{folder}: no {MODEL_FILE} (not an exported draft folder)")
    return read_ir(folder)


# How check_options names each option in its messages: Python's names by default; the CLI passes its own.
OPTION_NAMES = {
    "device": "device",
    "static_rows": "static_rows=True",
    "target cache_mb": "target cache_mb",
    "draft cache_mb": "draft cache_mb",
    "target kv_cache_precision": "target kv_cache_precision",
    "draft kv_cache_precision": "draft kv_cache_precision",
    "max_model_len": "max_model_len",
    "max_num_seqs": "max_num_seqs",
    "state_snapshot_interval": "state_snapshot_interval",
    "max_state_snapshots": "max_state_snapshots",
}


def check_options(options: RuntimeOptions, with_draft: bool, names: dict[str, str] | None = None) -> None:
    """Device, static rows, cache sizes, KV precisions and max_model_len, checked before any model is read or
    compiled: the one place runtime options are checked. `names` words the messages in the caller's terms (the
    command line's options), keyed as OPTION_NAMES."""
    from ovbuild.runtime.model import devices  # looked up at call time, so that a test can stand in another device

    name = {**OPTION_NAMES, **(names or {})}
    devices.check_device(options.device)
    models = [("target", options.target), ("draft", options.draft)] if with_draft else [("target", options.target)]
    if any(m.static_rows for _, m in models) and device_kind(options.device) != "CPU":
        raise UnsupportedError(f"{name['static_rows']}: static copies run on CPU, not on {options.device}")
    for which, model in models:
        check_cache_mb(model.cache_mb, name[f"{which} cache_mb"])
        precision = draft_precision(options) if which == "draft" else target_precision(options)
        check_kv_precision(options.device, model.kv_cache_precision, precision, name[f"{which} kv_cache_precision"])
    if options.max_model_len is not None:
        check_positive_int(options.max_model_len, name["max_model_len"])
    check_positive_int(options.max_num_seqs, name["max_num_seqs"])
    check_positive_int(options.state_snapshot_interval, name["state_snapshot_interval"])
    if int(options.max_state_snapshots) != options.max_state_snapshots or options.max_state_snapshots < 0:
        raise ConfigError(f"{name['max_state_snapshots']} = {options.max_state_snapshots} must be an integer >= 0")


def load_tokenizer(folder: Path) -> Tokenizer:
    path = folder / "tokenizer.json"
    if not path.exists():
        raise ExportError(f"{path}: tokenizer not found (export the target with its tokenizer)")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # the tokenizers library raises a bare Exception for a file it cannot parse
        raise ExportError(f"{path}: not a tokenizer the tokenizers library can read ({e})") from None


def eos_token_ids(folder: Path) -> tuple[int, ...]:
    """End-of-sequence ids from generation_config.json, else config.json."""
    for name in ("generation_config.json", "config.json"):
        path = folder / name
        if path.exists():
            value = read_json(path).get("eos_token_id")
            if value is None:
                continue
            ids = value if isinstance(value, list) else [value]
            if not all(type(i) is int and i >= 0 for i in ids):
                raise ConfigError(f"{path}: eos_token_id {value!r} is not a token id or a list of them")
            return tuple(ids)
    return ()
