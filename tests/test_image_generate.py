"""Requests that show images, through the scheduler: the target alone answers as the numpy reference does, the draft
changes nothing (dense and MoE targets, the draft as it is and steered), prefix caching and preemption change
nothing, and a cached block is reused only behind the same image."""

from __future__ import annotations

import numpy as np
import pytest
from test_speculative import assert_accepted

from ovbuild.errors import RequestError, UnsupportedError
from ovbuild.export import export
from ovbuild.families import load_draft
from ovbuild.graph.dflash import build_dflash_draft
from ovbuild.graph.hybrid_target import build_hybrid_target
from ovbuild.llm import LLM
from ovbuild.reference.hybrid import HybridReference
from ovbuild.reference.moe import MoeHybridReference
from ovbuild.runtime.images import ImageInput, ImagePrompt
from ovbuild.runtime.model.paged_model import PagedModel
from ovbuild.runtime.request import GenerationConfig
from ovbuild.runtime.scheduler import Scheduler
from ovbuild.runtime.speculation.drafters import BlockDrafter
from ovbuild.targets import load_target
from ovbuild.testing.planner import fixed_speculation
from ovbuild.testing.steered import SteeredDrafter
from ovbuild.testing.tiny_hybrid import TINY_HYBRID, write_tiny_hybrid_dflash, write_tiny_hybrid_target
from ovbuild.testing.tiny_moe import write_tiny_moe_target
from ovbuild.weights.checkpoint import Checkpoint

F32 = dict(kv_cache_precision="f32")
IMAGE, START, END = (
    TINY_HYBRID["image_token_id"],
    TINY_HYBRID["vision_start_token_id"],
    TINY_HYBRID["vision_end_token_id"],
)
HIDDEN = 64


@pytest.fixture(scope="module", params=["dense", "moe"])
def pair(request, tmp_path_factory):
    """(target config and weights, target IR with the draft's taps, draft IR) of a target that takes images."""
    root = tmp_path_factory.mktemp(request.param)
    write = write_tiny_hybrid_target if request.param == "dense" else write_tiny_moe_target
    tcfg, tweights = load_target(Checkpoint.open(write(root / "target")))
    dcfg, dweights = load_draft(Checkpoint.open(write_tiny_hybrid_dflash(root / "draft")))
    yield (
        (tcfg, tweights),
        build_hybrid_target(tcfg, tweights, dcfg.target_layer_ids),
        build_dflash_draft(dcfg, dweights, tweights),
    )
    del dweights


def make(pair, draft: bool = False, steer: int | None = None, caching: bool = False, blocks: int = 64, budget=24):
    _, target_ir, draft_ir = pair
    target = PagedModel(target_ir, num_blocks=blocks, state_slots=4, **F32)
    target.cache_manager.keep_snapshots(target.cache.block_size, 16)
    drafter = BlockDrafter(draft_ir, num_blocks=64, **F32) if draft else None
    if drafter is not None and steer is not None:
        drafter = SteeredDrafter(drafter, TINY_HYBRID["text_config"]["vocab_size"], seed=steer)
    return Scheduler(
        target,
        drafter,
        max_num_batched_tokens=budget,
        enable_prefix_caching=caching,
        speculation=fixed_speculation(drafter),
    )


def embeds(seed: int, grid: tuple[int, int, int]) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((int(np.prod(grid)), HIDDEN)).astype(np.float32)


def shown(before: list[int], pictures: list[tuple[int, tuple[int, int, int]]], after: list[int]):
    """A prompt: text, then each picture (embedding seed, grid) between vision markers, then text; and its images."""
    ids, images = list(before), []
    for seed, grid in pictures:
        ids.append(START)
        images.append(ImageInput(len(ids), embeds(seed, grid), grid))
        ids += [IMAGE] * int(np.prod(grid)) + [END]
    ids += after
    return ids, ImagePrompt.of(len(ids), images)


def prompts(seed: int = 0):
    """Four requests: images of three sizes (one request shows two), and one text-only."""
    rng = np.random.default_rng(seed)
    text = lambda n: rng.integers(0, 256, n).tolist()  # noqa: E731
    return [
        shown(text(5), [(1, (1, 3, 4))], text(7)),
        shown(text(3), [(2, (1, 2, 2)), (3, (1, 4, 5))], text(4)),
        (text(19), None),
        shown(text(11), [(4, (2, 2, 3))], text(2)),
    ]


def serve(scheduler: Scheduler, waves, config: GenerationConfig, truths=None) -> list:
    """Each wave's requests added together once the wave before has finished; returns the requests."""
    requests = []
    for wave in waves:
        for ids, images in wave:
            requests.append(scheduler.add_request(ids, config, images=images))
            if truths is not None:
                scheduler.drafter.truths[requests[-1].id] = [*ids, *truths[len(requests) - 1]]
        while scheduler.has_unfinished():
            scheduler.step()
    allocator = scheduler.target.cache.allocator
    assert allocator.free_blocks == allocator.num_blocks and not allocator.tables
    return requests


def reference_answer(ref: HybridReference, ids: list[int], images: ImagePrompt | None, n: int) -> list[int]:
    """Greedy tokens of the reference: the prompt with its images and positions, then each token at index + delta."""
    cache, out = ref.new_cache(), []
    positions = None if images is None else images.positions
    shown_rows = None
    if images is not None:
        rows, pieces = images.rows(0, len(ids))
        shown_rows = (np.array(rows), np.concatenate(pieces))
    logits, _ = ref.forward(cache, np.array(ids), positions=positions, images=shown_rows)
    delta = 0 if images is None else images.delta
    for _ in range(n):
        out.append(int(logits[-1].argmax()))
        index = cache.length
        logits, _ = ref.forward(cache, np.array(out[-1:]), positions=np.full((3, 1), index + delta))
    return out


