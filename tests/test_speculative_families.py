"""Every registered draft family decodes losslessly through the same scheduler, with its own drafter plug-in."""

from __future__ import annotations

import numpy as np
import pytest

from ovbuild.graph.ir import save_ir
from ovbuild.graph.registry import build_draft_models
from ovbuild.graph.target import build_target
from ovbuild.runtime.drafters import DRAFTERS
from ovbuild.runtime.paged_model import PagedModel
from ovbuild.runtime.request import GenerationConfig
from ovbuild.runtime.scheduler import Scheduler
from ovbuild.testing.tiny_dflash2 import write_tiny_dflash2, write_tiny_dflash2_short_window
from ovbuild.testing.tiny_dspark import write_tiny_dspark
from ovbuild.weights.checkpoint import Checkpoint
from ovbuild.weights.families import load_draft

F32 = dict(kv_cache_precision="f32")
WRITERS = {
    "dflash2": write_tiny_dflash2,
    "dspark": lambda folder: write_tiny_dspark(folder, "gated"),
    "deepspec_dflash": lambda folder: write_tiny_dspark(folder, "deepspec_dflash"),
}


@pytest.fixture(scope="module", params=sorted(WRITERS))
def family_folders(request, tmp_path_factory, target):
    """(draft family, target IR with the draft's taps, exported draft folder)."""
    root = tmp_path_factory.mktemp(request.param)
    dcfg, dweights = load_draft(Checkpoint.open(WRITERS[request.param](root / "ckpt")))
    for stem, model in build_draft_models(dcfg, dweights, target[1]).items():
        save_ir(model, root / "draft" / f"{stem}.xml")
    return dcfg.family, build_target(target[0], target[1], dcfg.target_layer_ids), root / "draft"


def test_lossless_with_concurrent_requests(family_folders):
    family, target_model, draft_dir = family_folders
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, 256, int(rng.integers(3, 40))).tolist() for _ in range(5)]
    results = []
    for drafter in (None, DRAFTERS[family].from_folder(draft_dir, **F32)):
        scheduler = Scheduler(PagedModel(target_model, **F32), drafter, max_num_batched_tokens=48)
        requests = [
            scheduler.add_request(p, GenerationConfig(max_new_tokens=20, num_assistant_tokens=k))
            for p, k in zip(prompts, [None, 1, 3, 5, None], strict=True)
        ]
        scheduler.run()
        results.append([r.generated for r in requests])
        if drafter is not None:
            assert scheduler.metrics.requests.num_draft_tokens > 0
    assert results[0] == results[1]


@pytest.mark.parametrize("writer", [write_tiny_dflash2, write_tiny_dflash2_short_window])
def test_dflash2_drafter_proposes_the_reference_walk(tmp_path, target, writer):
    """Window 10 above block 8, and window 4 below block 7."""
    from ovbuild.runtime.drafters import DraftItem
    from ovbuild.runtime.reference import DRAFT_REFERENCES
    from ovbuild.runtime.reference.dflash2 import greedy_walk

    dcfg, dweights = load_draft(Checkpoint.open(writer(tmp_path / "ckpt")))
    for stem, model in build_draft_models(dcfg, dweights, target[1]).items():
        save_ir(model, tmp_path / "draft" / f"{stem}.xml")
    drafter = DRAFTERS["dflash2"].from_folder(tmp_path / "draft", **F32)
    ref = DRAFT_REFERENCES["dflash2"](dcfg, dweights, target[1])
    rng = np.random.default_rng(0)
    width = dcfg.num_taps * dcfg.target_hidden_size
    items = [
        DraftItem(seq, rng.standard_normal((n, width)).astype(np.float32), anchor, k)
        for seq, n, anchor, k in ((0, 9, 17, drafter.max_candidates), (1, 4, 40, 3), (2, 12, None, 0))
    ]
    proposals = drafter.propose(items)
    for item, proposal in zip(items, proposals, strict=True):
        if item.anchor is None:
            assert proposal == []
            continue
        block = np.array([item.anchor] + [dcfg.mask_token_id] * (dcfg.block_size - 1))
        logits, hidden = ref.forward(ref.new_cache(), item.context.astype(np.float64), block)
        expected = greedy_walk(*ref.lattice(logits, hidden, item.anchor))[: item.num_tokens]
        assert proposal == expected.tolist()
