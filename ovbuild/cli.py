"""The `ovbuild` command line."""

from __future__ import annotations

import argparse
import importlib
import signal
import sys

from ovbuild import __version__
from ovbuild.commands import COMMANDS, command_module
from ovbuild.errors import OvbuildError
from ovbuild.signals import Terminated, sigterm_raises


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ovbuild",
        description="OpenVINO graphs for DFlash-family speculative-decoding drafts, built from safetensors "
        "without PyTorch or tracing.",
    )
    parser.add_argument("--version", action="version", version=f"ovbuild {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(command_module(name)).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script: errors ovbuild raises on purpose become one line on stderr and exit 2;
    Ctrl-C exits 130 and SIGTERM 143, each with one line, after the command has cleaned up after itself."""
    try:
        with sigterm_raises():
            parser = build_parser()
            args = parser.parse_args(argv)
            if not getattr(args, "run", None):
                parser.print_help()
                return 0
            return args.run(args) or 0
    except OvbuildError as e:
        print(f"ovbuild: error: {one_line(str(e))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ovbuild: interrupted", file=sys.stderr)
        return 128 + signal.SIGINT
    except Terminated:
        print("ovbuild: terminated", file=sys.stderr)
        return 128 + signal.SIGTERM


def one_line(message: str) -> str:
    """A message as one line: names read from a file (tensor names, keys) may hold line breaks."""
    return message.replace("\r", "\\r").replace("\n", "\\n")


if __name__ == "__main__":
    sys.exit(main())
