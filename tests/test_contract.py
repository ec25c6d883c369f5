"""The IR contract: every exported IR reads back, through `ovbuild.ir`, what its checkpoint's config says; bad
or missing rt_info is an error naming the file and the key; no rt_info key is spelled outside the contract."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import ovbuild
from ovbuild.errors import ExportError
from ovbuild.export.api import export
from ovbuild.ir import (
    MARKOV_HEAD_STEM,
    MODEL_FILE,
    DFlash2Keys,
    DraftIR,
    DSparkKeys,
    HeadGeometry,
    Identity,
    MarkovHeadIR,
    Provenance,
    TargetIR,
    WeightStorage,
    read_ir,
)
from ovbuild.runtime.folders import exported_model
from ovbuild.runtime.speculation.drafters import DSparkDrafter
from ovbuild.testing import DSPARK_KINDS, TINY_DFLASH2, TINY_DRAFT, TINY_TARGET, write_tiny_dflash2, write_tiny_dspark

REPO = Path(ovbuild.__file__).parent.parent


@pytest.fixture(scope="module")
def folders(tmp_path_factory, tiny_target, tiny_draft):
    """Exported folders: the target in both forms, the DFlash draft in both forms, a v2 and a gated DSpark draft."""
    root = tmp_path_factory.mktemp("contract")
    v2 = write_tiny_dflash2(root / "ckpt_v2")
    dspark = write_tiny_dspark(root / "ckpt_dspark", "gated")
    return {
        "target": export(tiny_target, root / "target", draft_of=tiny_draft, quiet=True).out,
        "genai_target": export(tiny_target, root / "genai_target", format="genai", quiet=True).out,
        "draft": export(tiny_draft, root / "draft", target_model=tiny_target, weight_format="int8", quiet=True).out,
        "genai_draft": export(
            tiny_draft, root / "genai_draft", format="genai", weight_format="int4", group_size=16, quiet=True
        ).out,
        "v2": export(v2, root / "v2", target_model=tiny_target, quiet=True).out,
        "dspark": export(dspark, root / "dspark", target_model=tiny_target, quiet=True).out,
    }


def main_ir(folder: Path):
    path = folder / MODEL_FILE
    return read_ir(path), path


def test_targets_read_back_their_config(folders, tiny_target):
    model, path = main_ir(folders["target"])
    heads = HeadGeometry(TINY_TARGET["num_key_value_heads"], TINY_TARGET["head_dim"])
    assert TargetIR.from_model(model, path) == TargetIR(
        heads=heads,
        vocab_size=TINY_TARGET["vocab_size"],
        hidden_size=TINY_TARGET["hidden_size"],
        target_layer_ids=tuple(TINY_DRAFT["dflash_config"]["target_layer_ids"]),
        context_length=TINY_TARGET["max_position_embeddings"],
    )
    assert Identity.from_model(model).kind == "target" and Identity.from_model(model).family == "qwen3"
    assert Provenance.from_model(model) == Provenance(str(tiny_target.resolve()), "local", "paged")
    assert WeightStorage.from_model(model) == WeightStorage("keep")

    genai, path = main_ir(folders["genai_target"])
    info = TargetIR.from_model(genai, path)
    assert info.form == "genai" and info.target_layer_ids == () and info.context_length is None
    # a locator for every layer, each naming one node of the graph
    names = {op.get_friendly_name() for op in genai.get_ops()}
    assert sorted(info.hidden_state_locators) == list(range(TINY_TARGET["num_hidden_layers"]))
    assert set(info.hidden_state_locators.values()) <= names


def test_drafts_read_back_their_config(folders, tiny_draft):
    dflash = TINY_DRAFT["dflash_config"]
    model, path = main_ir(folders["draft"])
    info = DraftIR.from_model(model, path)
    assert info == DraftIR(
        family="dflash",
        heads=HeadGeometry(TINY_DRAFT["num_key_value_heads"], TINY_DRAFT["head_dim"]),
        block_size=dflash["block_size"],
        mask_token_id=dflash["mask_token_id"],
        target_layer_ids=tuple(dflash["target_layer_ids"]),
        candidate_offset=1,
        vocab_size=TINY_DRAFT["vocab_size"],
        hidden_size=TINY_DRAFT["hidden_size"],
        target_hidden_size=TINY_TARGET["hidden_size"],
    )
    assert WeightStorage.from_model(model) == WeightStorage("int8", sym=False, group_size=-1, all_layers=False)
    assert info.markov_head_file(folders["draft"]) is None

    genai, path = main_ir(folders["genai_draft"])
    assert DraftIR.from_model(genai, path) == DraftIR(**{**info.__dict__, "form": "genai"})
    assert WeightStorage.from_model(genai) == WeightStorage("int4")  # the GenAI form records the format alone


def test_markov_heads_are_named_by_their_backbone(folders):
    for name, head_type, forms in (("v2", "dflash2", ("lattice",)), ("dspark", "gated", ("chain", "lattice"))):
        model, path = main_ir(folders[name])
        backbone = DraftIR.from_model(model, path)
        assert backbone.markov_head_file(folders[name]) == folders[name] / f"{MARKOV_HEAD_STEM}.xml"
        head_model = read_ir(backbone.markov_head_file(folders[name]))
        head = MarkovHeadIR.from_model(head_model)
        assert (head.head_type, head.forms) == (head_type, forms)
        # the backbone takes the drafts' default int8, the head is never integer-compressed
        assert WeightStorage.from_model(model).weight_format == "int8"
        assert WeightStorage.from_model(head_model) == WeightStorage("keep")
    v2 = MarkovHeadIR.from_model(read_ir(folders["v2"] / f"{MARKOV_HEAD_STEM}.xml"))
    nested = TINY_DFLASH2["dflash_config"]
    assert (v2.rank, v2.top_k, v2.version) == (nested["selector_rank"], nested["selector_top_k"], 2)


def test_family_keys_read_back(folders):
    nested = TINY_DFLASH2["dflash_config"]
    v2 = DFlash2Keys.from_model(read_ir(folders["v2"] / MODEL_FILE))
    assert (v2.top_k, v2.selector_rank, v2.conv_kernel_size, v2.conv_group_size) == (
        nested["selector_top_k"],
        nested["selector_rank"],
        nested["conv_kernel_size"],
        nested["conv_group_size"],
    )
    assert v2.gpu_min_activations_scale_factor == 32
    gated = DSPARK_KINDS["gated"]
    keys = DSparkKeys(gated["markov_rank"], gated["markov_head_type"])
    assert DSparkKeys.from_model(read_ir(folders["dspark"] / MODEL_FILE)) == keys
    plain = read_ir(folders["draft"] / MODEL_FILE)
    assert DFlash2Keys.from_model(plain) is None and DSparkKeys.from_model(plain) is None


def edited(folder: Path, tmp_path: Path, pattern: str, replacement: str) -> Path:
    """A copy of the folder's main IR with one rt_info entry rewritten (or removed)."""
    copy = tmp_path / folder.name
    copy.mkdir()
    text, n = re.subn(pattern, replacement, (folder / MODEL_FILE).read_text())
    assert n == 1, pattern
    (copy / MODEL_FILE).write_text(text)
    (copy / "openvino_model.bin").write_bytes((folder / "openvino_model.bin").read_bytes())
    return copy


