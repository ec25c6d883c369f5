"""The constraint engine on its own: compiling each kind of constraint on the byte-level test tokenizer, the errors
that name what is wrong, logit bias checks, and a request's constraint state (masks per verification row, draft
proposals cut at refused tokens, the matcher advanced over committed tokens and never over rejected ones)."""

from __future__ import annotations

import subprocess
import sys
import threading

import numpy as np
import pytest

from ovbuild.errors import GrammarError, RequestError
from ovbuild.runtime.decode.sampling import SamplingParams
from ovbuild.runtime.speculation.drafters.base import Proposal
from ovbuild.runtime.structured import grammar as grammar_module
from ovbuild.runtime.structured.grammar import Grammars, start_constraint
from ovbuild.runtime.structured.rows import ConstrainedRows
from ovbuild.runtime.structured.spec import Constraint, check_logit_bias
from ovbuild.runtime.structured.state import COMPLETE, DEAD_END
from ovbuild.testing.tokenizer import EOS_ID, write_tokenizer

VOCAB = 300  # the model's vocabulary is wider than the tokenizer's 258 ids, as Qwen3's is


@pytest.fixture(scope="module")
def grammars(tmp_path_factory) -> Grammars:
    folder = tmp_path_factory.mktemp("tok")
    write_tokenizer(folder)
    return Grammars(folder / "tokenizer.json", (EOS_ID,), VOCAB)


def ids(text: str) -> list[int]:
    return list(text.encode())  # byte-level: a byte's id is its value


def allowed(constraint) -> set[int]:
    return set(np.flatnonzero(constraint.mask()).tolist())


def test_each_kind_compiles_and_accepts_its_language(grammars):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    cases = [
        (Constraint.json_schema(schema), '{"a": 12}'),
        (Constraint("json_object"), '{"k":[1,2]}'),
        (Constraint("regex", r"[0-9]{3}-x"), "123-x"),
        (Constraint.choice(["yes", "no"]), "no"),
        (Constraint("grammar", 'start: "(" n ")"\nn: /[0-9]+/'), "(42)"),
    ]
    for constraint, text in cases:
        state = start_constraint(grammars, constraint, ())
        kept, reason = state.advance(ids(text))
        assert kept == ids(text) and reason in (None, COMPLETE), (constraint.kind, reason)
        assert state.matcher.is_accepting(), f"{constraint.kind}: {text!r} leaves the grammar unfinished"


@pytest.mark.parametrize(
    ("constraint", "words"),
    [
        (lambda: Constraint.json_schema({"type": "strin"}), "strin"),
        (lambda: Constraint.json_schema({"type": "object", "dependentSchemas": {"a": {}}}), "dependentSchemas"),
        (lambda: Constraint.json_schema("{not json"), "not JSON"),
        (lambda: Constraint("regex", "a("), "invalid regex"),
        (lambda: Constraint("grammar", "start: foo ::: bar"), "invalid grammar"),
        (lambda: Constraint.choice([]), "non-empty list"),
        (lambda: Constraint("xml"), "not one of"),
    ],
)
def test_bad_constraints_name_what_is_wrong(grammars, constraint, words):
    with pytest.raises(GrammarError, match=words):
        grammars.compile(constraint())


def test_logit_bias_checks():
    assert check_logit_bias({"5": 1, 3: -100}, 10) == ((3, -100.0), (5, 1.0))
    bad_biases = [
        ({"10": 1}, "outside"),
        ({"-1": 1}, "outside"),
        ({"1": 101}, r"\[-100, 100\]"),
        ({"x": 1}, "token id"),
    ]
    for bad, words in bad_biases:
        with pytest.raises(RequestError, match=words):
            check_logit_bias(bad, 10)


def test_rows_masked_after_each_draft_token_and_rolled_back(grammars):
    state = start_constraint(grammars, Constraint("regex", "ab|ac|bd"), ((ord("z"), 5.0),))
    logits = np.zeros((3, VOCAB), np.float32)
    rows = ConstrainedRows(logits, state, ids("ab"))
    assert set(np.flatnonzero(np.isfinite(rows[0]))) == set(ids("ab"))
    assert set(np.flatnonzero(np.isfinite(rows[1]))) == set(ids("bc"))  # after "a"
    assert set(np.flatnonzero(np.isfinite(rows[2]))) == {EOS_ID}  # after "ab": the grammar is complete
    rows.close()
    assert allowed(state) == set(ids("ab")), "reading the rows left the matcher past the draft"
    free = ConstrainedRows(logits, start_constraint(grammars, None, ((ord("z"), 5.0),)), [])
    assert free[0][ord("z")] == 5.0 and np.isfinite(free[0]).all(), "logit bias alone masks nothing"


