"""Calls without taps and the catch-up: the untapped sibling computes the tapped target's numbers bitwise, a catch-up
gives the draft the taps it missed without touching committed rows, and drafting that resumes after untapped steps
stays lossless with the draft's whole context."""

from __future__ import annotations

import numpy as np
import pytest

from ovbuild.errors import CacheExhaustedError
from ovbuild.reference.layers import nmse
from ovbuild.reference.qwen3 import Qwen3Reference
from ovbuild.runtime.cache.kv_cache import BlockAllocator, sequence_rows
from ovbuild.runtime.catch_up import catch_up
from ovbuild.runtime.model import paged_model
from ovbuild.runtime.model.paged_model import TAPS, PagedModel
from ovbuild.runtime.model.static_rows import weight_bytes
from ovbuild.runtime.request import GenerationConfig, Request, Status
from ovbuild.runtime.scheduler import Scheduler
from ovbuild.runtime.speculation.drafters import BlockDrafter
from ovbuild.runtime.speculation.pace import MAX_PLAN_BACKOFF
from ovbuild.runtime.speculation.planner import Speculation
from ovbuild.testing import TINY_TARGET
from ovbuild.testing.planner import fixed_cost
from ovbuild.testing.steered import SteeredDrafter

VOCAB = TINY_TARGET["vocab_size"]


def call(model: PagedModel, seq: int, past: int, tokens: list[int], taps: bool, one_per_row: bool):
    """One call of `tokens` after `past` cached tokens of `seq` (one_per_row: as verification rows run)."""
    rows = sequence_rows(seq, past, len(tokens), one_per_row)
    positions, every_row = list(range(past, past + len(tokens))), list(range(len(tokens)))
    return model.run(rows, {"input_ids": tokens, "position_ids": positions, "logits_indices": every_row}, taps=taps)


def cached_rows(model: PagedModel, seq: int, length: int) -> dict[str, np.ndarray]:
    """The bytes a sequence's first `length` tokens hold in every layer's key and value cache."""
    table = model.cache.allocator.tables[seq]
    rows = {}
    for name, tensor in model.cache.tensors.items():
        blocks = tensor.data.view(np.uint8)[table]  # [blocks, kv_heads, block_size, bytes]
        by_token = np.moveaxis(blocks, 2, 1)  # [blocks, block_size, kv_heads, bytes]
        rows[name] = by_token.reshape(-1, *by_token.shape[2:])[:length]  # [tokens, kv_heads, bytes]
    return rows


@pytest.mark.parametrize("math", ["f32", "bf16"])
def test_the_untapped_sibling_computes_the_tapped_logits_and_cache_rows_bitwise(models, math):
    tapped = PagedModel(models[0], kv_cache_precision="f16", inference_precision=math, num_blocks=16)
    mixed = PagedModel(models[0], kv_cache_precision="f16", inference_precision=math, num_blocks=16)
    assert tapped.can_skip_taps and mixed.can_skip_taps
    rng = np.random.default_rng(1)
    prompt = rng.integers(0, VOCAB, 19).tolist()
    schedule = [(prompt, False), *((rng.integers(0, VOCAB, 1 + s % 4).tolist(), True) for s in range(8))]
    past = 0
    for step, (tokens, one_per_row) in enumerate(schedule):
        a = call(tapped, 0, past, tokens, True, one_per_row)
        b = call(mixed, 0, past, tokens, step % 2 == 1, one_per_row)
        assert (TAPS in b) == (step % 2 == 1), "an untapped call returned taps, or a tapped one none"
        np.testing.assert_array_equal(a["logits"], b["logits"])
        past += len(tokens)
    assert mixed.untapped().static.copies, "no call ran in the untapped sibling"
    for name, rows in cached_rows(tapped, 0, past).items():
        np.testing.assert_array_equal(rows, cached_rows(mixed, 0, past)[name], err_msg=name)


def test_a_fork_borrows_the_whole_blocks_and_frees_only_its_own():
    allocator = BlockAllocator(8, 4)
    owner = list(allocator.reserve(0, 10))  # 3 blocks
    assert allocator.fork(5, 0, 6, 12) == (owner[1], allocator.tables[5][1])  # token 6 is inside block 1: copy it
    assert allocator.tables[5][0] == owner[0] and set(allocator.tables[5][1:]).isdisjoint(owner)
    assert allocator.free_blocks == 3
    allocator.free(5)
    assert allocator.free_blocks == 5 and allocator.tables[0] == owner
    assert allocator.fork(6, 0, 8, 9) is None and allocator.tables[6] == [*owner[:2], allocator.tables[6][2]]
    allocator.free(6)
    with pytest.raises(CacheExhaustedError, match="sequence 7 needs 6 more cache blocks"):
        allocator.fork(7, 0, 4, 28)
    assert allocator.free_blocks == 5 and 7 not in allocator.tables


