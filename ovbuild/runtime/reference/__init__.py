"""Numpy reference models of every graph ovbuild builds (ovbuild.families says which draft family uses which)."""

from ovbuild.runtime.reference.dflash import DFlashReference
from ovbuild.runtime.reference.dflash2 import DFlash2Reference
from ovbuild.runtime.reference.dspark import DSparkReference
from ovbuild.runtime.reference.qwen3 import Qwen3Reference

__all__ = ["DFlash2Reference", "DFlashReference", "DSparkReference", "Qwen3Reference"]
