"""DraftFamily: how one draft architecture is recognized, configured and named."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ovbuild.weights.config_reader import ConfigReader
from ovbuild.weights.draft_config import DraftConfig


def _always(r: ConfigReader) -> bool:
    return True


@dataclass(frozen=True)
class DraftFamily:
    """One registry entry: architectures it claims, config parser and checkpoint tensor-name table."""

    name: str
    architectures: tuple[str, ...]
    parse: Callable[[ConfigReader], DraftConfig]
    tensors: Mapping[str, str]
    matches: Callable[[ConfigReader], bool] = _always  # extra config markers beyond the architecture
