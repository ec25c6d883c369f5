"""The joint between building and running is ovbuild/ir/: every rt_info key and every port name is spelled there
and nowhere else in the package, each key once, and every record reads back what it writes."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import openvino as ov
import pytest

import ovbuild
from ovbuild.ir import (
    DFlash2Keys,
    DraftIR,
    DSparkKeys,
    HeadGeometry,
    HybridKeys,
    Identity,
    MarkovHeadIR,
    Provenance,
    TargetIR,
    VisionIR,
    WeightStorage,
    write_rt_info,
)
from ovbuild.ir import records as records_module
from ovbuild.ir.codec import Key
from ovbuild.ir.ports import PORTS

PACKAGE = Path(ovbuild.__file__).parent
JOINT = PACKAGE / "ir"


def string_constants(source: str):
    """Every string literal of a module's source (f-string pieces included), docstrings left out."""
    tree = ast.parse(source)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node.lineno, node.value


# rt_info keys: slash paths under the records' namespaces, and GenAI's top-level keys.
RT_INFO_KEY = re.compile(r"^(ovbuild|dflash|pa|runtime_options)/\w+$|^(dflash_mode|hidden_states_decoder_layers)$")
PORT_NAMES = {str(p) for p in PORTS}


def is_port_literal(value: str) -> bool:
    """A port's name, or the name of a per-layer port's layer (`key_cache.3`) or its prefix."""
    return value in PORT_NAMES or any(p.per_layer and value.startswith(p) for p in PORTS)


def literals_outside_the_joint(sources: dict[str, str], match) -> list[str]:
    """`file:line: value` of every string literal `match` accepts, in modules outside ovbuild/ir/."""
    return [
        f"{name}:{line}: {value!r}"
        for name, source in sources.items()
        if not name.startswith("ir/")
        for line, value in string_constants(source)
        if match(value)
    ]


@pytest.fixture(scope="module")
def package_sources() -> dict[str, str]:
    return {str(p.relative_to(PACKAGE)): p.read_text(encoding="utf-8") for p in sorted(PACKAGE.rglob("*.py"))}


def test_no_rt_info_key_is_spelled_outside_the_joint(package_sources):
    found = literals_outside_the_joint(package_sources, RT_INFO_KEY.match)
    assert not found, "\n".join(found)


def test_no_port_name_is_spelled_outside_the_joint(package_sources):
    found = literals_outside_the_joint(package_sources, is_port_literal)
    assert not found, "\n".join(found)


def test_the_checks_catch_a_planted_literal():
    planted = {
        "runtime/x.py": '"""A docstring may say logits_indices."""\nFEEDS = {"logits_indices": 0}\n',
        "graph/y.py": 'NAME = f"conv_state.{3}"\nKEY = "ovbuild/vocab_size"\n',
        "ir/ports.py": 'LOGITS_INDICES = "logits_indices"\n',  # the joint itself may spell them
    }
    assert literals_outside_the_joint(planted, is_port_literal) == [
        "runtime/x.py:2: 'logits_indices'",
        "graph/y.py:1: 'conv_state.'",
    ]
    assert literals_outside_the_joint(planted, RT_INFO_KEY.match) == ["graph/y.py:2: 'ovbuild/vocab_size'"]


def test_every_key_is_declared_once():
    """Each key path is spelled in one Key(...) of the records' table; other modules of the joint spell none."""
    tree = ast.parse((JOINT / "records.py").read_text())
    spelled = [
        node.args[0].value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", None) == "Key"
        and isinstance(node.args[0], ast.Constant)
    ]
    assert len(spelled) == len(set(spelled)), sorted(v for v in spelled if spelled.count(v) > 1)
    assert {k.path for k in vars(records_module).values() if isinstance(k, Key)} == set(spelled)
    for name in ("codec.py", "files.py", "ports.py", "rt_info.py", "__init__.py"):
        assert not [v for _, v in string_constants((JOINT / name).read_text()) if RT_INFO_KEY.match(v)], name


RECORDS = [
    Identity("draft", "dspark"),
    HeadGeometry(2, 16),
    WeightStorage("int4", sym=True, group_size=16, all_layers=False),
    WeightStorage("keep"),
    Provenance("/ckpt", "local", "paged", "/target", "abc"),
    Provenance("Qwen/Qwen3-8B", "0123", "genai"),
    TargetIR(HeadGeometry(2, 16), 100, 64, (1, 3), 4096),
    TargetIR(HeadGeometry(2, 16), 100, 64, form="genai", hidden_state_locators={0: "layers.0/out", 1: "norm"}),
    DraftIR("dflash2", HeadGeometry(2, 16), 8, 99, (1, 3), 2, 100, 64, 48, markov_head="openvino_markov_head_model"),
    DraftIR("dflash", None, 16, 5, (0,), form="genai"),
    DFlash2Keys(4, 8, 3, 2, 1.5, 0.25, 30.0),
    HybridKeys(("linear_attention", "full_attention"), "LF", (0,), 96, 4, 4, 16, 16),
    DSparkKeys(0),
    DSparkKeys(8, "gated"),
    MarkovHeadIR("dspark", "gated", 8, 100, 64, ("chain", "lattice"), 4, 8),
    MarkovHeadIR("dflash2", "dflash2", 8, 100, 64, top_k=4, version=2),
    VisionIR("minicpmv4_7_vision", 27, 1152, 16, 3, 14, 4900, 2048, 16, 4, downsample_mode="16x"),
    VisionIR("qwen3_5_vision", 27, 1152, 16, 3, 16, 2304, 3584, 4, 2, temporal_patch_size=2),
]


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_every_record_reads_back_what_it_writes(record):
    model = ov.Model([], [], "m")
    write_rt_info(model, record)
    assert type(record).from_model(model) == record


def test_records_of_other_kinds_read_as_absent():
    model = ov.Model([], [], "m")
    write_rt_info(model, TargetIR(HeadGeometry(2, 16), 100, 64, (1,), 64))
    assert DFlash2Keys.from_model(model) is None and DSparkKeys.from_model(model) is None
    assert HybridKeys.from_model(model) is None
    assert dataclasses.asdict(Identity.from_model(model))["kind"] == "target"


def test_older_exports_form_key_reads_as_the_ir_format():
    """GenAI IRs once recorded their format under `ovbuild/form` (the builders') next to the export's
    `ovbuild/ir_format`; now both write the one key, and an IR carrying only the old one still reads as GenAI."""
    model = ov.Model([], [], "m")
    write_rt_info(model, TargetIR(HeadGeometry(2, 16), 100, 64))
    assert TargetIR.from_model(model).form == "paged"
    model.set_rt_info("genai", ["ovbuild", "form"])
    assert TargetIR.from_model(model).form == "genai"
    fresh = ov.Model([], [], "m")
    write_rt_info(fresh, TargetIR(HeadGeometry(2, 16), 100, 64, form="genai"), Provenance("/c", "local", "genai"))
    assert Provenance.from_model(fresh).ir_format == "genai" and TargetIR.from_model(fresh).form == "genai"
