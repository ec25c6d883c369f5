"""Batch invariance: a row computes bitwise alike whatever its call holds, and each row keeps one kernel (a prompt row
in a chunk of at least 2 rows, a generated row as a 1-row subsequence) however the scheduler cuts prompts, so greedy
output with a draft is the target alone's at any number of requests (docs/invariance.md)."""

from __future__ import annotations

import numpy as np
import pytest

from ovbuild.families import load_draft
from ovbuild.graph.dflash import build_dflash_draft
from ovbuild.graph.target import build_target
from ovbuild.graph.weights import WeightPolicy
from ovbuild.runtime.cache.kv_cache import SequenceRows
from ovbuild.runtime.cache.rows import MIN_PROMPT_CHUNK, prompt_chunk
from ovbuild.runtime.model.devices import target_inference_precision
from ovbuild.runtime.model.machine import cpu_flags
from ovbuild.runtime.model.paged_model import PagedModel
from ovbuild.runtime.pipeline import EXACT_TARGET, FAST_DRAFT
from ovbuild.runtime.request import GenerationConfig
from ovbuild.runtime.scheduler import Scheduler
from ovbuild.runtime.speculation.drafters import BlockDrafter
from ovbuild.targets import load_target
from ovbuild.testing import write_tiny_dflash, write_tiny_target
from ovbuild.testing.planner import fixed_speculation
from ovbuild.testing.steered import SteeredDrafter
from ovbuild.weights.checkpoint import Checkpoint

# Qwen3-4B's width and head layout, 2 layers, the vocabulary cut to 4096 (memory and time; the matrices a row
# crosses keep their real shapes but the lm_head's rows)
WIDTH_4B = dict(
    hidden_size=2560, intermediate_size=9728, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
    vocab_size=4096, num_hidden_layers=2, layer_types=["full_attention"] * 2, tie_word_embeddings=True,
)  # fmt: skip


def test_prompt_chunks_never_hold_or_leave_a_lone_prompt_row():
    for left in range(1, 40):
        for prompt_left in range(0, left + 1):
            for budget in range(-2, 45):
                n = prompt_chunk(left, budget, prompt_left)
                where = f"left {left}, prompt rows {prompt_left}, budget {budget}: chunk {n}"
                assert 1 <= n <= left and n <= max(budget, MIN_PROMPT_CHUNK) + 1, where
                if prompt_left > 0:
                    assert n <= prompt_left, f"{where}: the chunk runs past the prompt's end"
                if prompt_left >= MIN_PROMPT_CHUNK:
                    assert n != 1 and prompt_left - n != 1, where
                if budget >= 2 and prompt_left - min(budget, left) != 1:
                    limit = min(left, budget, prompt_left) if prompt_left > 0 else min(left, budget)
                    assert n == limit, f"{where}: the budget was not kept"


def test_a_prefix_hit_leaves_two_prompt_rows(models):
    """A prompt of 32m + 1 tokens whose blocks are all cached runs its last block again: its last row alone would
    run in the decode kernel, where the uncached run computed it in the prompt's chunk."""
    target_model, _ = models
    scheduler = Scheduler(PagedModel(target_model, kv_cache_precision="f32"))
    rng = np.random.default_rng(5)
    for length, cached in ((65, 32), (66, 64), (64, 32), (33, 0)):
        prompt = rng.integers(0, 256, length).tolist()
        first = scheduler.add_request(prompt, GenerationConfig(max_new_tokens=2))
        scheduler.run()
        again = scheduler.add_request(prompt, GenerationConfig(max_new_tokens=2))
        scheduler.run()
        assert first.num_cached_tokens == 0 and again.num_cached_tokens == cached, (length, again.num_cached_tokens)
        assert again.generated == first.generated


