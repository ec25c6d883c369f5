"""The numpy reference of the hybrid target: its two forms of the delta rule agree, and its cache rolls back."""

from __future__ import annotations

import numpy as np
import pytest

from ovbuild.reference.gated_delta import delta_rule_chunked, delta_rule_recurrent
from ovbuild.reference.hybrid import HybridReference
from ovbuild.targets import load_target
from ovbuild.testing import nmse
from ovbuild.testing.tiny_hybrid import write_tiny_hybrid_target
from ovbuild.weights.checkpoint import Checkpoint

TAPS = (0, 2, 3)


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    return load_target(Checkpoint.open(write_tiny_hybrid_target(tmp_path_factory.mktemp("h") / "t")))


@pytest.mark.parametrize("chunk", [1, 3, 8, 64])
def test_chunked_delta_rule_equals_recurrent(chunk):
    rng = np.random.default_rng(chunk)
    n, heads, dk, dv = 19, 3, 8, 5
    q, k = rng.standard_normal((2, n, heads, dk))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.standard_normal((n, heads, dv))
    g, beta = -rng.uniform(0, 1, (n, heads)), rng.uniform(0, 1, (n, heads))
    state = rng.standard_normal((heads, dk, dv))
    out, states = delta_rule_recurrent(q, k, v, g, beta, state)
    out_c, final = delta_rule_chunked(q, k, v, g, beta, state, chunk)
    assert nmse(out_c, out) < 1e-28 and nmse(final, states[-1]) < 1e-28
    assert nmse(states[-1], state) > 0.01, "the state must change, or the test proves nothing"


def test_chunked_model_equals_recurrent_model(hybrid):
    cfg, weights = hybrid
    ids = np.random.default_rng(0).integers(0, 256, 23)
    rec, chunked = HybridReference(cfg, weights), HybridReference(cfg, weights, chunk=4)
    a, b = rec.new_cache(), chunked.new_cache()
    logits, taps = zip(*(rec.forward(a, part, TAPS) for part in (ids[:10], ids[10:])), strict=True)
    logits_c, taps_c = zip(*(chunked.forward(b, part, TAPS) for part in (ids[:13], ids[13:])), strict=True)
    assert nmse(np.concatenate(logits_c), np.concatenate(logits)) < 1e-26
    assert nmse(np.concatenate(taps_c), np.concatenate(taps)) < 1e-26


def test_restored_state_continues_like_a_cache_that_never_saw_the_rejected_rows(hybrid):
    cfg, weights = hybrid
    ref = HybridReference(cfg, weights)
    ids = np.random.default_rng(1).integers(0, 256, 12)
    # the same calls without the rejected rows: bit-equality is the claim, and BLAS may round a 12-row product
    # differently from two 6-row ones
    straight = ref.new_cache()
    ref.forward(straight, ids[:6])
    expected, _ = ref.forward(straight, ids[6:])
    cache = ref.new_cache()
    ref.forward(cache, ids[:6])
    saved = cache.snapshot()
    ref.forward(cache, np.array([7, 8, 9]), record_rows=True)  # a verification whose rows are all rejected
    cache.restore(saved)
    cache.truncate_keys(6)
    logits, _ = ref.forward(cache, ids[6:])
    assert np.array_equal(logits, expected)
