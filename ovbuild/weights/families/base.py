"""CheckpointLayout: how one draft checkpoint layout is recognized, configured and named; detection among layouts."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from ovbuild.errors import UnsupportedError
from ovbuild.weights.config_reader import ConfigReader
from ovbuild.weights.draft_config import DraftConfig


def _always(r: ConfigReader) -> bool:
    return True


@dataclass(frozen=True)
class CheckpointLayout:
    """Architecture names a layout claims, its config parser and its checkpoint tensor-name table."""

    architectures: tuple[str, ...]
    parse: Callable[[ConfigReader], DraftConfig]
    tensors: Mapping[str, str]
    matches: Callable[[ConfigReader], bool] = _always  # extra config markers beyond the architecture


def find_layout(r: ConfigReader, layouts: Iterable[CheckpointLayout]) -> CheckpointLayout:
    """The first of `layouts` claiming the config's `architectures[0]` whose markers match (order decides only where
    two layouts share an architecture name)."""
    layouts = tuple(layouts)
    arch = r.architecture()
    for layout in layouts:
        if arch in layout.architectures and layout.matches(r):
            return layout
    known = sorted({a for layout in layouts for a in layout.architectures})
    raise UnsupportedError(
        f"{r.where('architectures')}: unknown draft architecture {arch!r} (supported: {', '.join(known)})"
    )
