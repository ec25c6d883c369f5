"""Prefix caching on the tiny hybrid pair whatever the draft-length planner does: a request starts on the target's
cached prefix even when the draft's cache lacks it (a draft that drafted for nobody never wrote those context rows),
outputs equal the target alone's, and a request that drafts after such a hit first catches up on the taps it missed,
from the zero state or from a kept state snapshot, so that its draft sees its whole context in order, image rows
included."""

from __future__ import annotations

import numpy as np
import pytest
from test_hybrid_speculative import VOCAB, hybrid  # noqa: F401 (the module fixture)
from test_image_generate import shown
from test_untapped import Recording, Scripted

from ovbuild.reference.hybrid import HybridReference
from ovbuild.reference.layers import nmse
from ovbuild.runtime import catch_up, draft_step
from ovbuild.runtime.images import ImagePrompt
from ovbuild.runtime.model.paged_model import PagedModel
from ovbuild.runtime.request import GenerationConfig, Request
from ovbuild.runtime.scheduler import Scheduler
from ovbuild.runtime.speculation.drafters import BlockDrafter
from ovbuild.testing.planner import fixed_cost, fixed_speculation

F32 = dict(kv_cache_precision="f32")
IDLE = GenerationConfig(max_new_tokens=10)  # the planner's choice: with a dear draft, no draft in any step
PINNED = GenerationConfig(max_new_tokens=10, num_assistant_tokens=3)  # drafts every step
LONG = GenerationConfig(max_new_tokens=60)  # room for the planner to come back from its backoff and draft


def target(hybrid, num_blocks: int = 64) -> PagedModel:  # noqa: F811
    model = PagedModel(hybrid[1], num_blocks=num_blocks, state_slots=4, **F32)
    model.cache_manager.keep_snapshots(model.cache.block_size, 16)  # a snapshot every block
    return model


def scheduler(hybrid, drafter=None, speculation=None, caching: bool = True, num_blocks: int = 64) -> Scheduler:  # noqa: F811
    model = target(hybrid, num_blocks)
    return Scheduler(model, drafter, 64, speculation=speculation, enable_prefix_caching=caching)


def idle_scheduler(hybrid, caching: bool = True, num_blocks: int = 64) -> Scheduler:  # noqa: F811
    """The DFlash draft with a planner that finds drafting dear: a draft call costs a second."""
    drafter = BlockDrafter(hybrid[2], num_blocks=64, **F32)
    return scheduler(hybrid, drafter, fixed_speculation(drafter, draft=(1.0, 1e-3)), caching, num_blocks)


def turns(scheduler: Scheduler, configs: list[GenerationConfig], seed: int = 0, between=None) -> list[Request]:
    """A chat: each turn resends the history (the last prompt, its answer and a new user message of 10 tokens);
    between(request): called once the request is added."""
    rng = np.random.default_rng(seed)
    history, requests = rng.integers(0, VOCAB, 70).tolist(), []
    for config in configs:
        requests.append(scheduler.add_request(history, config))
        if between is not None:
            between(requests[-1])
        while scheduler.has_unfinished():
            scheduler.step()
        history = [*history, *requests[-1].generated, *rng.integers(0, VOCAB, 10).tolist()]
    return requests


def test_turns_hit_the_target_cache_while_the_planner_drafts_for_nobody(hybrid):  # noqa: F811
    alone = turns(scheduler(hybrid), [IDLE] * 3)
    cold = idle_scheduler(hybrid, caching=False)
    recomputed = turns(cold, [IDLE] * 3)
    served = idle_scheduler(hybrid)
    requests = turns(served, [IDLE] * 3)
    assert [r.generated for r in requests] == [r.generated for r in alone] == [r.generated for r in recomputed]
    assert served.metrics.requests.num_draft_tokens == 0, "the dear draft drafted"
    hits = [r.num_cached_tokens for r in requests]
    assert all(hits[1:]), f"turns after the first found {hits[1:]} tokens cached"
    assert hits == [r.num_cached_tokens for r in alone], "the draft's empty cache cut the target's hits"
    assert served.metrics.prefix_cache_hits == sum(hits)
    computed = served.metrics.prefix_cache_queries - served.metrics.prefix_cache_hits
    assert computed == cold.metrics.prefix_cache_queries - sum(hits)


