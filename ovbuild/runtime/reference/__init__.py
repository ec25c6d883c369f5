"""Numpy reference models of every graph ovbuild builds, by family."""

from ovbuild.runtime.reference.dflash import DFlashReference
from ovbuild.runtime.reference.dspark import DSparkReference
from ovbuild.runtime.reference.qwen3 import Qwen3Reference

DRAFT_REFERENCES = {"dflash": DFlashReference, "dspark": DSparkReference}

__all__ = ["DRAFT_REFERENCES", "DFlashReference", "DSparkReference", "Qwen3Reference"]
