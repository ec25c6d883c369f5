"""`export`: one checkpoint (a target or a draft, hub id or folder) to a complete IR folder, weights streamed.

checkpoint ─ kind (target architecture? else a draft family's) ─ config, compatibility with the target
  ─ builders of the IR format (tensors read one at a time) ─ IRs + provenance, configs, tokenizer ─ OUT
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import openvino as ov

from ovbuild.errors import ConfigError, UnsupportedError
from ovbuild.export.compat import check_draft_fits_target
from ovbuild.export.ir_formats import IrFormat, ir_format
from ovbuild.export.output_folder import OutputFolder
from ovbuild.export.package import CONFIG_FILES, IMAGE_PROCESSOR_FILES, Package, provenance
from ovbuild.export.progress import LayerProgress, hub_progress, on_terminal
from ovbuild.export.source_files import check_copied_files, check_target_tokenizer
from ovbuild.export.streaming import PageDropper, StreamingSource
from ovbuild.export.weight_formats import default_weight_format, make_policy
from ovbuild.families import DRAFT_ARCHITECTURES, draft_builder, load_draft, read_draft_config
from ovbuild.graph.weights import WeightPolicy
from ovbuild.ir import VISION_STEM
from ovbuild.targets import (
    SUPPORTED_TARGET_ARCHITECTURES,
    TARGET_ARCHITECTURES,
    VisionConfig,
    VisionTower,
    find_vision_tower,
    load_target,
    target_builder,
)
from ovbuild.weights.checkpoint import TOKENIZER_FILES, Checkpoint, read_config
from ovbuild.weights.config_reader import ConfigReader
from ovbuild.weights.draft_config import DraftConfig, check_target_layer_ids
from ovbuild.weights.target import TargetConfig
from ovbuild.weights.tensor_names import WeightSource

log = logging.getLogger(__name__)
HEAD_TENSORS = ("embed_tokens", "lm_head")  # what a draft borrows from its target unless it carries its own


@dataclass(frozen=True)
class ExportResult:
    """What an export wrote: OUT, the kind ("target" / "draft") and family, the weight format, file sizes."""

    out: Path
    kind: str
    family: str
    weight_format: str
    files: dict[str, int]


def export(
    model: str | Path,
    out: str | Path,
    *,
    target_model: str | Path | None = None,
    weight_format: str | None = None,
    sym: bool | None = None,
    group_size: int | None = None,
    all_layers: bool | None = None,
    revision: str | None = None,
    cache_dir: str | None = None,
    target_layer_ids: Sequence[int] | None = None,
    draft_of: str | Path | None = None,
    overwrite: bool = False,
    quiet: bool = False,
    format: str = "paged",
    vision: bool = True,
) -> ExportResult:
    """Export checkpoint `model` (hub id or folder; `revision` applies to it) to the folder `out`.

    Unset weight options take the per-kind default of `weight_formats` and the policy's own defaults. A
    vision-language target's vision tower is exported beside it, and its language model takes image embeddings,
    unless `vision` is False (then the language model is built as a text-only checkpoint's).
    """
    fmt = ir_format(format)
    options = dict(sym=sym, group_size=group_size, all_layers=all_layers)
    chosen = make_policy(weight_format, **options) if weight_format is not None else None  # bad formats fail first
    show = not quiet and on_terminal()
    output = OutputFolder(out, overwrite)  # an existing OUT is refused before anything is downloaded or built
    with output as tmp, hub_progress(show):
        ckpt = Checkpoint.open(model, revision, cache_dir)
        output.refuse_overlap(ckpt.folder, "checkpoint")
        job = Job(ckpt, Package(tmp, output.out), format, fmt, chosen, options, show)
        if kind_of(ckpt) == "target":
            if target_model is not None:
                raise ConfigError(f"{ckpt.source} is a target: --target-model is only for draft exports")
            kind, (family, policy) = "target", export_target(job, target_layer_ids, draft_of, cache_dir, vision)
        else:
            if target_layer_ids is not None or draft_of is not None:
                raise ConfigError(
                    f"{ckpt.source} is a draft: --target-layer-ids and --draft-of are only for target exports "
                    "(a draft's taps come from its config)"
                )
            family, policy = export_draft(job, target_model, cache_dir, output)
            kind = "draft"
    files = {p.name: p.stat().st_size for p in sorted(output.out.iterdir())}
    return ExportResult(output.out, kind, family, policy.weight_format, files)


@dataclass(frozen=True)
class Job:
    """One export under way: the checkpoint, the partial folder, the IR format and the weight choices."""

    ckpt: Checkpoint
    package: Package
    format_name: str
    format: IrFormat
    chosen: WeightPolicy | None  # None: the kind's default weight format
    options: dict
    show: bool

    def policy(self, kind: str) -> WeightPolicy:
        return self.chosen or make_policy(default_weight_format(kind), **self.options)


def export_target(
    job: Job,
    target_layer_ids: Sequence[int] | None,
    draft_of: str | Path | None,
    cache_dir: str | None,
    vision: bool = True,
) -> tuple[str, WeightPolicy]:
    """The target IR with its taps (and its vision tower's IR, when it has one and `vision`), configs and tokenizer,
    written into the partial folder; returns its family and policy."""
    cfg, weights = load_target(job.ckpt)
    if not vision:
        cfg = cfg.text_only()
    build = target_builder(cfg, job.format_name)  # a format the family does not have fails before anything is read
    tower = find_vision_tower(job.ckpt.config, str(job.ckpt.config_path)) if vision else None
    vision_source = tower.load(job.ckpt) if tower is not None else None  # a bad vision_config fails early too
    if cfg.export_note is not None:
        log.info("%s: %s", job.ckpt.source, cfg.export_note)
    taps = target_taps(cfg, job.ckpt.source, target_layer_ids, draft_of, cache_dir)
    check_copied_files(job.ckpt, (*CONFIG_FILES, *TOKENIZER_FILES, *(IMAGE_PROCESSOR_FILES if tower else ())))
    check_target_tokenizer(job.ckpt)
    policy = job.policy("target")
    log.info("exporting target %s (%s weights, taps %s)", job.ckpt.source, policy.weight_format, list(taps))
    models = stream_build(
        f"target {cfg.architecture}", cfg.num_layers, [weights], job.show, lambda w: build(cfg, w, taps, policy)
    )
    if vision_source is not None:
        models |= build_vision(job, tower, *vision_source, policy)
    job.package.save_models(models, provenance(job.ckpt, job.format_name))
    job.package.copy_files(job.ckpt, (*CONFIG_FILES, *TOKENIZER_FILES))
    if vision_source is not None:
        job.package.copy_files(job.ckpt, IMAGE_PROCESSOR_FILES)
    job.package.write_generation_config(cfg.eos_token_ids)
    job.package.convert_tokenizer(job.ckpt.folder, required=job.format.needs_tokenizer_irs)
    return cfg.family, policy


def build_vision(
    job: Job, tower: VisionTower, cfg: VisionConfig, weights: WeightSource, policy: WeightPolicy
) -> dict[str, ov.Model]:
    """The vision tower's IR, its matrices in float: integer formats apply to the language model only (the tower is
    small beside it, and no parity test has measured it compressed)."""
    float_policy = policy.uncompressed()
    log.info("exporting vision tower %s (%s weights)", tower.name, float_policy.weight_format)
    label = f"vision tower {tower.name}"
    return stream_build(
        label, cfg.depth, [weights], job.show, lambda w: {VISION_STEM: tower.build(cfg, w, float_policy)}
    )


def export_draft(
    job: Job, target_model: str | Path | None, cache_dir: str | None, output: OutputFolder
) -> tuple[str, WeightPolicy]:
    """Every IR of the draft and its configs, written into the partial folder; returns its family and policy."""
    cfg, weights = load_draft(job.ckpt)
    build = draft_builder(cfg, job.format_name)  # a format the family does not have fails before anything is read
    check_copied_files(job.ckpt, CONFIG_FILES)
    target = open_target(job.ckpt, cfg, weights, target_model, cache_dir, job.format.draft_embeds_target)
    if target is not None:
        output.refuse_overlap(target.checkpoint.folder, "target checkpoint")
    policy = job.policy("draft")
    log.info("exporting draft %s (%s, %s weights)", job.ckpt.source, cfg.family, policy.weight_format)
    models = stream_build(
        f"draft {cfg.family}", cfg.num_layers, [weights, target], job.show, lambda w, t: build(cfg, w, t, policy)
    )
    target_ckpt = target.checkpoint if target is not None else None
    job.package.save_models(models, provenance(job.ckpt, job.format_name, target_ckpt))
    job.package.copy_files(job.ckpt, CONFIG_FILES)
    return cfg.family, policy


def kind_of(ckpt: Checkpoint) -> str:
    """ "target" for a supported target architecture, "draft" for one a draft family reads; never runs code."""
    r = ConfigReader(ckpt.config, str(ckpt.config_path))
    arch = r.architecture()
    if arch in TARGET_ARCHITECTURES:
        return "target"
    if arch in DRAFT_ARCHITECTURES:
        return "draft"
    targets = ", ".join(SUPPORTED_TARGET_ARCHITECTURES)
    raise UnsupportedError(
        f"{r.where('architectures')}: unknown architecture {arch!r} (targets: {targets}; "
        f"drafts: {', '.join(DRAFT_ARCHITECTURES)})"
    )


def target_taps(
    cfg: TargetConfig,
    source: str,
    target_layer_ids: Sequence[int] | None,
    draft_of: str | Path | None,
    cache_dir: str | None,
) -> tuple[int, ...]:
    """The layers a target IR exports as hidden_states: given, or those the draft `draft_of` reads (checked)."""
    if target_layer_ids is not None and draft_of is not None:
        raise ConfigError("--target-layer-ids and --draft-of both set the target's taps: give one of them")
    if target_layer_ids is not None:
        taps = tuple(target_layer_ids)
        check_target_layer_ids(taps, cfg.num_layers, f"{source}: --target-layer-ids")
        return taps
    if draft_of is not None:
        config, path = read_config(draft_of, cache_dir=cache_dir)
        draft, _ = read_draft_config(config, str(path))
        # Whether the draft borrows this target's embedding needs its tensors; its own export checks that.
        check_draft_fits_target(draft, str(draft_of), cfg, source, embeds_with_target=False)
        return draft.target_layer_ids
    log.info("no --target-layer-ids or --draft-of: the target IR has logits only, no hidden_states taps")
    return ()


def open_target(
    ckpt: Checkpoint,
    cfg: DraftConfig,
    weights: WeightSource,
    target_model: str | Path | None,
    cache_dir: str | None,
    embeds_target: bool = True,
) -> WeightSource | None:
    """The target a draft is exported for, checked against the draft; None when none is given and none is needed
    (the draft carries its own embedding and lm_head, or the IR format does not embed the target's)."""
    borrows = [n for n in HEAD_TENSORS if not weights.has(n)]
    if target_model is None:
        if borrows and embeds_target:
            raise ConfigError(
                f"{ckpt.source}: the draft has no {' / '.join(borrows)} of its own: pass --target-model "
                "(the target it drafts for)"
            )
        return None
    target_ckpt = Checkpoint.open(target_model, cache_dir=cache_dir)
    tcfg, tweights = load_target(target_ckpt)
    fc_inputs = weights.get("fc").shape[1] if weights.has("fc") else None
    check_draft_fits_target(cfg, ckpt.source, tcfg, target_ckpt.source, fc_inputs, embeds_with_target=bool(borrows))
    return tweights


def stream_build(
    label: str,
    num_layers: int,
    sources: list[WeightSource | None],
    show: bool,
    build: Callable[..., dict[str, ov.Model]],
) -> dict[str, ov.Model]:
    """Run `build(*sources)` with each source read one tensor at a time, a progress bar following the layers."""
    progress = LayerProgress(f"building {label}", num_layers, show)
    with PageDropper() as dropper:
        models = build(*[StreamingSource(s, dropper, progress) if s is not None else None for s in sources])
    progress.close()
    return models
