"""`ovbuild export -m MODEL OUT`: a target or draft checkpoint to a complete IR folder."""

from __future__ import annotations

import argparse

from ovbuild.errors import ConfigError
from ovbuild.export import export
from ovbuild.export.ir_formats import IR_FORMATS
from ovbuild.export.progress import human_size, on_terminal, stderr_logging
from ovbuild.export.weight_formats import WEIGHT_FORMATS, default_weight_format
from ovbuild.ir import VISION_FILE


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "export",
        help="export a target or draft checkpoint to OpenVINO IR",
        description="Export a Qwen3 target or a DFlash-family draft (family detected from config.json; no code from "
        "the checkpoint is ever run) to a folder of OpenVINO IRs, configs and, for a target, its tokenizer.",
    )
    p.add_argument("-m", "--model", required=True, help="hub id (org/name) or local checkpoint folder")
    p.add_argument("out", help="output folder (written elsewhere first, moved into place when complete)")
    p.add_argument("--target-model", help="drafts: the target (hub id or folder) whose embedding and lm_head they use")
    taps = p.add_mutually_exclusive_group()
    taps.add_argument("--target-layer-ids", help="targets: layers to export as hidden_states, e.g. 1,9,17,25,33")
    taps.add_argument("--draft-of", metavar="DRAFT", help="targets: take the taps from this draft's config")
    p.add_argument(
        "--weight-format",
        choices=WEIGHT_FORMATS,
        help=f"keep = checkpoint precision (default: targets {default_weight_format('target')}, drafts "
        f"{default_weight_format('draft')})",
    )
    p.add_argument("--sym", action="store_true", default=None, help="int8/int4: symmetric quantization")
    p.add_argument("--group-size", type=int, help="int4: quantization group size")
    p.add_argument("--all-layers", action="store_true", default=None, help="also compress embedding and lm_head")
    p.add_argument("--revision", help="hub revision of MODEL (branch, tag or commit)")
    p.add_argument("--cache-dir", help="Hugging Face cache folder")
    p.add_argument("--format", default="paged", choices=list(IR_FORMATS), help="IR format (default: paged)")
    p.add_argument(
        "--no-vision",
        dest="vision",
        action="store_false",
        help=f"vision-language targets: leave the vision tower out (no {VISION_FILE}) and build the language model "
        "without its image inputs",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing OUT")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar, no log lines, no summary")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    with stderr_logging(verbose=not args.quiet and on_terminal()):
        result = export(
            args.model,
            args.out,
            target_model=args.target_model,
            weight_format=args.weight_format,
            sym=args.sym,
            group_size=args.group_size,
            all_layers=args.all_layers,
            revision=args.revision,
            cache_dir=args.cache_dir,
            target_layer_ids=parse_ids(args.target_layer_ids, "--target-layer-ids"),
            draft_of=args.draft_of,
            overwrite=args.overwrite,
            quiet=args.quiet,
            format=args.format,
            vision=args.vision,
        )
    if not args.quiet:
        print(f"exported {result.kind} ({result.family}, {result.weight_format} weights) to {result.out}")
        for name, size in result.files.items():
            print(f"  {name:<32} {human_size(size):>10}")
    return 0


def parse_ids(text: str | None, option: str) -> tuple[int, ...] | None:
    """ "1,9,17" -> (1, 9, 17)."""
    if text is None:
        return None
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError as e:
        raise ConfigError(f"{option} must be comma-separated layer indices, got {text!r}") from e
