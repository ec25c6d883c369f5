"""Every declared draft family provides every part (checkpoint layouts, config class, a builder per IR format it has,
tiny checkpoints; from the runtime side a drafter and its options, from the testing side a numpy reference), and the
parts fit together: each tiny checkpoint is read
as the family's config, builds in each of its IR formats into IRs tagged with the family, its paged backbone agrees
with the family's reference, and the pipeline loads the family's drafter from the exported folder."""

from __future__ import annotations

import inspect
from dataclasses import replace

import numpy as np
import pytest

from ovbuild.export.ir_formats import IR_FORMATS
from ovbuild.families import DSPARK, FAMILIES, Family, build_draft_models, detect_layout, load_draft
from ovbuild.ir import save_ir
from ovbuild.ir.rt_info import get_rt_info
from ovbuild.runtime.model.paged_model import PagedModel
from ovbuild.runtime.pipeline import ModelOptions, RuntimeOptions, load_drafter
from ovbuild.runtime.speculation.drafters import (
    DRAFTER_OPTIONS,
    DRAFTERS,
    Drafter,
    DrafterOption,
    DraftItem,
    DSparkDrafter,
)
from ovbuild.testing import F32_NMSE
from ovbuild.testing.references import REFERENCES
from ovbuild.weights.checkpoint import Checkpoint
from ovbuild.weights.draft_config import DraftConfig

from paged_helpers import run_draft

KINDS = [(f, name) for f in FAMILIES for name in f.tiny]
F32_DRAFT = RuntimeOptions(draft=ModelOptions("f32", "f32", 64))


def missing_parts(family: Family, drafters: dict = DRAFTERS, references: dict = REFERENCES) -> list[str]:
    """The parts a declaration (with its drafter and reference registered by name) lacks or gets wrong."""
    missing = []
    if not family.layouts or not all(layout.architectures and layout.tensors for layout in family.layouts):
        missing.append("layouts")
    if not (isinstance(family.config, type) and issubclass(family.config, DraftConfig)):
        missing.append("config")
    formats_ok = "paged" in family.builders and set(family.builders) <= set(IR_FORMATS)
    if not (formats_ok and all(callable(b) for b in family.builders.values())):
        missing.append("builders")
    if not all(callable(getattr(references.get(family.name), m, None)) for m in ("new_cache", "forward", "step")):
        missing.append("reference")
    drafter = drafters.get(family.name)
    if not (isinstance(drafter, type) and issubclass(drafter, Drafter) and not inspect.isabstract(drafter)):
        missing.append("drafter")
    elif not all(takes_option(drafter, option) for option in drafter.OPTIONS):
        missing.append("drafter options")
    if not family.tiny:
        missing.append("tiny")
    return missing


def takes_option(drafter: type[Drafter], option: DrafterOption) -> bool:
    """The option is a keyword of the drafter's constructor, with the same default, a value of its type."""
    parameter = inspect.signature(drafter.__init__).parameters.get(option.name)
    choices_ok = option.choices is None or option.default in option.choices
    typed = isinstance(option.default, option.type)
    return parameter is not None and parameter.default == option.default and typed and choices_ok


@pytest.mark.parametrize("family", FAMILIES, ids=[f.name for f in FAMILIES])
def test_every_family_declares_every_part(family):
    assert missing_parts(family) == []


class _UnknownOption(DSparkDrafter):
    OPTIONS = (DrafterOption("beam_width", int, 4, "not a constructor keyword"),)


class _Abstract(Drafter):
    pass


@pytest.mark.parametrize(
    "part, change",
    [
        ("layouts", dict(layouts=())),
        ("config", dict(config=dict)),
        ("builders", dict(builders={})),
        ("builders", dict(builders={"genai": DSPARK.builders["paged"]})),  # no paged IRs: nothing to run
        ("builders", dict(builders={**DSPARK.builders, "onnx": DSPARK.builders["paged"]})),  # not an IR format
        ("reference", dict(references={**REFERENCES, "dspark": object})),
        ("reference", dict(references={})),
        ("drafter", dict(drafters={**DRAFTERS, "dspark": _Abstract})),
        ("drafter", dict(drafters={})),
        ("drafter options", dict(drafters={**DRAFTERS, "dspark": _UnknownOption})),
        ("tiny", dict(tiny={})),
    ],
)
def test_a_declaration_lacking_a_part_is_caught(part, change):
    registries = {k: change.pop(k) for k in ("drafters", "references") if k in change}
    assert missing_parts(replace(DSPARK, **change), **registries) == [part]


def test_every_drafter_and_reference_is_a_declared_family():
    assert set(DRAFTERS) == {f.name for f in FAMILIES}
    assert {f.name for f in FAMILIES} <= set(REFERENCES)