def test_turns_hit_both_caches_while_the_draft_drafts(hybrid):  # noqa: F811
    alone = turns(scheduler(hybrid), [IDLE] * 3)
    served = idle_scheduler(hybrid)
    requests = turns(served, [PINNED] * 3)
    assert [r.generated for r in requests] == [r.generated for r in alone]
    assert served.metrics.requests.num_draft_tokens > 0
    assert [r.num_cached_tokens for r in requests] == [r.num_cached_tokens for r in alone]
    # the draft's cache held every prefix the target's did: no tap of a cached prefix was computed again
    assert served.metrics.catch_up_rows == 0


class Resuming(Recording):
    """Also keeps the row each sequence's draft context started at (its draft cache's prefix hit)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.begins: dict[int, int] = {}

    def resume(self, seq_id: int, length: int) -> None:
        super().resume(seq_id, length)
        self.begins[seq_id] = length


@pytest.mark.parametrize("drafted_first", [False, True], ids=["from-zero-state", "from-snapshot"])
def test_a_request_on_a_target_only_hit_catches_up_before_it_drafts(hybrid, drafted_first, monkeypatch):  # noqa: F811
    """Turns that did not draft leave the draft's cache behind the target's. The last turn starts on the target's
    hit, runs some steps without drafting, then the planner drafts for it: the target first computes the taps the
    draft lacks, starting from the zero state (no turn drafted) or from the snapshot where the draft's own hit ends
    (the first turn drafted), and the draft then sees every row from its hit on, in order."""
    cfg, weights = hybrid[0]
    configs = [PINNED if drafted_first else IDLE, IDLE, LONG]
    alone = turns(scheduler(hybrid), configs)
    truths = [[*r.prompt.tolist(), *r.generated] for r in alone]
    drafter = Resuming(BlockDrafter(hybrid[2], num_blocks=64, **F32), VOCAB, seed=4)
    costs = fixed_cost(1e-3, 1e-5), fixed_cost(1e-4, 1e-5)  # drafting pays once the draft is right
    speculation = Scripted(drafter.max_candidates, drafter.candidate_offset, *costs, host_s=1e-4, learn_host=False)
    served = scheduler(hybrid, drafter, speculation)
    starts = []  # (request, row its catch-up starts at)
    monkeypatch.setattr(draft_step, "catch_up", spy(starts, served.target))
    quiet_steps = []

    def steer(request: Request) -> None:
        drafter.truths[request.id] = truths[len(drafter.truths)]
        speculation.quiet = True
        if len(drafter.truths) == 3:  # the last turn: a few steps without drafts, then the planner's own choice
            for _ in range(4):
                served.step()
            quiet_steps.append(len(request.generated))
            speculation.quiet = False

    requests = turns(served, configs, between=steer)

    assert [r.generated for r in requests] == [r.generated for r in alone]
    last = requests[-1]
    assert last.num_cached_tokens == alone[-1].num_cached_tokens > 0
    assert quiet_steps[0] > 0 and served.metrics.requests.num_accepted_tokens > 0
    begin = drafter.begins[last.id]
    assert [s for r, s in starts if r is last] == [begin], f"catch-ups started at {starts}, the draft at {begin}"
    if drafted_first:
        assert 0 < begin < last.num_cached_tokens, f"the draft resumed at {begin} of {last.num_cached_tokens}"
    else:
        assert begin == 0
    given = np.concatenate(drafter.contexts[last.id])  # every context row the draft was given, in order
    ref = HybridReference(cfg, weights)
    _, expected = ref.forward(ref.new_cache(), np.array(truths[2]), drafter.target_layer_ids)
    error = nmse(given, expected[begin : begin + len(given)])
    assert error < 1e-6, f"the draft's context from row {begin}: NMSE {error:.2e} against the reference's taps"


def spy(starts: list, model: PagedModel):
    """ovbuild.runtime.catch_up.catch_up, noting where each request's catch-up starts."""

    def noting(target, requests, max_rows):
        before = {r.id: catch_up.catch_up_start(model, r)[0] for r in requests}
        caught = catch_up.catch_up(target, requests, max_rows)
        starts.extend((r, before[r.id]) for r in caught)
        return caught

    return noting


