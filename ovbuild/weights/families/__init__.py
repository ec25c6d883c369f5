"""Draft family registry: detection from config.json, normalized config and tensor-name table per family.

Adding a family is one module here exporting FAMILY, plus its line in FAMILIES (see docs/adding_a_model.md).
"""

from __future__ import annotations

from ovbuild.errors import UnsupportedError
from ovbuild.weights.checkpoint import Checkpoint
from ovbuild.weights.config_reader import ConfigReader
from ovbuild.weights.draft_config import DraftConfig
from ovbuild.weights.families import dflash, dflash2, dspark
from ovbuild.weights.families.base import DraftFamily
from ovbuild.weights.tensor_names import WeightSource

# Order matters only where two families share an architecture name; `matches` then decides.
FAMILIES: tuple[DraftFamily, ...] = (dflash.FAMILY, dflash.MUSE_GLIMMER, dflash2.FAMILY, dspark.FAMILY)


def detect_family(config: dict, path: str) -> DraftFamily:
    """The family of a draft config: `architectures[0]` first, then each family's config markers."""
    r = ConfigReader(config, path)
    arch = r.architecture()
    for family in FAMILIES:
        if arch in family.architectures and family.matches(r):
            return family
    known = sorted({a for f in FAMILIES for a in f.architectures})
    raise UnsupportedError(
        f"{r.where('architectures')}: unknown draft architecture {arch!r} (supported: {', '.join(known)})"
    )


def load_draft(checkpoint: Checkpoint) -> tuple[DraftConfig, WeightSource]:
    """Normalized config and tensor source of a draft checkpoint."""
    family = detect_family(checkpoint.config, str(checkpoint.config_path))
    config = family.parse(ConfigReader(checkpoint.config, str(checkpoint.config_path)))
    return config, WeightSource(checkpoint, family.tensors)