def serve(target_model, draft_model, prompts, at_once: int, draft: bool, truths=None, tokens=20) -> list[list[int]]:
    """Every prompt served with the runtime's default precisions, `at_once` requests at a time, each prompt twice (the
    second time on its cached prefix), with a small batch budget so that chunks are cut by what else runs."""
    math = target_inference_precision("CPU", EXACT_TARGET.inference_precision, EXACT_TARGET.kv_cache_precision)
    target = PagedModel(target_model, "CPU", EXACT_TARGET.kv_cache_precision, math, num_blocks=96)
    drafter = None
    if draft:
        fast = FAST_DRAFT
        inner = BlockDrafter(draft_model, "CPU", fast.kv_cache_precision, fast.inference_precision, num_blocks=96)
        drafter = SteeredDrafter(inner, target.vocab_size, seed=3)
    scheduler = Scheduler(
        target, drafter, max_num_batched_tokens=40, speculation=fixed_speculation(drafter), max_num_seqs=at_once
    )
    run, prompt_len = target.run, {}

    def checked_run(rows, inputs, *args, **kwargs):
        """Every row in its one kernel: a prompt row in a chunk of 2 rows or more (of a prompt of 2 tokens or more),
        a generated row as a 1-row subsequence."""
        for r in (r for r in rows if r.seq_id in prompt_len):  # a request's rows (not the planner's timing calls)
            n = prompt_len[r.seq_id]
            if r.past_len < n:
                assert r.past_len + r.num_rows <= n and (r.num_rows >= 2 or n == 1), f"prompt of {n} tokens: {r}"
            else:
                assert r.num_rows == 1, f"generated rows in one subsequence: {r}"
        return run(rows, inputs, *args, **kwargs)

    target.run = checked_run
    out = []
    for _ in range(2):  # the second time on the cached prefixes
        requests = []
        for i, prompt in enumerate(prompts):
            config = GenerationConfig(max_new_tokens=tokens, num_assistant_tokens=(None, 3, 7)[i % 3])
            requests.append(scheduler.add_request(prompt, config))
            prompt_len[requests[-1].id] = len(prompt)
            if drafter is not None:
                drafter.truths[requests[-1].id] = [*prompt, *truths[i]]
        scheduler.run()
        out += [r.generated for r in requests]
    return out


def test_greedy_output_with_a_draft_is_the_target_alones_at_1_and_4_requests(models):
    """16 prompts (of 32m + 1 and 32m + 2 tokens among others, so that prefix hits and budget cuts would leave a lone
    prompt row), alone and with a steered draft, one request at a time and 4 at once: every output the same."""
    target_model, draft_model = models
    rng = np.random.default_rng(16)
    lengths = [33, 34, 65, 66, 3, 40, 97, 1, 31, 32, 2, 50, 129, 17, 64, 70]
    prompts = [rng.integers(0, 256, n).tolist() for n in lengths]
    alone = serve(target_model, draft_model, prompts, 1, draft=False)
    assert alone[: len(prompts)] == alone[len(prompts) :], "the target alone changed its output on cached prefixes"
    runs = {"alone at 4": serve(target_model, draft_model, prompts, 4, draft=False)}
    for at_once in (1, 4):
        runs[f"draft at {at_once}"] = serve(target_model, draft_model, prompts, at_once, True, alone[: len(prompts)])
    for name, out in runs.items():
        differ = [i for i, (a, b) in enumerate(zip(out, alone, strict=True)) if a != b]
        assert not differ, f"{name}: outputs {differ} differ from the target alone's"


@pytest.fixture(scope="module")
def wide_pair(tmp_path_factory):
    """A 2-layer random target at Qwen3-4B width with int8 weights, and a DFlash v1 draft for it."""
    root = tmp_path_factory.mktemp("wide")
    target_dir = write_tiny_target(root / "target", dtype="bf16", **WIDTH_4B)
    dflash = {"mask_token_id": 5, "target_layer_ids": [0, 1], "block_size": 16}
    draft_dir = write_tiny_dflash(
        root / "draft", dtype="bf16", target_hidden_size=2560, **{**WIDTH_4B, "tie_word_embeddings": False},
        num_target_layers=2, dflash_config=dflash,
    )  # fmt: skip
    (tcfg, tweights), (dcfg, dweights) = (
        load_target(Checkpoint.open(target_dir)),
        load_draft(Checkpoint.open(draft_dir)),
    )
    int8 = WeightPolicy(weight_format="int8")
    return build_target(tcfg, tweights, (0, 1), int8), build_dflash_draft(dcfg, dweights, tweights, int8)


