"""Every draft family's greedy proposals under a constraint: the drafter hands its candidate rows' logits over with
its tokens (they equal the reference backbone's), so a token the grammar refuses becomes the draft's best allowed
token by those rows, never a forbidden one; and greedy output with each family under a constraint is the target
alone's."""

from __future__ import annotations

import numpy as np
import pytest

from ovbuild.families import DFLASH, DFLASH2, DSPARK, build_draft_models, load_draft
from ovbuild.graph.target import build_target
from ovbuild.ir import save_ir
from ovbuild.runtime.model.paged_model import PagedModel
from ovbuild.runtime.request import GenerationConfig
from ovbuild.runtime.scheduler import Scheduler
from ovbuild.runtime.speculation.drafters import DRAFTERS, DraftItem
from ovbuild.runtime.structured.grammar import Grammars, start_constraint
from ovbuild.runtime.structured.spec import Constraint
from ovbuild.testing import F32_NMSE, TINY_TARGET, nmse
from ovbuild.testing.planner import fixed_speculation
from ovbuild.testing.references import REFERENCES
from ovbuild.testing.tokenizer import EOS_ID, write_tokenizer
from ovbuild.weights.checkpoint import Checkpoint

F32 = dict(kv_cache_precision="f32")
# case: (checkpoint writer, drafter options)
CASES = {
    "dflash": (DFLASH.tiny["dflash"], {}),
    "dflash2": (DFLASH2.tiny["dflash2"], {}),
    "dspark_chain": (DSPARK.tiny["dspark_gated"], {"markov_mode": "chain"}),
    "dspark_lattice": (DSPARK.tiny["dspark_gated"], {"markov_mode": "lattice"}),
    "deepspec_dflash": (DSPARK.tiny["dspark_deepspec_dflash"], {}),
}
LETTERS = np.arange(ord("a"), ord("z") + 1)  # what `[a-z]{40}` allows on every row of the byte-level tokenizer
SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer"}, "tag": {"enum": ["red", "green", "blue"]}},
    "required": ["ok", "n", "tag"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def grammars(tmp_path_factory) -> Grammars:
    folder = tmp_path_factory.mktemp("tokenizer")
    write_tokenizer(folder)
    return Grammars(folder / "tokenizer.json", (EOS_ID,), TINY_TARGET["vocab_size"])


@pytest.fixture(scope="module")
def pairs(tmp_path_factory, target):
    """Per case: the exported draft folder, its config and weights, and a target IR with the draft's taps."""
    (tcfg, tweights), out = target, {}
    for case, (write, _) in CASES.items():
        root = tmp_path_factory.mktemp(case)
        cfg, weights = load_draft(Checkpoint.open(write(root / "ckpt")))
        for stem, model in build_draft_models(cfg, weights, tweights).items():
            save_ir(model, root / "draft" / f"{stem}.xml")
        out[case] = (root / "draft", cfg, weights, build_target(tcfg, tweights, cfg.target_layer_ids))
    return out


def drafter(pairs, case):
    return DRAFTERS[pairs[case][1].family].from_folder(pairs[case][0], **CASES[case][1], **F32)


@pytest.mark.parametrize("case", list(CASES))
def test_a_refused_proposal_token_becomes_the_drafts_best_allowed_one(pairs, grammars, target, case):
    _, cfg, weights, _ = pairs[case]
    d, ref = drafter(pairs, case), REFERENCES[cfg.family](cfg, weights, target[1])
    rng, width = np.random.default_rng(5), cfg.num_taps * cfg.target_hidden_size
    k = min(5, d.max_candidates)
    items = [
        DraftItem(s, rng.standard_normal((n, width)).astype(np.float32), a, k) for s, n, a in [(0, 7, 40), (1, 3, 9)]
    ]
    refused = 0
    for item, proposal in zip(items, d.propose(items), strict=True):
        expected_logits, _ = ref.step(ref.new_cache(), item.context.astype(np.float64), item.anchor, k)  # [k, V]
        error = nmse(proposal.logits, expected_logits)
        assert error < F32_NMSE, f"{case}: the proposal's logits against the reference backbone's: NMSE {error:.3e}"
        constraint = start_constraint(grammars, Constraint("regex", "[a-z]{40}"), ())
        masked = constraint.allowed_proposal(proposal, None, 0)
        expected = [
            t if t in LETTERS else int(LETTERS[np.argmax(expected_logits[j, LETTERS])]) for j, t in enumerate(proposal)
        ]
        assert set(masked) <= set(LETTERS.tolist()), f"{case}: a forbidden token in {masked}"
        assert list(masked) == expected, f"{case}: proposed {list(proposal)}, masked {masked}, expected {expected}"
        refused += sum(t not in LETTERS for t in proposal)
    assert refused > 0, f"{case}: the draft proposed no refused token: nothing was masked"


def run(pairs, grammars, case, prompts, configs, with_draft: bool):
    d = drafter(pairs, case) if with_draft else None
    target = PagedModel(pairs[case][3], num_blocks=128, **F32)
    s = Scheduler(target, d, speculation=fixed_speculation(d), grammars=grammars)
    requests = [s.add_request(p, c) for p, c in zip(prompts, configs, strict=True)]
    s.run()
    return requests, s.metrics.requests


@pytest.mark.parametrize("case", list(CASES))
def test_greedy_with_each_family_under_a_constraint_equals_the_target_alone(pairs, grammars, case):
    rng = np.random.default_rng(11)
    prompts = [rng.integers(0, 256, int(rng.integers(6, 30))).tolist() for _ in range(3)]
    constraints = [Constraint.json_schema(SCHEMA), Constraint("regex", "[a-z]{3}-[0-9]{2}"), None]
    configs = [GenerationConfig(max_new_tokens=40, eos_token_ids=(EOS_ID,), constraint=c) for c in constraints]
    alone, _ = run(pairs, grammars, case, prompts, configs, with_draft=False)
    drafted, totals = run(pairs, grammars, case, prompts, configs, with_draft=True)
    assert [r.generated for r in drafted] == [r.generated for r in alone], case
    assert [r.finish_reason for r in drafted] == [r.finish_reason for r in alone], case
    assert totals.num_draft_tokens > 0, f"{case}: nothing was drafted"
