"""Sampling math: the processed distribution, the draws, each verification rule against a direct numpy version, and
a statistical losslessness test that deliberately broken rules fail."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from ovbuild.errors import ConfigError
from ovbuild.runtime.decode.sampling import SamplingParams, Uniforms, draw, position_uniforms, processed_probs, race
from ovbuild.runtime.decode.verify import RowUniforms, residual, verify_point_mass, verify_stochastic
from ovbuild.runtime.request import GenerationConfig

# -- direct implementations, written from the definitions (transformers' warpers; Leviathan et al. 2023) -------------


def direct_processed(logits: np.ndarray, t: float, top_k: int, top_p: float) -> np.ndarray:
    """transformers: TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper (ascending sort), then softmax."""
    s = logits.astype(np.float64) / t
    if top_k:
        s = np.where(s < np.sort(s)[-top_k], -np.inf, s)
    if top_p < 1:
        order = np.argsort(s, kind="stable")
        e = np.exp(s[order] - s.max())
        cum = np.cumsum(e / e.sum())
        remove = cum <= 1 - top_p
        remove[-1] = False
        s = s.copy()
        s[order[remove]] = -np.inf
    e = np.exp(s - s.max())
    return e / e.sum()


def direct_draw(p: np.ndarray, u: float) -> int:
    return int(np.searchsorted(np.cumsum(p / p.sum()), u, side="right"))


def direct_stochastic(p, q, proposal, u) -> list[int]:
    """Accept x with probability min(1, p(x)/q(x)); at the first rejection draw from the normalized max(0, p - q)."""
    for i, x in enumerate(proposal):
        if not u[i].accept < min(1.0, p[i][x] / q[i][x]):
            r = np.maximum(p[i] - q[i], 0)
            return [*proposal[:i], direct_draw(r / r.sum(), u[i].residual)]
    return [*proposal, direct_race(p[len(proposal)], u[len(proposal)].token)]


def direct_race(p: np.ndarray, keys: np.ndarray) -> int:
    """The exponential race as written: the token whose key / p(x) is smallest, among tokens with mass."""
    with np.errstate(divide="ignore"):
        return int(np.argmin(np.where(p > 0, keys / p, np.inf)))


def target_alone(p, n: int, u) -> list[int]:
    return [direct_race(p[i], u[i].token) for i in range(n)]


# -- the processed distribution and the draws --------------------------------------------------------------------


@pytest.mark.parametrize(
    "t, top_k, top_p", [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.3, 50, 1.0), (0.7, 0, 0.9), (0.7, 40, 0.8), (2.0, 7, 0.3)]
)
def test_processed_distribution_matches_transformers_order(t, top_k, top_p):
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((3, 3000)) * 4).astype(np.float32)
    ours = processed_probs(logits, SamplingParams(t, top_k, top_p))
    expected = np.stack([direct_processed(row, t, top_k, top_p) for row in logits])
    assert np.abs(ours - expected).max() < 1e-12
    assert np.allclose(ours.sum(-1), 1)


def test_top_k_keeps_ties_with_the_kth_value():
    logits = np.array([[5.0, 3.0, 3.0, 3.0, 1.0, 0.0]], np.float32)
    p = processed_probs(logits, SamplingParams(top_k=2))[0]
    assert (p > 0).tolist() == [True, True, True, True, False, False]


def test_draw_follows_p_and_never_picks_a_token_without_mass():
    p = np.array([0.0, 0.25, 0.0, 0.5, 0.25, 0.0])
    grid = (np.arange(100_000) + 0.5) / 100_000
    counts = np.bincount([draw(p, u) for u in grid[::10]] + [draw(p, 0.0), draw(p, 1 - 2**-53)], minlength=6)
    assert counts[[0, 2, 5]].sum() == 0
    assert np.abs(counts / counts.sum() - p).max() < 1e-3


def test_position_uniforms_depend_only_on_seed_and_position():
    def values(seed, position):
        u = position_uniforms(seed, position, 50)
        return (u.accept, u.residual, *u.token.tolist())

    a = values(7, 12)
    assert a == values(7, 12) and 0 <= a[0] < 1 and 0 <= a[1] < 1 and min(a[2:]) > 0
    assert a != values(7, 13) and a != values(8, 12)
    assert len(set(a[2:])) == 50  # a key per token


def test_race_follows_p_and_never_picks_a_token_without_mass():
    p = np.array([0.0, 0.25, 0.0, 0.5, 0.25, 0.0])
    rng = np.random.default_rng(3)
    picks = [race(p, rng.standard_exponential(6)) for _ in range(20_000)]
    counts = np.bincount(picks, minlength=6)
    assert counts[[0, 2, 5]].sum() == 0
    assert np.abs(counts / counts.sum() - p).max() < 0.015


def test_racing_draft_and_target_agree_when_close():
    """The coupling the exact verification relies on: same keys, P(same token) >= (1 - TV) / (1 + TV)."""
    rng = np.random.default_rng(4)
    p = rng.dirichlet(np.full(200, 0.3))
    q = 0.8 * p + 0.2 * rng.dirichlet(np.full(200, 0.3))
    tv = 0.5 * np.abs(p - q).sum()
    same = np.mean([race(p, k) == race(q, k) for k in rng.standard_exponential((4000, 200))])
    assert same > (1 - tv) / (1 + tv), f"agreement {same:.3f}, TV {tv:.3f}"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(do_sample=True, temperature=0.0), "temperature = 0.0"),
        (dict(top_p=0.0), "top_p = 0.0"),
        (dict(top_p=1.5), "top_p = 1.5"),
        (dict(top_k=-1), "top_k = -1"),
        (dict(rng_seed=-3), "rng_seed = -3"),
    ],
)
def test_invalid_sampling_values_are_config_errors(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        GenerationConfig(**kwargs)
    assert GenerationConfig(temperature=0.0).sampling is None  # greedy ignores the temperature, as GenAI does


# -- each verification rule against its direct version, on the same uniforms ----------------------------------------


def random_case(rng, k: int, v: int = 12):
    """p [k+1, v] and q [k, v] with top-k style zeros (p(x) = 0 where q(x) > 0 and the reverse), a proposal drawn
    from q, and row uniforms."""
    p = rng.dirichlet(np.full(v, 0.5), k + 1)
    q = 0.5 * p[:k] + 0.5 * rng.dirichlet(np.full(v, 0.5), k)
    for rows in (p, q):
        for row in rows:
            row[rng.choice(v, v // 3, replace=False)] = 0
            row /= row.sum()
    q[0] = p[0] if rng.random() < 0.2 else q[0]  # sometimes q = p: every token accepted, the bonus drawn
    proposal = [direct_draw(row, rng.random()) for row in q]
    u = [Uniforms(rng.standard_exponential(v), rng.random(), rng.random()) for _ in range(k + 1)]
    return p, q, proposal, u


def test_stochastic_rule_matches_the_direct_rule():
    rng = np.random.default_rng(1)
    outcomes = Counter()
    for _ in range(2000):
        p, q, proposal, u = random_case(rng, k=int(rng.integers(1, 5)))
        committed = verify_stochastic(p, q, proposal, u)
        assert committed == direct_stochastic(p, q, proposal, u)
        last, i = committed[-1], len(committed) - 1
        outcomes["bonus" if i == len(proposal) else "residual"] += 1
        outcomes["p(x) = 0 rejected"] += i < len(proposal) and p[i][proposal[i]] == 0
        assert p[i][last] > 0  # a committed token always has target mass
    assert min(outcomes.values()) > 50, outcomes


def test_point_mass_rule_commits_the_target_alone_draws():
    rng = np.random.default_rng(2)
    for _ in range(2000):
        p, _, _, u = random_case(rng, k=3)
        alone = target_alone(p, 4, u)
        proposal = [*alone[: int(rng.integers(0, 4))], int(rng.integers(0, 12))][:3]  # agree, then maybe not
        committed = verify_point_mass(p, proposal, u)
        n = len(committed)
        assert committed == alone[:n] and committed[: n - 1] == proposal[: n - 1]
        assert n == len(proposal) + 1 or proposal[n - 1] != alone[n - 1]


def test_residual_is_the_positive_part_of_p_minus_q():
    p, q = np.array([0.5, 0.3, 0.2, 0.0]), np.array([0.2, 0.5, 0.0, 0.3])
    assert np.allclose(residual(p, q), [0.3, 0.0, 0.2, 0.0])
    assert residual(p, p) is p  # only rounding gets here: p itself, never a division by zero


# -- statistical losslessness: a Markov target and a draft close to it, over thousands of seeds ---------------------

V, N_TOKENS, K, SEEDS = 6, 3, 2, 3000
PARAMS = SamplingParams(temperature=0.8, top_k=4)
_rng = np.random.default_rng(5)
TARGET_LOGITS = _rng.standard_normal((V, V)) * 1.5  # row = previous token
DRAFT_LOGITS = TARGET_LOGITS + _rng.standard_normal((V, V)) * 1.2  # top-4 supports differ on some rows
P = processed_probs(TARGET_LOGITS, PARAMS)  # [prev, next]
Q = processed_probs(DRAFT_LOGITS, PARAMS)


def broken_greedy_accept(p, q, proposal, u):
    """Wrong: accepts x exactly when p(x) > q(x) (no coin), else the residual."""
    for i, x in enumerate(proposal):
        if not p[i][x] > q[i][x]:
            return [*proposal[:i], draw(residual(p[i], q[i]), u[i].residual)]
    return [*proposal, race(p[len(proposal)], u[len(proposal)].token)]


def broken_no_residual(p, q, proposal, u):
    """Wrong: on rejection draws from p instead of the residual."""
    for i, x in enumerate(proposal):
        if u[i].accept * q[i][x] >= p[i][x]:
            return [*proposal[:i], draw(p[i], u[i].residual)]
    return [*proposal, race(p[len(proposal)], u[len(proposal)].token)]


def direct_point_mass(p, proposal, u):
    """The point-mass rule as written: accept x with probability p(x), else draw from p without x."""
    for i, x in enumerate(proposal):
        if u[i].accept >= p[i][x]:
            rest = p[i].copy()
            rest[x] = 0
            return [*proposal[:i], draw(rest, u[i].residual)]
    return [*proposal, race(p[len(proposal)], u[len(proposal)].token)]


def broken_point_mass_keeps_x(p, proposal, u):
    """Wrong: on rejection draws from p with x still in it."""
    for i, x in enumerate(proposal):
        if u[i].accept >= p[i][x]:
            return [*proposal[:i], draw(p[i], u[i].residual)]
    return [*proposal, race(p[len(proposal)], u[len(proposal)].token)]


def speculative(rule, stochastic: bool, seed: int) -> tuple[int, ...]:
    """N_TOKENS tokens after token 0: K draft tokens per step (drawn from Q, or Q's argmax), verified by `rule`."""
    out, position = [0], 0
    while position < N_TOKENS:
        proposal, q = [], []
        for i in range(K):
            row = Q[proposal[-1] if proposal else out[-1]]
            token = race(row, position_uniforms(seed, position + i, V).token) if stochastic else int(np.argmax(row))
            proposal.append(token)
            q.append(row)
        p = P[[out[-1], *proposal]]
        u = RowUniforms(seed, position, V)
        committed = rule(p, np.array(q), proposal, u) if stochastic else rule(p, proposal, u)
        out += committed
        position += len(committed)
    return tuple(out[1 : N_TOKENS + 1])


def chi_square_p_above(counts: Counter, expected: dict, alpha_z: float = 3.72) -> tuple[bool, float]:
    """Pearson chi-square of counts against expected probabilities (cells under 5 expected pooled); whether it stays
    under the 1e-4 critical value (Wilson-Hilferty), and the statistic."""
    n = sum(counts.values())
    stat, pooled_obs, pooled_exp, df = 0.0, 0, 0.0, -1
    for cell, prob in expected.items():
        if prob * n < 5:
            pooled_obs, pooled_exp = pooled_obs + counts.get(cell, 0), pooled_exp + prob * n
            continue
        stat += (counts.get(cell, 0) - prob * n) ** 2 / (prob * n)
        df += 1
    if pooled_exp > 0:
        stat += (pooled_obs - pooled_exp) ** 2 / pooled_exp
        df += 1
    stat += sum(c for cell, c in counts.items() if cell not in expected) * 1e9  # an impossible n-gram
    critical = df * (1 - 2 / (9 * df) + alpha_z * math.sqrt(2 / (9 * df))) ** 3
    return stat < critical, stat


def exact_ngrams() -> dict:
    """P(t1, t2, t3 | token 0) of the target alone."""
    probs = {}
    for cell in np.ndindex(*(V,) * N_TOKENS):
        prob, prev = 1.0, 0
        for t in cell:
            prob, prev = prob * P[prev, t], t
        if prob > 0:
            probs[cell] = prob
    return probs


@pytest.mark.parametrize(
    "rule, stochastic, lossless",
    [
        (verify_stochastic, True, True),
        (verify_point_mass, False, True),
        (direct_point_mass, False, True),
        (broken_greedy_accept, True, False),
        (broken_no_residual, True, False),
        (broken_point_mass_keeps_x, False, False),
    ],
    ids=lambda x: getattr(x, "__name__", str(x)),
)
def test_trigram_distribution_equals_the_target_alone(rule, stochastic, lossless):
    counts = Counter(speculative(rule, stochastic, seed) for seed in range(SEEDS))
    expected = exact_ngrams()
    passes, stat = chi_square_p_above(counts, expected)
    assert passes == lossless, f"{rule.__name__}: chi-square {stat:.1f} over {len(expected)} trigrams"


def test_the_draft_is_close_enough_for_the_test_to_mean_something():
    """Acceptance of the stochastic rule on the first draft token: neither ~0 nor ~1, and supports differ."""
    tv = 0.5 * np.abs(P - Q).sum(-1)
    assert 0.15 < tv.mean() < 0.6, tv
    assert ((P == 0) & (Q > 0)).any() and ((Q == 0) & (P > 0)).any()
