"""A target that takes images, compiled (f32, f32 KV cache), against the numpy reference: several sequences packed
into each call over several steps, some showing images (random embeddings stand in for a vision tower's), some text
only, an image span cut between two prefill chunks; and the same IR with no image rows and equal axes gives the text
IR's logits exactly."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from ovbuild.graph.hybrid_target import build_hybrid_target
from ovbuild.ir import ImageKeys
from ovbuild.ir.ports import IMAGE_ROWS, MROPE_OFFSETS, PLACED_EMBEDS
from ovbuild.reference.hybrid import HybridReference
from ovbuild.reference.moe import MoeHybridReference
from ovbuild.runtime.cache.kv_cache import SequenceRows
from ovbuild.runtime.images import ImageInput, prompt_positions
from ovbuild.runtime.model.paged_model import PagedModel
from ovbuild.targets import load_target
from ovbuild.testing import F32_NMSE, nmse
from ovbuild.testing.tiny_hybrid import write_tiny_hybrid_target
from ovbuild.testing.tiny_moe import write_tiny_moe_target
from ovbuild.weights.checkpoint import Checkpoint

from paged_helpers import RESERVED_TOKENS

TAPS = (0, 2, 3)
HIDDEN = 64
RNG = np.random.default_rng(5)


def image(start: int, grid: tuple[int, int, int]) -> ImageInput:
    return ImageInput(start, RNG.standard_normal((int(np.prod(grid)), HIDDEN)).astype(np.float32), grid)


# sequence -> (prompt length, images); sequence 2 is text only
PROMPTS = {
    0: (30, [image(4, (1, 3, 4))]),
    1: (40, [image(2, (1, 2, 2)), image(12, (2, 2, 3))]),
    2: (17, []),
}
# each call: (sequence, rows) packed; the prompts run in chunks (sequence 0's image is cut by its first chunk), then
# a few decode rows continue after the prompt
SCHEDULE = [
    [(0, 9), (1, 14), (2, 17)],
    [(0, 21), (1, 26), (2, 1)],
    [(0, 1), (1, 1), (2, 3)],
    [(1, 2), (0, 4)],
]


@pytest.fixture(scope="module", params=["dense", "moe"])
def target(request, tmp_path_factory):
    write = write_tiny_hybrid_target if request.param == "dense" else write_tiny_moe_target
    cfg, weights = load_target(Checkpoint.open(write(tmp_path_factory.mktemp(request.param) / "t")))
    reference = HybridReference if cfg.moe is None else MoeHybridReference
    return cfg, weights, reference(cfg, weights)


def test_the_ir_records_what_it_takes(target):
    cfg, weights, _ = target
    model = build_hybrid_target(cfg, weights, TAPS)
    names = {p.get_any_name() for p in model.inputs}
    assert {MROPE_OFFSETS, PLACED_EMBEDS, IMAGE_ROWS} <= names
    assert ImageKeys.from_model(model) == ImageKeys((1, 1, 2), True)
    text = build_hybrid_target(dataclasses.replace(cfg, mrope=None), weights, TAPS)
    assert not {MROPE_OFFSETS, PLACED_EMBEDS, IMAGE_ROWS} & {p.get_any_name() for p in text.inputs}
    assert ImageKeys.from_model(text) is None


def run_schedule(model: PagedModel, reference: HybridReference, cfg, prompts, schedule):
    """Run the schedule through the IR and the reference: NMSE per output name, and the IR's logits."""
    rng = np.random.default_rng(3)
    tokens = {s: rng.integers(0, 256, n + 16).tolist() for s, (n, _) in prompts.items()}
    layout = {s: prompt_positions(n, images) for s, (n, images) in prompts.items()}
    done, states, caches = {}, {}, {}
    got, want = {}, {}

    def keep(name, a, b):
        got.setdefault(name, []).append(np.asarray(a, np.float64).ravel())
        want.setdefault(name, []).append(np.asarray(b, np.float64).ravel())

    conv = (cfg.conv_dim, cfg.linear_conv_kernel_dim - 1)
    rec = (cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim)
    for call in schedule:
        rows, ids, pos, offsets, image_rows, embeds, spans = [], [], [], [], [], [], []
        for seq, n in call:
            past = done.get(seq, 0)
            model.cache.allocator.reserve(seq, RESERVED_TOKENS)
            rows.append(SequenceRows(seq, past, n))
            index = np.arange(past, past + n)
            prompt_len, images = prompts[seq]
            positions, delta = layout[seq]
            axes = np.where(
                index < prompt_len, positions[:, np.minimum(index, prompt_len - 1)], index + delta
            )  # [3, n]
            local_rows, local_embeds = [], []
            for im in images:  # the image rows this call holds
                inside = np.arange(max(im.start, past), min(im.end, past + n))
                local_rows += (inside - past).tolist()
                local_embeds += [im.embeds[inside - im.start]]
            spans.append((seq, past, n, axes, local_rows, local_embeds))
            image_rows += [len(ids) + r for r in local_rows]
            embeds += local_embeds
            ids += tokens[seq][past : past + n]
            pos += index.tolist()
            offsets.append((axes - index).T)
        inputs = {
            "input_ids": np.array(ids, np.int64),
            "position_ids": np.array(pos, np.int64),
            "logits_indices": np.arange(len(ids), dtype=np.int64),
            "state_rows": np.array(np.cumsum([n for _, n in call]) - 1, np.int64),  # each sequence's last row
            MROPE_OFFSETS: np.concatenate(offsets),
            IMAGE_ROWS: np.array(image_rows, np.int64),
            PLACED_EMBEDS: np.concatenate(embeds) if embeds else np.zeros((0, HIDDEN), np.float32),
        }
        for i in cfg.linear_layers:
            held = [states.get(s, {}).get(i, (np.zeros(conv, np.float32), np.zeros(rec, np.float32))) for s, _ in call]
            inputs[f"conv_state.{i}"] = np.stack([c for c, _ in held])
            inputs[f"recurrent_state.{i}"] = np.stack([r for _, r in held])
        out = {k: v.copy() for k, v in model.run(rows, inputs).items()}
        begin = 0
        for k, (seq, past, n, axes, local_rows, local_embeds) in enumerate(spans):
            cache = caches.setdefault(seq, reference.new_cache())
            shown = (np.array(local_rows, np.int64), np.concatenate(local_embeds)) if local_rows else None
            logits, taps = reference.forward(cache, np.array(tokens[seq][past : past + n]), TAPS, False, axes, shown)
            keep("logits", out["logits"][begin : begin + n], logits)
            keep("hidden_states", out["hidden_states"][begin : begin + n], taps)
            for i in cfg.linear_layers:
                keep("recurrent_state", out[f"recurrent_state_out.{i}"][k], cache.recurrent[i])
            states[seq] = {
                i: (out[f"conv_state_out.{i}"][k], out[f"recurrent_state_out.{i}"][k]) for i in cfg.linear_layers
            }
            done[seq] = past + n
            begin += n
    return {name: nmse(np.concatenate(got[name]), np.concatenate(want[name])) for name in got}, got["logits"]


