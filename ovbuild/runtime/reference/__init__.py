"""Numpy reference models of every graph ovbuild builds, by family."""

from ovbuild.runtime.reference.dflash import DFlashReference
from ovbuild.runtime.reference.dflash2 import DFlash2Reference
from ovbuild.runtime.reference.dspark import DSparkReference
from ovbuild.runtime.reference.qwen3 import Qwen3Reference

DRAFT_REFERENCES = {"dflash": DFlashReference, "dflash2": DFlash2Reference, "dspark": DSparkReference}

__all__ = ["DRAFT_REFERENCES", "DFlash2Reference", "DFlashReference", "DSparkReference", "Qwen3Reference"]