def test_names_are_unique_and_options_are_declared_alike():
    """Names key the IRs' rt_info, the tests' checkpoints and the CLI's flags: one owner each."""
    assert len({f.name for f in FAMILIES}) == len(FAMILIES)
    assert len({name for _, name in KINDS}) == len(KINDS)
    layouts = [layout for f in FAMILIES for layout in f.layouts]
    for i, a in enumerate(layouts):
        for b in layouts[i + 1 :]:
            shared = set(a.architectures) & set(b.architectures)
            assert not shared or a.matches is not b.matches, f"{shared} claimed twice without config markers"
    for option in DRAFTER_OPTIONS:
        same = [o for d in DRAFTERS.values() for o in d.OPTIONS if o.name == option.name]
        assert all(o == option for o in same), f"option {option.name} is declared differently by two drafters"


@pytest.fixture(scope="module", params=KINDS, ids=[name for _, name in KINDS])
def kind(request, tmp_path_factory):
    family, name = request.param
    return family, family.tiny[name](tmp_path_factory.mktemp(name) / "ckpt")


def test_tiny_checkpoint_reads_as_the_family_and_builds_in_each_of_its_formats(kind, target, tmp_path):
    family, folder = kind
    ckpt = Checkpoint.open(folder)
    assert detect_layout(ckpt.config, str(ckpt.config_path)) in family.layouts
    cfg, weights = load_draft(ckpt)
    assert type(cfg) is family.config and cfg.family == family.name
    for ir_format in family.builders:
        models = build_draft_models(cfg, weights, target[1], ir_format=ir_format)
        assert "openvino_model" in models
        assert {stem: get_rt_info(m, "ovbuild/family") for stem, m in models.items()} == dict.fromkeys(
            models, family.name
        )
        if ir_format == "paged":
            for stem, model in models.items():
                save_ir(model, tmp_path / "draft" / f"{stem}.xml")
            backbone = models["openvino_model"]

    # the declared reference and the declared paged builder agree (the parity tests go further, per family)
    block = [[40 + i] + [cfg.mask_token_id] * (cfg.block_size - 1) for i in range(3)]
    schedule = [[(0, 5, block[0]), (1, 9, block[1])], [(1, 2, block[2]), (0, 3, [])]]
    out = run_draft(
        PagedModel(backbone, kv_cache_precision="f32"), REFERENCES[family.name](cfg, weights, target[1]), schedule
    )
    assert out.nmse("logits") < F32_NMSE, f"{family.name} backbone logits NMSE {out.nmse('logits'):.2e}"

    # the pipeline finds the family's drafter through the IR's rt_info, and it proposes what it is asked for
    drafter = load_drafter(tmp_path / "draft", F32_DRAFT)
    assert type(drafter) is DRAFTERS[family.name]
    width = cfg.num_taps * cfg.target_hidden_size
    k = min(3, drafter.max_candidates)
    taps = np.random.default_rng(0).standard_normal((4, width)).astype(np.float32)
    (proposal,) = drafter.propose([DraftItem(0, taps, 17, k)])
    assert len(proposal) == k and all(0 <= t < cfg.vocab_size for t in proposal)


def test_drafts_and_targets_are_looked_up_alike():
    """One lookup for both: a family without the asked IR format, or an unknown family, gets one message shape that
    names the architecture, the families having the format and the formats the family has."""
    from types import SimpleNamespace

    from ovbuild.errors import UnsupportedError
    from ovbuild.families import draft_builder, family
    from ovbuild.targets import target_builder, target_family

    draft = SimpleNamespace(family="dflash2", architecture="DFlash2DraftModel")
    target = SimpleNamespace(family="qwen3_5", architecture="Qwen3_5ForCausalLM")
    expected = {
        "draft": r"^DFlash2DraftModel \(dflash2\): the genai IR format exists for dflash drafts only \(dflash2 drafts "
        r"export as: paged\)$",
        "target": r"^Qwen3_5ForCausalLM \(qwen3_5\): the genai IR format exists for qwen3 targets only \(qwen3_5 "
        r"targets export as: paged\)$",
    }
    with pytest.raises(UnsupportedError, match=expected["draft"]):
        draft_builder(draft, "genai")
    with pytest.raises(UnsupportedError, match=expected["target"]):
        target_builder(target, "genai")
    with pytest.raises(UnsupportedError, match=r"^unknown draft family 'eagle' \(known: dflash, dflash2, dspark\)$"):
        family("eagle")
    with pytest.raises(UnsupportedError, match=r"^unknown target family 'llama' \(known: qwen3, qwen3_5\)$"):
        target_family("llama")