def test_image_prompts_match_the_reference(target):
    cfg, weights, reference = target
    model = PagedModel(build_hybrid_target(cfg, weights, TAPS), kv_cache_precision="f32")
    figures, logits = run_schedule(model, reference, cfg, PROMPTS, SCHEDULE)
    text = ", ".join(f"{k} {v:.1e}" for k, v in figures.items())
    print(f"{cfg.family} target with images vs reference NMSE: {text}")
    for name, value in figures.items():
        assert value < F32_NMSE, f"{cfg.family} target with images vs reference: {name} NMSE {value:.2e} ({text})"
    # not vacuous: without the images (placeholder embeddings, text positions) every sequence that showed one
    # answers otherwise, and the text-only sequence alike
    plain = PagedModel(build_hybrid_target(cfg, weights, TAPS), kv_cache_precision="f32")
    without = {s: (n, []) for s, (n, _) in PROMPTS.items()}
    figures, other = run_schedule(plain, reference, cfg, without, SCHEDULE)
    assert figures["logits"] < F32_NMSE, f"text positions vs reference: logits NMSE {figures['logits']:.2e}"
    seqs = [s for call in SCHEDULE for s, _ in call]
    for seq, a, b in zip(seqs, logits, other, strict=True):
        assert np.array_equal(a, b) == (seq == 2), f"sequence {seq}"


@pytest.mark.parametrize("shift", [0, 7])
def test_no_images_and_equal_axes_give_the_text_irs_logits(target, shift):
    """With no image rows and every axis at position_ids + shift, the IR's logits are the text IR's at
    position_ids + shift, bit for bit."""
    cfg, weights, _ = target
    vision = PagedModel(build_hybrid_target(cfg, weights, TAPS), kv_cache_precision="f32")
    text = PagedModel(
        build_hybrid_target(dataclasses.replace(cfg, mrope=None), weights, TAPS), kv_cache_precision="f32"
    )
    rng = np.random.default_rng(9)
    lengths = [11, 5, 23]
    ids = rng.integers(0, 256, sum(lengths))
    pos = np.concatenate([np.arange(n) for n in lengths])
    base = {
        "input_ids": ids,
        "logits_indices": np.arange(len(ids), dtype=np.int64),
        "state_rows": np.array(np.cumsum(lengths) - 1, np.int64),
    }
    for i in cfg.linear_layers:
        base[f"conv_state.{i}"] = np.zeros((3, cfg.conv_dim, cfg.linear_conv_kernel_dim - 1), np.float32)
        shape = (3, cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim)
        base[f"recurrent_state.{i}"] = np.zeros(shape, np.float32)
    outputs = []
    for model, extra in (
        (text, {"position_ids": pos + shift}),
        (
            vision,
            {
                "position_ids": pos,
                MROPE_OFFSETS: np.full((len(ids), 3), shift, np.int64),
                IMAGE_ROWS: np.zeros(0, np.int64),
                PLACED_EMBEDS: np.zeros((0, HIDDEN), np.float32),
            },
        ),
    ):
        rows = [SequenceRows(s, 0, n) for s, n in enumerate(lengths)]
        for s in range(len(lengths)):
            model.cache.allocator.reserve(s, RESERVED_TOKENS)
        outputs.append({k: v.copy() for k, v in model.run(rows, {**base, **extra}).items()})
    assert np.array_equal(outputs[0]["logits"], outputs[1]["logits"]), (
        f"logits NMSE {nmse(outputs[1]['logits'], outputs[0]['logits']):.2e}"
    )
    assert np.array_equal(outputs[0]["hidden_states"], outputs[1]["hidden_states"])
