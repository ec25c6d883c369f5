"""CLI subcommands: one module each, exposing `register(subparsers)` that sets `run` on its parser.

Adding a command is one module here plus its name in COMMANDS; a command whose module lives elsewhere in the package
(the demo is one module with its command) names it in COMMAND_MODULES.
"""

COMMANDS: tuple[str, ...] = ("export", "inspect", "generate", "serve", "demo")
COMMAND_MODULES: dict[str, str] = {"demo": "ovbuild.demo"}


def command_module(name: str) -> str:
    """The module that registers command `name`."""
    return COMMAND_MODULES.get(name, f"ovbuild.commands.{name}")