def test_target_alone_answers_as_the_reference(pair):
    (cfg, weights), _, _ = pair
    config = GenerationConfig(max_new_tokens=8)
    requests = serve(make(pair, budget=16), [prompts()], config)  # 16-row calls cut the images between chunks
    ref = (HybridReference if cfg.moe is None else MoeHybridReference)(cfg, weights)
    for request, (ids, images) in zip(requests, prompts(), strict=True):
        assert request.generated == reference_answer(ref, ids, images, 8)
    # not vacuous: the images change the answers
    blind = serve(make(pair, budget=16), [[(ids, None) for ids, _ in prompts()]], config)
    assert [r.generated for r in blind] != [r.generated for r in requests]


@pytest.mark.parametrize("k", [3, None])
def test_the_draft_changes_nothing(pair, k):
    config = GenerationConfig(max_new_tokens=24, num_assistant_tokens=k)
    alone = [r.generated for r in serve(make(pair), [prompts(1)], config)]
    assert [r.generated for r in serve(make(pair, draft=True), [prompts(1)], config)] == alone
    steered = make(pair, draft=True, steer=k or 5)
    assert [r.generated for r in serve(steered, [prompts(1)], config, truths=alone)] == alone
    if k is not None:
        assert_accepted(steered, k, every_length=False)


def conversation(seed: int):
    """A long shared text, one picture, a question: the same image again, and another image of the same size."""
    rng = np.random.default_rng(seed)
    system = rng.integers(0, 256, 40).tolist()
    question = rng.integers(0, 256, 9).tolist()
    same = shown(system, [(7, (1, 4, 6))], question)
    again = shown(system, [(7, (1, 4, 6))], question[:5])
    other = shown(system, [(8, (1, 4, 6))], question)
    return same, again, other


@pytest.mark.parametrize("draft", [False, True], ids=["alone", "draft"])
def test_prefix_caching_reuses_blocks_only_behind_the_same_image(pair, draft):
    same, again, other = conversation(3)
    config = GenerationConfig(max_new_tokens=10, num_assistant_tokens=3 if draft else None)
    waves = [[same], [again, other]]
    reference = [r.generated for r in serve(make(pair, draft=draft), waves, config)]
    scheduler = make(pair, draft=draft, caching=True)
    requests = serve(scheduler, waves, config)
    assert [r.generated for r in requests] == reference
    block = scheduler.target.cache.block_size
    image_start = same[1].images[0].start
    # the same image: every whole block of the shorter prompt; another image behind the same ids: the text before it
    assert requests[1].num_cached_tokens == (len(again[0]) - 1) // block * block > image_start
    assert requests[2].num_cached_tokens == image_start // block * block
    assert same[0] == other[0]  # the placeholder ids are the same


@pytest.mark.parametrize("caching", [False, True], ids=["plain", "caching"])
def test_preemption_recomputes_from_the_kept_embeddings(pair, caching):
    config = GenerationConfig(max_new_tokens=40)
    reference = [r.generated for r in serve(make(pair), [prompts(2)], config)]
    scheduler = make(pair, draft=True, caching=caching, blocks=5)  # 32-token blocks: the four requests need 10
    assert [r.generated for r in serve(scheduler, [prompts(2)], config)] == reference
    assert scheduler.metrics.num_preemptions > 0


def test_a_text_target_refuses_images(pair, tmp_path):
    (cfg, weights), _, _ = pair
    text = PagedModel(build_hybrid_target(cfg.text_only(), weights), num_blocks=16, **F32)
    ids, images = prompts()[0]
    with pytest.raises(UnsupportedError, match="takes no images"):
        Scheduler(text, None).add_request(ids, GenerationConfig(max_new_tokens=2), images=images)


def test_llm_generate_takes_image_inputs(tmp_path):
    """The public seam: LLM.generate(ids, images=[ImageInput, ...]) on exported folders, with the draft and without,
    one prompt and several."""
    target, draft = write_tiny_hybrid_target(tmp_path / "ct"), write_tiny_hybrid_dflash(tmp_path / "cd")
    export(target, tmp_path / "t", draft_of=draft, weight_format="keep", quiet=True)
    export(draft, tmp_path / "d", target_model=target, weight_format="keep", quiet=True)
    llm = LLM(tmp_path / "t", tmp_path / "d")
    (ids, images), (ids2, images2), (text, _), _ = prompts(4)
    pictures = list(images.images)
    one = llm.generate(ids, images=pictures, max_new_tokens=12, ignore_eos=True)
    assert one == llm.generate(ids, images=pictures, max_new_tokens=12, ignore_eos=True, use_draft=False)
    assert one != llm.generate(ids, max_new_tokens=12, ignore_eos=True)  # the placeholders alone answer otherwise
    many = llm.generate([ids, text, ids2], images=[pictures, None, images2], max_new_tokens=12, ignore_eos=True)
    assert many[0] == one
    with pytest.raises(RequestError, match="images for 2 prompts"):
        llm.generate([ids, text, ids2], images=[pictures, None], max_new_tokens=2)
