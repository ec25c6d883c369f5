"""Draft builders by family: each returns every IR of a draft folder, keyed by file stem."""

from __future__ import annotations

from collections.abc import Callable

import openvino as ov

from ovbuild.errors import UnsupportedError
from ovbuild.graph import dflash, dflash2, dspark_lattice
from ovbuild.graph.weights import WeightPolicy
from ovbuild.weights.draft_config import DraftConfig
from ovbuild.weights.tensor_names import WeightSource

DraftBuilder = Callable[[DraftConfig, WeightSource, WeightSource, WeightPolicy], dict[str, ov.Model]]


def _dflash(cfg: DraftConfig, draft: WeightSource, target: WeightSource, policy: WeightPolicy) -> dict[str, ov.Model]:
    return {"openvino_model": dflash.build_dflash_draft(cfg, draft, target, policy)}


DRAFT_BUILDERS: dict[str, DraftBuilder] = {
    "dflash": _dflash,
    "dflash2": dflash2.build_dflash2_models,
    "dspark": dspark_lattice.build_dspark_models,
}


def build_draft_models(
    cfg: DraftConfig, draft: WeightSource, target: WeightSource, policy: WeightPolicy | None = None
) -> dict[str, ov.Model]:
    """All IRs of a draft (backbone, plus a Markov head where the family has one), keyed by file stem."""
    if cfg.family not in DRAFT_BUILDERS:
        raise UnsupportedError(f"no graph builder for draft family '{cfg.family}'")
    return DRAFT_BUILDERS[cfg.family](cfg, draft, target, policy or WeightPolicy())
