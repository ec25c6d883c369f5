"""Every declared target family provides every part (checkpoint layouts, config class, a builder per IR format it
has, the state ports of its paged IR, tiny checkpoints; from the testing side a numpy reference), the architecture
list is derived from the declarations, and each tiny checkpoint reads as its family and builds in each of its
formats into IRs tagged with the family and carrying exactly the declared state inputs."""

from __future__ import annotations

import pytest

from ovbuild.errors import UnsupportedError
from ovbuild.export.ir_formats import IR_FORMATS
from ovbuild.ir import MODEL_STEM, Identity
from ovbuild.ir.ports import STATES
from ovbuild.targets import (
    REFUSED,
    TARGET_ARCHITECTURES,
    TARGETS,
    TargetFamily,
    build_target_models,
    load_target,
    parse_target_config,
)
from ovbuild.testing.references import REFERENCES
from ovbuild.weights.checkpoint import Checkpoint
from ovbuild.weights.target import TargetConfig

KINDS = [(f, name) for f in TARGETS for name in f.tiny]


def missing_parts(family: TargetFamily) -> list[str]:
    missing = []
    if not family.layouts or not all(layout.architectures for layout in family.layouts):
        missing.append("layouts")
    if not (isinstance(family.config, type) and issubclass(family.config, TargetConfig)):
        missing.append("config")
    if "paged" not in family.builders or not set(family.builders) <= set(IR_FORMATS):
        missing.append("builders")
    if not set(family.states) <= set(STATES):
        missing.append("states")
    if not family.tiny:
        missing.append("tiny")
    if not callable(getattr(REFERENCES.get(family.name), "forward", None)):
        missing.append("reference")
    return missing


@pytest.mark.parametrize("family", TARGETS, ids=[f.name for f in TARGETS])
def test_every_target_family_declares_every_part(family):
    assert missing_parts(family) == []


def test_one_architecture_list():
    claimed = [a for f in TARGETS for layout in f.layouts for a in layout.architectures]
    assert len(claimed) == len(set(claimed)), "an architecture claimed by two layouts"
    assert set(TARGET_ARCHITECTURES) == set(claimed) | set(REFUSED) and not set(claimed) & set(REFUSED)


@pytest.mark.parametrize("arch", sorted(REFUSED))
def test_refused_architectures_say_why(arch):
    with pytest.raises(UnsupportedError, match="not supported"):
        parse_target_config({"architectures": [arch]}, "c.json")


@pytest.mark.parametrize("kind", KINDS, ids=[name for _, name in KINDS])
def test_tiny_target_reads_as_its_family_and_builds_in_each_of_its_formats(kind, tmp_path):
    family, name = kind
    cfg, weights = load_target(Checkpoint.open(family.tiny[name](tmp_path / name)))
    assert type(cfg) is family.config and cfg.family == family.name
    for ir_format in IR_FORMATS:
        if ir_format not in family.builders:
            with pytest.raises(UnsupportedError, match=f"the {ir_format} IR format exists for"):
                build_target_models(cfg, weights, (), ir_format=ir_format)
            continue
        models = build_target_models(cfg, weights, (0,) if ir_format == "paged" else (), ir_format=ir_format)
        model = models[MODEL_STEM]
        assert Identity.from_model(model).family == family.name
        if ir_format == "paged":
            states = {p.get_any_name() for p in model.inputs if any(s.matches(p.get_any_name()) for s in STATES)}
            declared = {s for s in family.states for p in states if s.matches(p)}
            assert declared == set(family.states) and (not family.states) == (not states)