def test_a_catch_up_over_an_image_gives_the_draft_the_image_rows_taps(hybrid, monkeypatch):  # noqa: F811
    """Turn 1 shows an image and does not draft; turn 2 resends it, starts on the target's hit past the image, then
    drafts: its catch-up runs from row 0 over the image with the image's embeddings and three-axis positions, so the
    draft's context is the reference's taps of the whole conversation, image rows included."""
    cfg, weights = hybrid[0]
    rng = np.random.default_rng(6)
    ids, images = shown(rng.integers(0, VOCAB, 20).tolist(), [(7, (1, 4, 6))], rng.integers(0, VOCAB, 9).tolist())

    def chat(served: Scheduler, speculation: Scripted | None = None, truths=None) -> list[Request]:
        first = served.add_request(ids, IDLE, images=images)
        served.run()
        again = [*ids, *first.generated, *rng_again]
        second = served.add_request(again, LONG, images=ImagePrompt.of(len(again), list(images.images)))
        if truths is not None:
            served.drafter.truths |= {first.id: truths[0], second.id: truths[1]}
        for _ in range(4 if speculation is not None else 0):
            served.step()
        if speculation is not None:
            speculation.quiet = False
        served.run()
        return [first, second]

    rng_again = rng.integers(0, VOCAB, 8).tolist()
    alone = chat(scheduler(hybrid))
    truths = [[*r.prompt.tolist(), *r.generated] for r in alone]
    drafter = Resuming(BlockDrafter(hybrid[2], num_blocks=64, **F32), VOCAB, seed=4)
    costs = fixed_cost(1e-3, 1e-5), fixed_cost(1e-4, 1e-5)
    speculation = Scripted(drafter.max_candidates, drafter.candidate_offset, *costs, host_s=1e-4, learn_host=False)
    served = scheduler(hybrid, drafter, speculation)
    starts = []
    monkeypatch.setattr(draft_step, "catch_up", spy(starts, served.target))
    requests = chat(served, speculation, truths)

    assert [r.generated for r in requests] == [r.generated for r in alone]
    last = requests[1]
    assert last.num_cached_tokens == alone[1].num_cached_tokens > images.images[0].end
    assert [s for r, s in starts if r is last] == [0] and drafter.begins[last.id] == 0
    assert served.metrics.requests.num_accepted_tokens > 0
    given = np.concatenate(drafter.contexts[last.id])
    ref, prompt = HybridReference(cfg, weights), last.images
    rows, pieces = prompt.rows(0, len(last.prompt))
    cache = ref.new_cache()
    _, taps = ref.forward(
        cache, last.prompt, drafter.target_layer_ids, positions=prompt.positions, images=(rows, np.concatenate(pieces))
    )
    after = np.arange(len(last.prompt), len(truths[1])) + prompt.delta
    _, more = ref.forward(cache, np.array(last.generated), drafter.target_layer_ids, positions=np.stack([after] * 3))
    expected = np.concatenate([taps, more])
    error = nmse(given, expected[: len(given)])
    assert error < 1e-6, f"the draft's context over the image: NMSE {error:.2e} against the reference's taps"


def test_samples_of_one_prompt_compute_it_once_while_the_planner_drafts_for_nobody(hybrid):  # noqa: F811
    """n samples of a prompt queued together: the first prefills it, the others start on its blocks in the target's
    cache (the draft's holds none of them), and each sample draws what it draws alone."""
    prompt = np.random.default_rng(8).integers(0, VOCAB, 90).tolist()
    configs = [GenerationConfig(max_new_tokens=6, do_sample=True, temperature=0.9, rng_seed=seed) for seed in range(3)]
    served = idle_scheduler(hybrid)
    together = [served.add_request(prompt, c) for c in configs]
    served.run()
    block = served.target.cache.block_size
    assert [r.num_cached_tokens for r in together] == [0, (89 // block) * block, (89 // block) * block]
    for request, config in zip(together, configs, strict=True):
        alone = scheduler(hybrid, caching=False)
        alone.add_request(prompt, config)
        assert alone.run()[0].generated == request.generated


def test_preempted_requests_resume_on_the_target_hit_and_stay_exact(hybrid):  # noqa: F811
    """A target cache too small for every request at once: preempted requests come back on the target's cached
    blocks (the draft's holds none), and every output is the target alone's with room for everyone."""
    rng = np.random.default_rng(9)
    system = rng.integers(0, VOCAB, 40).tolist()
    prompts = [[*system, *rng.integers(0, VOCAB, int(n)).tolist()] for n in (10, 25, 5, 30)]
    config = GenerationConfig(max_new_tokens=30)
    alone = scheduler(hybrid, caching=False)
    reference = [alone.add_request(p, config) for p in prompts]
    alone.run()
    served = idle_scheduler(hybrid, num_blocks=8)
    requests = [served.add_request(p, config) for p in prompts]
    served.run()
    assert [r.generated for r in requests] == [r.generated for r in reference]
    assert served.metrics.num_preemptions > 0 and served.metrics.prefix_cache_hits > 0