def logits_of(model: PagedModel, rows: list[SequenceRows], ids: list[int], wanted: list[int]) -> np.ndarray:
    positions = [p for r in rows for p in range(r.past_len, r.past_len + r.num_rows)]
    out = model.run(rows, {"input_ids": ids, "position_ids": positions, "logits_indices": wanted})
    return np.array(out["logits"])


# The CPU kind docs/invariance.md measured bitwise: AVX-512 with bf16 and VNNI, no AMX. Elsewhere the promise is the
# target's output up to rounding, which is what the test then asserts.
AVX512_BF16_NO_AMX = {"avx512f", "avx512_bf16", "avx512_vnni"}, {"amx_bf16", "amx_int8"}
MEASURED_BITWISE = AVX512_BF16_NO_AMX[0] <= cpu_flags() and not cpu_flags() & AVX512_BF16_NO_AMX[1]


def assert_same_row(got: np.ndarray, want: np.ndarray, what: str) -> None:
    """Bitwise equal on the measured CPU kind, else equal up to rounding (1e-3 of the logits' scale)."""
    diff = np.abs(got - want).max()
    if MEASURED_BITWISE:
        assert np.array_equal(got, want), f"{what} differs by {diff:.3g}"
    else:
        assert diff <= 1e-3 * np.abs(want).max(), f"{what} differs by {diff:.3g}, more than rounding"


@pytest.mark.slow
def test_a_row_computes_bitwise_alike_at_qwen3_4b_width(wide_pair):
    """At Qwen3-4B width (int8 weights, the default math and cache): a row's logits alone, as verification row j of
    8, and in a call of 4 requests' decode rows are bitwise the same (on the CPU kind measured so)."""
    target_model, _ = wide_pair
    math = target_inference_precision("CPU", None, EXACT_TARGET.kv_cache_precision)
    model = PagedModel(target_model, "CPU", EXACT_TARGET.kv_cache_precision, math, cache_mb=64)
    assert model.static is None, "a model this size runs dynamic: the case this test is about"
    rng = np.random.default_rng(4)
    tokens = rng.integers(10, 4096, (4, 72)).tolist()
    for s in range(4):  # 4 sequences of 56-token prompts
        logits_of(model, [SequenceRows(s, 0, 56)], tokens[s][:56], [55])
    alone = {}  # sequence 0's rows 56..63 decoded one call each, as the target alone runs them
    for p in range(56, 64):
        alone[p] = logits_of(model, [SequenceRows(0, p, 1)], [tokens[0][p]], [0])[0]
    # the same rows as 8 verification rows of one call (rewriting the cache with what they compute)
    rows = [SequenceRows(0, 56 + i, 1) for i in range(8)]
    verified = logits_of(model, rows, tokens[0][56:64], list(range(8)))
    for j in range(8):
        assert_same_row(verified[j], alone[56 + j], f"verification row {j} of 8")
    # the next row in a batch of 4 decode rows and alone
    batch = logits_of(model, [SequenceRows(s, 64 if s == 0 else 56, 1) for s in range(4)], [t[64] for t in tokens], [0])
    single = logits_of(model, [SequenceRows(0, 64, 1)], [tokens[0][64]], [0])
    assert_same_row(batch, single, "a row beside 3 others, against the row alone,")


@pytest.mark.slow
def test_greedy_output_with_a_draft_is_the_target_alones_at_qwen3_4b_width(wide_pair):
    """16 prompts at Qwen3-4B width (int8), alone and with a steered draft, at 1 and 4 requests: the same outputs."""
    target_model, draft_model = wide_pair
    rng = np.random.default_rng(17)
    prompts = [rng.integers(10, 4096, n).tolist() for n in (33, 65, 2, 40) * 4]
    alone = serve(target_model, draft_model, prompts, 1, draft=False, tokens=6)
    for at_once in (1, 4):
        out = serve(target_model, draft_model, prompts, at_once, True, alone[: len(prompts)], tokens=6)
        differ = [i for i, (a, b) in enumerate(zip(out, alone, strict=True)) if a != b]
        assert not differ, f"draft at {at_once}: outputs {differ} differ from the target alone's"
