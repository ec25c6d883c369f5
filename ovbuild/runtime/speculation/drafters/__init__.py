"""The runtime side of each draft family: its drafter plug-in (how its IR outputs become proposals), found by the
family name its IRs record (`ovbuild/family`). The build side of a family (checkpoint layouts, config, builders) is
declared in ovbuild.families, which the runtime never imports."""

from __future__ import annotations

from ovbuild.runtime.speculation.drafters.base import Drafter, DrafterOption, DraftItem, Proposal
from ovbuild.runtime.speculation.drafters.block import BlockDrafter
from ovbuild.runtime.speculation.drafters.dspark import DSparkDrafter
from ovbuild.runtime.speculation.drafters.lattice import LatticeDrafter

DRAFTERS: dict[str, type[Drafter]] = {"dflash": BlockDrafter, "dflash2": LatticeDrafter, "dspark": DSparkDrafter}
# Every drafter option once: families whose drafters share an option name declare it alike (tested).
DRAFTER_OPTIONS: tuple[DrafterOption, ...] = tuple({o.name: o for d in DRAFTERS.values() for o in d.OPTIONS}.values())

__all__ = [
    "DRAFTERS",
    "DRAFTER_OPTIONS",
    "BlockDrafter",
    "DSparkDrafter",
    "DraftItem",
    "Drafter",
    "DrafterOption",
    "LatticeDrafter",
    "Proposal",
]
