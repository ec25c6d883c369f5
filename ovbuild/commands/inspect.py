"""`ovbuild inspect DIR`: what an exported folder holds, and a check that every IR reads and compiles."""

from __future__ import annotations

import argparse

from ovbuild.export.inspection import format_report, inspect_folder


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "inspect",
        help="describe an exported folder and check that it loads",
        description="Print the family, kind, inputs and outputs, rt_info, weight storage and file sizes of an "
        "exported folder, and check that every IR reads and compiles (exit 2 if one does not).",
    )
    p.add_argument("dir", help="exported folder")
    p.add_argument("--device", default="CPU", help="device to compile on (default: CPU)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    print(format_report(inspect_folder(args.dir, args.device)))
    return 0