@pytest.mark.parametrize("tapped_before", [0, 13])
def test_a_catch_up_gives_the_missed_taps_and_leaves_the_committed_rows(models, target, draft, tapped_before):
    model = PagedModel(models[0], kv_cache_precision="f32", num_blocks=16)
    rng = np.random.default_rng(2)
    prompt = rng.integers(0, VOCAB, 21).tolist()
    generated = rng.integers(0, VOCAB, 6).tolist()
    model.cache.allocator.reserve(0, 40)
    call(model, 0, 0, prompt, False, False)
    call(model, 0, 21, generated[:5], False, True)  # the anchor, generated[5], is not committed
    request = Request(0, np.array(prompt, np.int64), GenerationConfig(), Status.DECODE, list(generated))
    request.target_len, request.taps_len = 26, tapped_before
    before, free = cached_rows(model, 0, 26), model.cache.allocator.free_blocks

    assert catch_up(model, [request], max_rows=64) == [request]

    assert request.gap == 0 and request.pending_rows == 26 - tapped_before
    assert model.cache.allocator.free_blocks == free, "the catch-up kept blocks"
    for name, rows in cached_rows(model, 0, 26).items():
        np.testing.assert_array_equal(rows, before[name], err_msg=f"{name}: a committed row changed")
    ref = Qwen3Reference(*target)
    _, expected = ref.forward(ref.new_cache(), np.array([*prompt, *generated[:5]]), draft[0].target_layer_ids)
    error = nmse(request.take_taps(), expected[tapped_before:])
    assert error < 1e-6, f"catch-up taps NMSE {error:.2e}"


class Scripted(Speculation):
    """Fixed costs where drafting pays; plans draft for nobody while `quiet`."""

    quiet = True

    def plan(self, free, *args, **kwargs):
        return [0] * len(free) if self.quiet else super().plan(free, *args, **kwargs)


