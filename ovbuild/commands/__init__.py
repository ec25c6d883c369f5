"""CLI subcommands: one module each, exposing `register(subparsers)` that sets `run` on its parser.

Adding a command is one module here plus its name in COMMANDS.
"""

COMMANDS: tuple[str, ...] = ("export", "inspect", "generate", "serve", "demo")