def test_proposals_keep_allowed_tokens_and_end_with_the_grammar(grammars):
    state = start_constraint(grammars, Constraint("regex", "abc[0-9]{2}"), ())
    assert state.allowed_proposal(Proposal(ids("abx1")), None, 0) == ids("abc1")
    assert state.allowed_proposal(Proposal(ids("abc1234")), None, 0) == ids("abc12"), "tokens past the end are dropped"
    assert allowed(state) == {ord("a")}, "masking a proposal moved the matcher"


def test_greedy_proposal_with_its_logits_takes_the_best_allowed_token(grammars):
    state = start_constraint(grammars, Constraint("regex", "a[bc]d"), ())
    logits = np.zeros((3, VOCAB), np.float32)
    logits[1, [ord("x"), ord("c"), ord("b")]] = [5.0, 2.0, 1.0]  # the draft's own choice "x" is refused
    assert state.allowed_proposal(Proposal(ids("axd"), logits=logits), None, 0) == ids("acd")
    assert state.allowed_proposal(Proposal(ids("axd")), None, 0) == ids("abd"), "without logits: the first allowed"


def test_sampled_proposal_redrawn_from_masked_q_under_rejection(grammars):
    state = start_constraint(grammars, Constraint("regex", "[ab]x"), ())
    q = np.full((2, VOCAB), 1.0 / VOCAB)
    proposal = state.allowed_proposal(Proposal(ids("zz"), q), SamplingParams(rng_seed=3, verification="rejection"), 0)
    assert len(proposal) == 2 and chr(proposal[0]) in "ab" and chr(proposal[1]) == "x", proposal
    assert np.allclose(proposal.q.sum(axis=1), 1) and set(np.flatnonzero(proposal.q[0])) == set(ids("ab"))


def test_advance_stops_when_the_grammar_ends_and_refuses_outside_it(grammars):
    done = start_constraint(grammars, Constraint.choice(["yes"]), ())
    assert done.advance(ids("yes") + ids("!")) == (ids("yes"), COMPLETE)
    bad = start_constraint(grammars, Constraint("regex", "a+b"), ())
    assert bad.advance(ids("ax")) == (ids("a"), DEAD_END), "a refused token ends an unfinished grammar"


def test_reasoning_gate_frees_the_thinking(grammars):
    state = start_constraint(grammars, Constraint("regex", "[0-9]+", after="</think>"), ())
    assert ConstrainedRows(np.zeros((1, VOCAB), np.float32), state, [])[0].min() == 0, (
        "a row inside the thinking is masked"
    )
    kept, reason = state.advance(ids("hmm </th"))
    assert kept == ids("hmm </th") and reason is None and not state.open
    rows = ConstrainedRows(np.zeros((5, VOCAB), np.float32), state, ids("ink>"))
    assert np.isfinite(rows[3]).all(), "the row that completes the marker is still free"
    assert set(np.flatnonzero(np.isfinite(rows[4]))) == set(ids("0123456789")), "the row after the marker is free"
    rows.close()
    state.advance(ids("ink>"))
    assert state.open and allowed(state) == set(ids("0123456789"))


def test_compiled_once_per_spec(grammars):
    constraint = Constraint("regex", "x{2}")
    assert grammars.compile(constraint) is grammars.compile(constraint)
    first, second = grammars.matcher(constraint), grammars.matcher(constraint)
    first.consume_token(ord("x"))
    assert second.validate_tokens(ids("xx")) == 2, "two requests share one matcher's state"


def test_llguidance_brings_no_torch():
    code = "import llguidance, importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is not None)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0, "torch is importable next to llguidance"


def test_a_compile_past_its_time_bound_is_refused_and_lands_in_the_cache(grammars, monkeypatch):
    """A compile held until its bound has passed (a compile merely expected to be slow raced the bound on a busy
    machine, and once finished first) is refused, finishes in the background and is then served from the cache."""
    schema = {"type": "object", "properties": {f"k{i}": {"type": "string", "pattern": "[a-z]{2,9}"} for i in range(40)}}
    constraint = Constraint.json_schema(schema)
    release, text = threading.Event(), grammar_module.grammar_text
    monkeypatch.setattr(grammar_module, "grammar_text", lambda c: release.wait(60) and text(c))
    with pytest.raises(GrammarError, match="compiling took more than"):
        grammars.compile_bounded(constraint, timeout_s=0.01)
    release.set()
    assert grammars.compile_bounded(constraint, timeout_s=60) is grammars.compile(constraint)


def test_a_schema_keeps_its_property_order(grammars):
    schema = {
        "type": "object",
        "properties": {"b": {"type": "integer"}, "a": {"type": "integer"}},
        "required": ["b", "a"],
    }
    state = start_constraint(grammars, Constraint.json_schema(schema), ())
    kept, reason = state.advance(ids('{"b":1,"a":2}'))
    assert kept == ids('{"b":1,"a":2}') and reason == COMPLETE, "the properties are not written in the schema's order"
