"""Every draft family with image prompts: greedy answers with the draft equal the target alone's, on a hybrid dense
target, a MoE one and MiniCPM-V 4.7 (1B-like and A3B-like: crops between markers, canvas positions), with several
requests of different image sizes at once, prefix caching on and off, and preemption in a small block pool. The
draft length is pinned, and steered drafts accept, so the draft really drafts at and after the image rows."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
from test_image_generate import embeds, serve, shown

from ovbuild.families import FAMILIES, build_draft_models, load_draft
from ovbuild.graph.hybrid_target import build_hybrid_target
from ovbuild.ir import save_ir
from ovbuild.runtime.canvas_positions import CanvasMarkers, canvas_positions
from ovbuild.runtime.images import ImageInput, ImagePrompt
from ovbuild.runtime.model.paged_model import PagedModel
from ovbuild.runtime.request import GenerationConfig
from ovbuild.runtime.scheduler import Scheduler
from ovbuild.runtime.speculation.drafters import DRAFTERS
from ovbuild.targets import load_target
from ovbuild.testing.planner import fixed_speculation
from ovbuild.testing.steered import SteeredDrafter
from ovbuild.testing.tiny_hybrid import (
    TINY_HYBRID,
    write_tiny_hybrid_dflash,
    write_tiny_hybrid_dflash2,
    write_tiny_hybrid_target,
)
from ovbuild.testing.tiny_moe import write_tiny_hybrid_dspark, write_tiny_minicpmv, write_tiny_moe_target
from ovbuild.weights.checkpoint import Checkpoint

F32 = dict(kv_cache_precision="f32")
VOCAB = TINY_HYBRID["text_config"]["vocab_size"]
IMAGE = TINY_HYBRID["image_token_id"]
TARGETS = {
    "dense": write_tiny_hybrid_target,
    "moe": write_tiny_moe_target,
    "minicpmv_1b": partial(write_tiny_minicpmv, kind="1b"),
    "minicpmv_a3b": partial(write_tiny_minicpmv, kind="a3b"),
}
# every published kind of every draft family, written for the tiny hybrid targets (hidden 64, 4 layers)
DRAFTS = {
    "dflash": write_tiny_hybrid_dflash,
    "dflash2": write_tiny_hybrid_dflash2,
    **{f"dspark_{kind}": partial(write_tiny_hybrid_dspark, kind=kind) for kind in ("vanilla", "gated")},
    "dspark_deepspec_dflash": partial(write_tiny_hybrid_dspark, kind="deepspec_dflash"),
}
# MiniCPM-V 4.7's markers (any ids of the vocabulary: the target reads the positions, not the marker ids)
MARKERS = CanvasMarkers(slice_start=262, slice_end=263, image_start=264, image_end=265, newline=10)
MERGE = 4  # "16x": a crop of h x w patches is (h / 4) x (w / 4) tokens


def cases(quick_targets: tuple[str, ...], options: tuple = (None,)) -> list:
    """(target, draft[, option]) cases, those whose target is not in `quick_targets` or whose option is not the
    first marked slow."""
    out = []
    for t in TARGETS:
        for d in DRAFTS:
            for option in options:
                quick = t in quick_targets and option == options[0]
                values, name = ((t, d), f"{t}-{d}") if option is None else ((t, d, option), f"{t}-{d}-{option}")
                out.append(pytest.param(*values, id=name, marks=() if quick else pytest.mark.slow))
    return out


def test_every_family_kind_is_covered():
    assert set(DRAFTS) == {name for family in FAMILIES for name in family.tiny}


class Models:
    """Targets, target IRs (by taps) and exported draft folders, each built once and only when a test asks."""

    def __init__(self, root):
        self.root, self.targets, self.irs, self.drafts, self.alone = root, {}, {}, {}, {}

    def target(self, name: str):
        if name not in self.targets:
            self.targets[name] = load_target(Checkpoint.open(TARGETS[name](self.root / name)))
        return self.targets[name]

    def draft(self, target: str, kind: str):
        """(draft family, target IR with the draft's taps, exported draft folder)."""
        if (target, kind) not in self.drafts:
            cfg, weights = self.target(target)
            dcfg, dweights = load_draft(Checkpoint.open(DRAFTS[kind](self.root / f"{kind}_ckpt")))
            folder = self.root / f"{target}_{kind}"
            for stem, model in build_draft_models(dcfg, dweights, weights).items():
                save_ir(model, folder / f"{stem}.xml")
            taps = (target, tuple(dcfg.target_layer_ids))
            if taps not in self.irs:
                self.irs[taps] = build_hybrid_target(cfg, weights, dcfg.target_layer_ids)
            self.drafts[target, kind] = (dcfg.family, self.irs[taps], folder)
        return self.drafts[target, kind]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return Models(tmp_path_factory.mktemp("image_families"))


def scheduler(target_ir, drafter=None, caching: bool = False, blocks: int = 64, budget: int = 16) -> Scheduler:
    """A scheduler over f32 caches; a 16-row budget cuts the images between prefill chunks."""
    target = PagedModel(target_ir, num_blocks=blocks, state_slots=4, **F32)
    target.cache_manager.keep_snapshots(target.cache.block_size, 16)
    return Scheduler(
        target,
        drafter,
        max_num_batched_tokens=budget,
        enable_prefix_caching=caching,
        speculation=fixed_speculation(drafter),
    )


def canvas_shown(before: list[int], pictures: list[tuple[int, tuple[int, int], int, int]], after: list[int]):
    """A MiniCPM-V 4.7 prompt: text, then each picture (seed, overview size in patches, slice rows, slice columns;
    slices of 8 x 8 patches) as the processor lays it out, then text; and its ImagePrompt with canvas positions."""
    ids, sizes, starts = list(before), [], []

    def crop(size: tuple[int, int], opener: int, closer: int) -> None:
        ids.append(opener)
        starts.append(len(ids))
        sizes.append(size)
        ids.extend([IMAGE] * (size[0] * size[1] // MERGE**2))
        ids.append(closer)

    for _, overview, rows, cols in pictures:
        crop(overview, MARKERS.image_start, MARKERS.image_end)
        for r in range(rows):
            if r:
                ids.append(MARKERS.newline)
            for _ in range(cols):
                crop((8, 8), MARKERS.slice_start, MARKERS.slice_end)
    ids += after
    positions, _ = canvas_positions(ids, [int(t == IMAGE) for t in ids], sizes, MARKERS, MERGE)
    seeds = [seed * 100 + k for seed, _, rows, cols in pictures for k in range(1 + rows * cols)]
    images = []
    for seed, start, (h, w) in zip(seeds, starts, sizes, strict=True):
        grid = (1, 1, h * w // MERGE**2)
        images.append(ImageInput(start, embeds(seed, grid), grid, f"picture {seed}"))
    return ids, ImagePrompt.of(len(ids), images, positions)


def prompts(target: str, seed: int):
    """Four requests: images of several sizes (one request shows two), and one text-only."""
    rng = np.random.default_rng(seed)
    text = lambda n: rng.integers(0, 256, n).tolist()  # noqa: E731
    if target.startswith("minicpmv"):
        return [
            canvas_shown(text(5), [(1, (8, 12), 0, 0)], text(7)),
            canvas_shown(text(3), [(2, (8, 8), 1, 2), (3, (12, 8), 0, 0)], text(4)),
            (text(19), None),
            canvas_shown(text(11), [(4, (16, 8), 2, 1)], text(2)),
        ]
    return [
        shown(text(5), [(1, (1, 3, 4))], text(7)),
        shown(text(3), [(2, (1, 2, 2)), (3, (1, 4, 5))], text(4)),
        (text(19), None),
        shown(text(11), [(4, (1, 2, 3))], text(2)),
    ]


def conversation(target: str, seed: int):
    """A long shared text, one picture, a question: the same image again, and another image of the same size."""
    rng = np.random.default_rng(seed)
    system, question = rng.integers(0, 256, 40).tolist(), rng.integers(0, 256, 20).tolist()
    show = (lambda s: canvas_shown(system, [(s, (8, 8), 1, 2)], question)) if target.startswith("minicpmv") else None
    show = show or (lambda s: shown(system, [(s, (1, 4, 6))], question))
    same, other = show(7), show(8)
    again = (same[0][:-4], ImagePrompt.of(len(same[0]) - 4, list(same[1].images), same[1].positions[:, :-4]))
    return same, again, other


def alone(models: Models, target: str, target_ir, key: str, waves, config: GenerationConfig) -> list[list[int]]:
    """The target alone's answers to `waves`, no caching, a large pool (once per target and key)."""
    if (target, key) not in models.alone:
        models.alone[target, key] = [r.generated for r in serve(scheduler(target_ir), waves, config)]
    return models.alone[target, key]


def drafter_of(family: str, folder, steer_seed: int | None = None):
    drafter = DRAFTERS[family].from_folder(folder, num_blocks=64, **F32)
    return drafter if steer_seed is None else SteeredDrafter(drafter, VOCAB, seed=steer_seed)


@pytest.mark.parametrize(("target", "kind"), cases(("dense", "minicpmv_1b")))
def test_the_draft_changes_nothing(models, target, kind):
    """Four requests at once, prefill chunks cutting the images: the drafter as it is (draft length 3), and steered
    to accept (draft length 5, every accepted-prefix length): the target alone's tokens."""
    family, target_ir, folder = models.draft(target, kind)
    requests = prompts(target, 1)
    reference = alone(models, target, target_ir, "concurrent", [requests], GenerationConfig(max_new_tokens=24))
    raw = scheduler(target_ir, drafter_of(family, folder))
    got = serve(raw, [requests], GenerationConfig(max_new_tokens=24, num_assistant_tokens=3))
    assert [r.generated for r in got] == reference
    assert raw.metrics.requests.num_draft_tokens > 0, "the draft proposed nothing"
    steered = scheduler(target_ir, drafter_of(family, folder, steer_seed=5))
    got = serve(steered, [requests], GenerationConfig(max_new_tokens=24, num_assistant_tokens=5), truths=reference)
    assert [r.generated for r in got] == reference
    totals = steered.metrics.requests
    assert totals.num_accepted_tokens > 0 and totals.accepted_histogram[5] > 0, f"{totals.accepted_histogram}"


@pytest.mark.parametrize(("target", "kind"), cases(("dense",)))
def test_prefix_caching_with_the_draft_is_exact(models, target, kind):
    """The same image again hits the cached blocks (the draft's context rows reused with them), another image behind
    the same placeholder ids does not: the answers equal the target alone's without caching."""
    family, target_ir, folder = models.draft(target, kind)
    same, again, other = conversation(target, 3)
    waves = [[same], [again, other]]
    reference = alone(models, target, target_ir, "conversation", waves, GenerationConfig(max_new_tokens=10))
    cached = scheduler(target_ir, drafter_of(family, folder, steer_seed=2), caching=True)
    requests = serve(cached, waves, GenerationConfig(max_new_tokens=10, num_assistant_tokens=3), truths=reference)
    assert [r.generated for r in requests] == reference
    assert cached.metrics.requests.num_accepted_tokens > 0
    block = cached.target.cache.block_size
    assert requests[1].num_cached_tokens == (len(again[0]) - 1) // block * block > same[1].images[0].start
    assert requests[2].num_cached_tokens == same[1].images[0].start // block * block


@pytest.mark.parametrize(("target", "kind", "caching"), cases(("dense",), (True, False)))
def test_preemption_with_the_draft_is_exact(models, target, kind, caching):
    """Five blocks of 32 tokens for four requests that need ten: requests are preempted and recomputed from their
    kept embeddings, the draft's context with them."""
    family, target_ir, folder = models.draft(target, kind)
    requests = prompts(target, 2)
    reference = alone(models, target, target_ir, "long", [requests], GenerationConfig(max_new_tokens=40))
    small = scheduler(target_ir, drafter_of(family, folder, steer_seed=4), caching=caching, blocks=5, budget=24)
    got = serve(small, [requests], GenerationConfig(max_new_tokens=40, num_assistant_tokens=3), truths=reference)
    assert [r.generated for r in got] == reference
    assert small.metrics.num_preemptions > 0
    assert small.metrics.requests.num_accepted_tokens > 0
