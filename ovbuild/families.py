"""Draft families, each declared once with every part ovbuild needs of it; every per-family table derives from here.

This is the build side of a family: checkpoint layouts and config (`weights/families/`), graph builders per IR
format (`graph/`) and tiny checkpoints (`testing/`). Its runtime side is its drafter plug-in, registered by family
name in `ovbuild.runtime.speculation.drafters` (the runtime never imports this module), and its numpy reference is
registered with it from the testing side (`ovbuild.testing.references`). `tests/test_families.py` checks that every
family provides every part; adding one: docs/adding_a_model.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Protocol, TypeVar

import openvino as ov

from ovbuild.errors import UnsupportedError
from ovbuild.graph.dflash import build_dflash_models
from ovbuild.graph.dflash2 import build_dflash2_models
from ovbuild.graph.dspark import build_dspark_models
from ovbuild.graph.genai.draft import build_genai_draft
from ovbuild.graph.weights import WeightPolicy
from ovbuild.ir import MODEL_STEM
from ovbuild.testing.tiny import write_tiny_dflash
from ovbuild.testing.tiny_dflash2 import write_tiny_dflash2
from ovbuild.testing.tiny_dspark import DSPARK_KINDS, write_tiny_dspark
from ovbuild.weights.checkpoint import Checkpoint
from ovbuild.weights.config_reader import ConfigReader
from ovbuild.weights.draft_config import DraftConfig
from ovbuild.weights.families.base import CheckpointLayout, find_layout
from ovbuild.weights.families.dflash import LAYOUT as DFLASH_LAYOUT
from ovbuild.weights.families.dflash import MUSE_GLIMMER
from ovbuild.weights.families.dflash2 import LAYOUT as DFLASH2_LAYOUT
from ovbuild.weights.families.dflash2 import DFlash2Config
from ovbuild.weights.families.dspark import LAYOUT as DSPARK_LAYOUT
from ovbuild.weights.families.dspark import DSparkConfig
from ovbuild.weights.target import TargetConfig
from ovbuild.weights.tensor_names import WeightSource

# Every IR of a draft folder keyed by file stem (MODEL_STEM, MARKOV_HEAD_STEM of ovbuild.ir). The target source
# is None when the draft carries its own embedding and lm_head, or the IR format does not embed the target's.
DraftBuilder = Callable[[DraftConfig, WeightSource, WeightSource | None, WeightPolicy], dict[str, ov.Model]]


class FamilyDeclaration(Protocol):
    """What the lookups below read of a draft or target family: its name and its builders per IR format."""

    name: str
    builders: Mapping[str, Callable]


Declared = TypeVar("Declared", bound=FamilyDeclaration)


@dataclass(frozen=True)
class Family:
    """One draft family, build side: how its checkpoints are read, built in each IR format and faked."""

    name: str  # DraftConfig.family and the IRs' `ovbuild/family`
    layouts: tuple[CheckpointLayout, ...]  # the checkpoint layouts it reads (architecture names, parser, names)
    config: type[DraftConfig]  # the class its parser returns
    builders: Mapping[str, DraftBuilder]  # IR format (export.ir_formats.IR_FORMATS) -> the folder's IRs
    tiny: Mapping[str, Callable[[Path], Path]]  # tiny checkpoint writers by name, one per published kind


def _genai_draft(
    cfg: DraftConfig, draft: WeightSource, target: WeightSource | None, policy: WeightPolicy
) -> dict[str, ov.Model]:
    return {MODEL_STEM: build_genai_draft(cfg, draft, policy)}


DFLASH = Family(
    name="dflash",
    layouts=(DFLASH_LAYOUT, MUSE_GLIMMER),
    config=DraftConfig,
    builders={"paged": build_dflash_models, "genai": _genai_draft},
    tiny={"dflash": write_tiny_dflash},
)
DFLASH2 = Family(
    name="dflash2",
    layouts=(DFLASH2_LAYOUT,),
    config=DFlash2Config,
    builders={"paged": build_dflash2_models},
    tiny={"dflash2": write_tiny_dflash2},
)
DSPARK = Family(
    name="dspark",  # DSpark and DeepSpec DFlash (markov_rank 0) drafts: one architecture
    layouts=(DSPARK_LAYOUT,),
    config=DSparkConfig,
    builders={"paged": build_dspark_models},
    tiny={f"dspark_{kind}": partial(write_tiny_dspark, kind=kind) for kind in DSPARK_KINDS},
)

# Detection tries layouts in this order; it matters only where two layouts share an architecture name.
FAMILIES: tuple[Family, ...] = (DFLASH, DFLASH2, DSPARK)

# Derived tables.
BY_NAME: dict[str, Family] = {f.name: f for f in FAMILIES}
LAYOUTS: tuple[CheckpointLayout, ...] = tuple(layout for f in FAMILIES for layout in f.layouts)
DRAFT_ARCHITECTURES: tuple[str, ...] = tuple(sorted({a for layout in LAYOUTS for a in layout.architectures}))


def declared_family(kind: str, families: Sequence[Declared], name: str) -> Declared:
    """The family of `families` (drafts' or targets', `kind` "draft" or "target") declared as `name` (a config's
    family, an IR's `ovbuild/family`)."""
    for f in families:
        if f.name == name:
            return f
    raise UnsupportedError(f"unknown {kind} family '{name}' (known: {', '.join(f.name for f in families)})")


def family_builder(
    kind: str, families: Sequence[Declared], cfg: DraftConfig | TargetConfig, ir_format: str
) -> Callable[..., dict[str, ov.Model]]:
    """The builder of `cfg`'s IRs in `ir_format`, from the family of `families` it declares; an error naming its
    architecture when that family does not have the format (one lookup for drafts and targets)."""
    f = declared_family(kind, families, cfg.family)
    if ir_format not in f.builders:
        having = [g.name for g in families if ir_format in g.builders]
        raise UnsupportedError(
            f"{cfg.architecture} ({f.name}): the {ir_format} IR format exists for {', '.join(having)} {kind}s only "
            f"({f.name} {kind}s export as: {', '.join(f.builders)})"
        )
    return f.builders[ir_format]


def family(name: str) -> Family:
    """The draft family declared as `name` (a DraftConfig's family, an IR's `ovbuild/family`)."""
    return declared_family("draft", FAMILIES, name)


def detect_layout(config: dict, path: str) -> CheckpointLayout:
    """The checkpoint layout of a draft's config.json (read from `path`): `architectures[0]`, then its markers."""
    return find_layout(ConfigReader(config, path), LAYOUTS)


def read_draft_config(config: dict, path: str) -> tuple[DraftConfig, CheckpointLayout]:
    """The normalized config of a draft's config.json (read from `path`) and the checkpoint layout it was read by."""
    layout = detect_layout(config, path)
    return layout.parse(ConfigReader(config, path)), layout


def load_draft(checkpoint: Checkpoint) -> tuple[DraftConfig, WeightSource]:
    """Normalized config and tensor source of a draft checkpoint."""
    cfg, layout = read_draft_config(checkpoint.config, str(checkpoint.config_path))
    return cfg, WeightSource(checkpoint, layout.tensors)


def draft_builder(cfg: DraftConfig, ir_format: str = "paged") -> DraftBuilder:
    """The builder of a draft's IRs in `ir_format`; an error when its family does not have that format."""
    return family_builder("draft", FAMILIES, cfg, ir_format)


def build_draft_models(
    cfg: DraftConfig,
    draft: WeightSource,
    target: WeightSource | None,
    policy: WeightPolicy | None = None,
    ir_format: str = "paged",
) -> dict[str, ov.Model]:
    """All IRs of a draft in `ir_format` (backbone, plus a Markov head where the family has one), keyed by file stem."""
    return draft_builder(cfg, ir_format)(cfg, draft, target, policy or WeightPolicy())
