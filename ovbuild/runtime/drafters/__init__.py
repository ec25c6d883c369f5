"""Drafters by family: how each draft family turns its IR outputs into proposals."""

from __future__ import annotations

from ovbuild.runtime.drafters.base import Drafter, DraftItem, Proposal
from ovbuild.runtime.drafters.block import BlockDrafter
from ovbuild.runtime.drafters.dspark import DSparkDrafter
from ovbuild.runtime.drafters.lattice import LatticeDrafter

DRAFTERS: dict[str, type[Drafter]] = {"dflash": BlockDrafter, "dflash2": LatticeDrafter, "dspark": DSparkDrafter}

__all__ = ["DRAFTERS", "BlockDrafter", "DSparkDrafter", "DraftItem", "Drafter", "LatticeDrafter", "Proposal"]