class Recording(SteeredDrafter):
    """Keeps every context row each sequence was given."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.contexts: dict[int, list[np.ndarray]] = {}

    def propose(self, items):
        for item in items:
            if item.context is not None:
                self.contexts.setdefault(item.seq_id, []).append(item.context)
        return super().propose(items)


def serve(scheduler: Scheduler, prompts, configs, arrivals, truths=None, resume_at: int | None = None) -> list:
    """Each prompt added at its arrival step; a Scripted planner starts planning for real at `resume_at`. Returns
    each request's tokens (`truths`: the target alone's, which steer a SteeredDrafter)."""
    requests, step = [], 0
    while step == 0 or scheduler.has_unfinished():
        for prompt, config, at in zip(prompts, configs, arrivals, strict=True):
            if at == step:
                requests.append(scheduler.add_request(prompt, config))
                if truths is not None:
                    scheduler.drafter.truths[requests[-1].id] = [*prompt, *truths[len(requests) - 1]]
        if resume_at is not None and step == resume_at:
            scheduler.speculation.quiet = False
        scheduler.step()
        step += 1
    return [r.generated for r in requests]


def idle_pipeline(models, max_num_batched_tokens: int = 2048, monkeypatch=None) -> tuple[Scheduler, Recording, list]:
    """A scheduler whose planner has backed off all the way, with a recording steered draft and a log of the calls
    that ran in the untapped sibling. With `monkeypatch`, the target has copies and no sibling (too big for one):
    its calls compute the taps, and its decoding requests leave them untaken (PagedModel.taps_optional)."""
    if monkeypatch is not None:
        monkeypatch.setattr(paged_model, "MAX_WEIGHT_BYTES", 2 * weight_bytes(models[0]) - 1)
    target_model = PagedModel(models[0], kv_cache_precision="f32", num_blocks=64)
    assert target_model.taps_optional and target_model.can_skip_taps == (monkeypatch is None)
    drafter = Recording(BlockDrafter(models[1], kv_cache_precision="f32", num_blocks=64), VOCAB, seed=4)
    speculation = Scripted(
        drafter.max_candidates,
        drafter.candidate_offset,
        fixed_cost(1e-3, 1e-5),
        fixed_cost(1e-4, 1e-5),
        host_s=1e-4,
        learn_host=False,
    )
    speculation.pace.backoff = MAX_PLAN_BACKOFF  # drafting has not paid for a while: calls leave the taps out
    untapped_calls = []
    if target_model.can_skip_taps:
        sibling_model = target_model.untapped()
        sibling_run = sibling_model.run
        sibling_model.run = lambda *a, **k: untapped_calls.append(1) or sibling_run(*a, **k)
    scheduler = Scheduler(target_model, drafter, max_num_batched_tokens, speculation=speculation)
    return scheduler, drafter, untapped_calls


@pytest.mark.parametrize("sibling", [True, False], ids=["untapped-sibling", "taps-untaken"])
def test_drafting_resumes_after_untapped_steps_with_its_whole_context_and_stays_lossless(
    models, target, draft, sibling, monkeypatch
):
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, VOCAB, int(n)).tolist() for n in (9, 30, 17)]
    configs = [GenerationConfig(max_new_tokens=70)] * 3
    arrivals = [0, 0, 20]  # the third arrives while the planner idles (with a sibling its prompt too is caught up)
    alone = serve(Scheduler(PagedModel(models[0], kv_cache_precision="f32", num_blocks=64)), prompts, configs, arrivals)
    # a catch-up call holds at most 48 rows: at the resume it fits one request, the others draft a step or two later
    # (meanwhile their calls have taps, which they must not take before the rows they missed)
    scheduler, drafter, untapped_calls = idle_pipeline(models, 48, None if sibling else monkeypatch)

    assert serve(scheduler, prompts, configs, arrivals, alone, resume_at=30) == alone
    assert bool(untapped_calls) == sibling, "calls ran in a sibling that should not exist, or none left the taps out"
    assert scheduler.metrics.catch_up_rows > 0 and scheduler.metrics.requests.num_accepted_tokens > 0
    ref = Qwen3Reference(*target)
    for request, prompt, tokens in zip(scheduler.finished, prompts, alone, strict=True):
        given = np.concatenate(drafter.contexts[request.id])
        _, expected = ref.forward(
            ref.new_cache(), np.array([*prompt, *tokens])[: len(given)], draft[0].target_layer_ids
        )
        assert nmse(given, expected) < 1e-6, f"request {request.id}: the draft's context is not its taps in order"


def test_an_idle_target_without_a_sibling_keeps_prompt_taps_and_leaves_decode_taps_untaken(models, monkeypatch):
    """While the planner idles, a target whose taps are optional but that has no sibling computes them in every call:
    a new request keeps its prompt's (it may draft from them at once), the decode steps' become its gap."""
    scheduler, _, _ = idle_pipeline(models, monkeypatch=monkeypatch)
    request = scheduler.add_request(list(range(3, 24)), GenerationConfig(max_new_tokens=12))
    scheduler.step()
    assert request.status is Status.DECODE and request.taps_len == 21 and request.gap == 0
    for _ in range(5):
        scheduler.step()
    assert request.taps_len == 21 and request.gap == 5, "a decode step while idle took its taps"
    assert scheduler.target._untapped is None, "a sibling was built for a target too big for one"


def test_a_model_without_copies_keeps_its_decode_taps_while_idle(models, monkeypatch):
    """A model too big for static copies takes its taps every step: catching up a long idle's rows would take
    seconds there, where taking them is microseconds on its steps."""
    monkeypatch.setattr(paged_model, "MAX_WEIGHT_BYTES", weight_bytes(models[0]) - 1)
    model = PagedModel(models[0], kv_cache_precision="f32", num_blocks=64)
    assert model.static is None and not model.taps_optional
    drafter = BlockDrafter(models[1], kv_cache_precision="f32", num_blocks=64)
    costs = fixed_cost(1e-3, 1e-5), fixed_cost(1e-4, 1e-5)
    speculation = Scripted(drafter.max_candidates, drafter.candidate_offset, *costs, learn_host=False)
    speculation.pace.backoff = MAX_PLAN_BACKOFF
    scheduler = Scheduler(model, drafter, speculation=speculation)
    request = scheduler.add_request(list(range(3, 24)), GenerationConfig(max_new_tokens=12))
    for _ in range(6):
        scheduler.step()
    assert request.gap == 0 and request.taps_len == 26 == request.target_len


def test_a_pinned_draft_length_keeps_the_taps_on(models):
    """A request that pins k drafts every step: leaving its taps out would cost a catch-up every step."""
    rng = np.random.default_rng(5)
    prompts = [rng.integers(0, VOCAB, n).tolist() for n in (12, 20)]
    configs = [GenerationConfig(max_new_tokens=30, num_assistant_tokens=k) for k in (3, 5)]
    alone = serve(Scheduler(PagedModel(models[0], kv_cache_precision="f32", num_blocks=64)), prompts, configs, [0, 0])
    scheduler, _, untapped_calls = idle_pipeline(models)

    assert serve(scheduler, prompts, configs, [0, 0], alone) == alone
    assert scheduler.metrics.requests.num_accepted_tokens > 0
    assert scheduler.metrics.catch_up_rows == 0 and not untapped_calls, "calls left out the taps a pinned k needs"


def test_a_model_too_big_for_copies_and_a_sibling_keeps_its_taps(models, monkeypatch):
    """The sibling's copies cost as much memory as the model's: a model gets one only while both fit the budget of
    the largest model with copies alone."""
    monkeypatch.setattr(paged_model, "MAX_WEIGHT_BYTES", 2 * weight_bytes(models[0]) - 1)
    model = PagedModel(models[0], kv_cache_precision="f32", num_blocks=16)
    assert model.static is not None and not model.can_skip_taps
    assert TAPS in call(model, 0, 0, [1, 2, 3], False, False), "a call asked without taps ran in a sibling"
