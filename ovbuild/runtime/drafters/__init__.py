"""Drafters by family: how each draft family turns its IR outputs into proposals."""

from __future__ import annotations

from ovbuild.runtime.drafters.base import Drafter, DraftItem
from ovbuild.runtime.drafters.block import BlockDrafter
from ovbuild.runtime.drafters.dspark import DSparkDrafter

DRAFTERS: dict[str, type[Drafter]] = {"dflash": BlockDrafter, "dspark": DSparkDrafter}

__all__ = ["DRAFTERS", "BlockDrafter", "DSparkDrafter", "DraftItem", "Drafter"]
