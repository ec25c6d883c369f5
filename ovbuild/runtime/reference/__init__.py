"""Numpy reference models of every graph ovbuild builds, by family."""

from ovbuild.runtime.reference.dflash import DFlashReference
from ovbuild.runtime.reference.qwen3 import Qwen3Reference

DRAFT_REFERENCES = {"dflash": DFlashReference}

__all__ = ["DRAFT_REFERENCES", "DFlashReference", "Qwen3Reference"]
