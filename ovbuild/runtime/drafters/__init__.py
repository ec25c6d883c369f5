"""Drafters by family: how each draft family turns its IR outputs into proposals (ovbuild.families says which family
uses which)."""

from __future__ import annotations

from ovbuild.runtime.drafters.base import Drafter, DrafterOption, DraftItem, Proposal
from ovbuild.runtime.drafters.block import BlockDrafter
from ovbuild.runtime.drafters.dspark import DSparkDrafter
from ovbuild.runtime.drafters.lattice import LatticeDrafter

__all__ = ["BlockDrafter", "DSparkDrafter", "DraftItem", "Drafter", "DrafterOption", "LatticeDrafter", "Proposal"]
