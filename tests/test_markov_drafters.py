"""The two Markov-head drafters (DFlash v2's selector, DSpark's head) load and compile their head the same way: found
through the backbone's rt_info, compiled with the user's inference precision (f32 when none is asked)."""

from __future__ import annotations

import pytest

import ovbuild.runtime.speculation.drafters.markov as markov
from ovbuild.errors import ConfigError
from ovbuild.families import DFLASH2, DSPARK, build_draft_models, load_draft
from ovbuild.ir import core, save_ir
from ovbuild.runtime.speculation.drafters import DRAFTERS, LatticeDrafter
from ovbuild.weights.checkpoint import Checkpoint

WRITERS = {"dflash2": DFLASH2.tiny["dflash2"], "dspark": DSPARK.tiny["dspark_gated"]}


@pytest.fixture(scope="module")
def folders(tmp_path_factory, target):
    """Exported draft folders (backbone and Markov head) by family."""
    out = {}
    for family, write in WRITERS.items():
        root = tmp_path_factory.mktemp(family)
        cfg, weights = load_draft(Checkpoint.open(write(root / "ckpt")))
        for stem, model in build_draft_models(cfg, weights, target[1]).items():
            save_ir(model, root / "draft" / f"{stem}.xml")
        out[family] = root / "draft"
    return out


@pytest.fixture
def head_configs(monkeypatch):
    """The plugin config every Markov head is compiled with, in order."""
    seen = []
    real = core()

    class Recording:
        def compile_model(self, model, device, config):
            seen.append(dict(config))
            return real.compile_model(model, device, config)

    monkeypatch.setattr(markov, "core", lambda: Recording())
    return seen


@pytest.mark.parametrize("family", sorted(WRITERS))
@pytest.mark.parametrize("precision, expected", [(None, "f32"), ("bf16", "bf16"), ("f16", "f16")])
def test_the_head_runs_in_the_users_inference_precision(folders, head_configs, family, precision, expected):
    drafter = DRAFTERS[family].from_folder(folders[family], kv_cache_precision="f16", inference_precision=precision)
    assert drafter.head is not None and drafter.head_ir.family == family
    assert head_configs == [{"INFERENCE_PRECISION_HINT": expected}]


def test_a_v2_draft_without_its_selector_is_refused(folders):
    backbone = core().read_model(str(folders["dflash2"] / "openvino_model.xml"))
    with pytest.raises(ConfigError, match=r"openvino_markov_head_model\.xml"):
        LatticeDrafter(backbone, None)
