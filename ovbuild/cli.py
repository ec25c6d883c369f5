"""The `ovbuild` command line."""

from __future__ import annotations

import argparse
import importlib
import sys

from ovbuild import __version__
from ovbuild.commands import COMMANDS
from ovbuild.errors import OvbuildError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ovbuild",
        description="OpenVINO graphs for DFlash-family speculative-decoding drafts, built from safetensors "
        "without PyTorch or tracing.",
    )
    parser.add_argument("--version", action="version", version=f"ovbuild {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"ovbuild.commands.{name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script; errors ovbuild raises on purpose become one line on stderr, exit 2."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 0
    try:
        return args.run(args) or 0
    except OvbuildError as e:
        print(f"ovbuild: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