@pytest.mark.parametrize(
    "pattern, replacement, message",
    [
        (r'<block_size value="\d+" />', '<block_size value="eight" />', "rt_info 'dflash/block_size' = 'eight' is not"),
        (r'\s*<target_layer_ids value="[\d,]+" />', "", "no rt_info 'dflash/target_layer_ids'"),
        (r'<vocab_size value="\d+" />', '<vocab_size value="" />', None),  # empty: not recorded, as older exports
        (r'<num_kv_heads value="\d+" />', '<num_kv_heads value="2.5" />', "rt_info 'pa/num_kv_heads' = '2.5' is not"),
    ],
)
def test_bad_draft_rt_info_names_the_file_and_key(folders, tmp_path, pattern, replacement, message):
    folder = edited(folders["draft"], tmp_path, pattern, replacement)
    if message is None:
        assert exported_model(folder, read_ir(folder)).vocab_size == TINY_DRAFT["vocab_size"]  # from the logits' width
        return
    with pytest.raises(ExportError, match=re.escape(message)) as e:
        exported_model(folder, read_ir(folder))
    assert str(folder / MODEL_FILE) in str(e.value)


def test_a_markov_head_outside_the_folder_is_refused(folders, tmp_path):
    folder = edited(folders["dspark"], tmp_path, r'<markov_head value="[^"]*" />', '<markov_head value="../x" />')
    with pytest.raises(ExportError, match=re.escape("rt_info 'ovbuild/markov_head' = '../x' is not a file name")):
        DSparkDrafter.from_folder(folder)


def test_the_repo_names_no_path_outside_itself():
    outside = ".." + "/shared"  # spelled in two pieces so that this file does not match itself
    skip = {".git", ".venv", ".ci-venv", ".venv-train", "__pycache__", ".pytest_cache", ".ruff_cache"}
    found = []
    for path in sorted(REPO.rglob("*")):
        if skip & set(path.relative_to(REPO).parts) or not path.is_file() or path.suffix in (".safetensors", ".bin"):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        found += [f"{path.relative_to(REPO)}:{i}" for i, line in enumerate(text.splitlines(), 1) if outside in line]
    assert not found, found
