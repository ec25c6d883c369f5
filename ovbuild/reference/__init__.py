"""Numpy reference models of every graph ovbuild builds (ovbuild.families says which draft family uses which)."""

from ovbuild.reference.dflash import DFlashReference
from ovbuild.reference.dflash2 import DFlash2Reference
from ovbuild.reference.dspark import DSparkReference
from ovbuild.reference.qwen3 import Qwen3Reference

__all__ = ["DFlash2Reference", "DFlashReference", "DSparkReference", "Qwen3Reference"]
