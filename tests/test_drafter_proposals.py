"""The block drafters propose exactly the reference's greedy tokens of the right rows, over two steps of a packed
batch (context-only, short and full blocks, each of num_tokens + candidate_offset rows), for candidate offset 1
(DFlash v1) and 0 (DeepSpec DFlash)."""

from __future__ import annotations

import numpy as np
import pytest

from ovbuild.families import DFLASH, DSPARK, build_draft_models, load_draft
from ovbuild.runtime.speculation.drafters import DRAFTERS, DraftItem
from ovbuild.testing.references import REFERENCES as DRAFT_REFERENCES
from ovbuild.weights.checkpoint import Checkpoint

WRITERS = {"dflash": DFLASH.tiny["dflash"], "deepspec_dflash": DSPARK.tiny["dspark_deepspec_dflash"]}  # no heads
# per step: (seq, context rows, anchor or None, tokens wanted)
STEPS = [
    [(0, 9, 17, 7), (1, 4, 40, 3), (2, 12, None, 0)],
    [(2, 2, 23, 5), (0, 3, 61, 1), (1, 1, 99, 7)],
]


@pytest.mark.parametrize("kind", sorted(WRITERS))
def test_block_drafter_proposes_the_reference_argmax(kind, tmp_path, target):
    dcfg, dweights = load_draft(Checkpoint.open(WRITERS[kind](tmp_path / "ckpt")))
    (model,) = build_draft_models(dcfg, dweights, target[1]).values()
    drafter = DRAFTERS[dcfg.family](model, kv_cache_precision="f32")
    ref = DRAFT_REFERENCES[dcfg.family](dcfg, dweights, target[1])
    caches, rng = {}, np.random.default_rng(4)
    width = dcfg.num_taps * dcfg.target_hidden_size
    proposed = 0
    for step in STEPS:
        items = [
            DraftItem(seq, rng.standard_normal((n, width)).astype(np.float32), anchor, k) for seq, n, anchor, k in step
        ]
        for item, proposal in zip(items, drafter.propose(items), strict=True):
            cache = caches.setdefault(item.seq_id, ref.new_cache())
            context = item.context.astype(np.float64)
            if item.anchor is None:
                ref.forward(cache, context, np.zeros(0, np.int64))
                expected = []
            else:  # a block only as long as the proposals need: num_tokens + candidate_offset rows
                logits, _ = ref.step(cache, context, item.anchor, item.num_tokens)
                expected = logits.argmax(-1)[: item.num_tokens].tolist()
            assert proposal == expected, f"{kind} sequence {item.seq_id}: proposed {proposal}, reference {expected}"
            proposed += len(proposal)
    assert proposed == 7 + 3 + 5 + 1 + min(7, dcfg.num_candidates)
