"""Vision serving benchmark: time to first token of a chat with a 448 x 448 image on `ovbuild serve`, cold (the image
is new: the vision tower runs) against warm (the same request again: the encoder's cache answers and the tower is not
called), and the peak extra memory of the vision step of one prompt with 8 images, which the encoder runs one image
per tower call.

The target is a random Qwen3.5-family checkpoint written here with ovbuild.testing: a vision tower of width --width
(patch 16, 2 x 2 merge, as published: a 448 x 448 image is 28 x 28 patches, 196 tokens) on the tiny language model,
exported with its tower, so the figures are the vision side's. The server runs in this process (uvicorn on a thread)
with prefix caching off, so that a warm request differs from its cold twin by the tower call alone; each round draws
a new image and sends it twice, cold then warm (that order is the point), and checks both answers are equal. The
tower's calls are counted by wrapping the encoder's IR call.

Memory: `ServedImages.prepare` (read, decode, process, encode, place) on 8 new images, with tracemalloc tracing the
host arrays (numpy's buffers: pixels, embeddings) and /proc/self/statm sampled every millisecond for the resident
size (OpenVINO's activations are not numpy's); then the same 8 images in ONE tower call, for contrast.

    python bench/bench_vision.py [--width 384] [--depth 4] [--rounds 5]

With --preemption it measures instead what a preempted request that shows an image keeps against what recomputing
its rows costs. Its rows come back either kept on the request (the tower's output, `rows x hidden` f32) or made again
by the tower, which needs the image kept instead (its pixel values as the tower takes them, or at least the resized
uint8 image) plus a tower call; the language model's prefill of the placeholder rows is the same either way, so it is
left out. The tower is full size by default (transformers' Qwen3_5VisionConfig defaults: 27 blocks of width 1152,
16 heads, MLP 4304, patch 16, 2 x 2 merge) with rows --hidden wide (Qwen3_5TextConfig's default 4096). Per image
side: the bytes each option keeps, the median seconds of a tower call (the encoder's cache bypassed) and the extra
RSS of a warm call (the compiled tower keeps its buffers from its first call).

    python bench/bench_vision.py --preemption [--width 1152] [--depth 27] [--hidden 4096] [--sides 448 896]
"""

from __future__ import annotations

import argparse
import base64
import io
import os
import statistics
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path

import numpy as np
from openai import OpenAI
from PIL import Image

from ovbuild.export import export
from ovbuild.llm import PROCESSORS
from ovbuild.runtime.pipeline import RuntimeOptions
from ovbuild.runtime.vision.encoder import VisionEncoder
from ovbuild.serve.server import BackgroundServer, build_app
from ovbuild.testing.tiny_hybrid import write_tiny_hybrid_target

import harness

SIDE = 448
PUBLISHED_PROCESSOR = dict(patch_size=16, size={"shortest_edge": 65536, "longest_edge": 16777216})


def picture_url(seed: int) -> str:
    """A new random 448 x 448 PNG as a data URL."""
    pixels = np.random.default_rng(seed).integers(0, 256, (SIDE, SIDE, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def messages(urls: list[str], question: str = "What is in the picture?") -> list[dict]:
    parts = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": question}]}]


def ttft(client: OpenAI, url: str, max_tokens: int) -> harness.Measured:
    """Seconds from the request to its first streamed text, and the whole answer."""
    start, first, text = time.perf_counter(), None, []
    stream = client.chat.completions.create(
        model="vl", messages=messages([url]), stream=True, max_tokens=max_tokens, extra_body={"ignore_eos": True}
    )
    for chunk in stream:
        piece = chunk.choices[0].delta.content if chunk.choices else None
        if piece and first is None:
            first = time.perf_counter() - start
        text.append(piece or "")
    return harness.Measured(first if first is not None else time.perf_counter() - start, "".join(text))


def count_calls(encoder) -> list:
    """Wrap the encoder's IR call: one entry per tower call from now on."""
    calls, infer = [], encoder.infer

    def counted(pixels, grid):
        calls.append(len(grid))
        return infer(pixels, grid)

    encoder.infer = counted
    return calls


def rss_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_memory(step) -> tuple[int, int, object]:
    """(tracemalloc peak of `step` over its start, sampled RSS peak over the RSS before it, its result)."""
    peak, running = [rss_bytes()], True

    def sample():
        while running:
            peak.append(rss_bytes())
            time.sleep(0.001)

    base = peak[0]
    sampler = threading.Thread(target=sample, daemon=True)
    tracemalloc.start()
    tracemalloc.reset_peak()
    start = tracemalloc.get_traced_memory()[0]
    sampler.start()
    try:
        result = step()
    finally:
        running = False
        sampler.join()
        traced = tracemalloc.get_traced_memory()[1] - start
        tracemalloc.stop()
    return traced, max(peak) - base, result


def preemption(args: argparse.Namespace) -> None:
    """Per image side: the bytes kept by holding the rows, the pixel values or the uint8 image, and a tower call."""
    tower = dict(
        depth=args.depth or 27,
        hidden_size=args.width or 1152,
        num_heads=args.heads,
        intermediate_size=args.mlp,
        patch_size=16,
        num_position_embeddings=2304,
        out_hidden_size=args.hidden,
    )
    print(
        f"preemption: tower {tower['depth']} blocks of width {tower['hidden_size']}, {args.heads} heads, MLP "
        f"{args.mlp}; rows {args.hidden} wide; tower calls: median of {args.rounds}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        ckpt = write_tiny_hybrid_target(root / "c", vision=tower, preprocessor=PUBLISHED_PROCESSOR)
        export(ckpt, root / "t", weight_format="keep", quiet=True)
        encoder = VisionEncoder(root / "t")
        processor = PROCESSORS[encoder.record.family].from_folder(root / "t")
        print(
            "| image | rows | keep rows | keep pixel values | keep uint8 image | tower call | warm call's extra RSS |"
        )
        print("|---|---|---|---|---|---|---|")
        for side in args.sides:
            pixels = np.random.default_rng(args.seed + side).integers(0, 256, (side, side, 3), dtype=np.uint8)
            processed = processor.process(Image.fromarray(pixels))
            inputs = encoder.checked(processed.pixel_values, processed.grid)
            encoder.infer(*inputs)  # the first call allocates the tower's buffers
            seconds = []
            for _ in range(args.rounds):
                start = time.perf_counter()
                embeds = encoder.infer(*inputs)
                seconds.append(time.perf_counter() - start)
            _, rss, _ = peak_memory(lambda: encoder.infer(*inputs))  # noqa: B023 (called at once)
            uint8 = int(np.prod(processed.grid[0])) * encoder.record.patch_size**2 * 3  # P x P RGB pixels a patch
            mib = lambda n: f"{n / 2**20:.2f} MiB"  # noqa: E731
            print(
                f"| {side} x {side} | {embeds.shape[0]} | {mib(embeds.nbytes)} | {mib(processed.pixel_values.nbytes)} "
                f"| {mib(uint8)} | {statistics.median(seconds):.2f} s | {mib(rss)} |"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, help="the vision tower's width (default 384; 1152 with --preemption)")
    parser.add_argument("--depth", type=int, help="the vision tower's blocks (default 4; 27 with --preemption)")
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument("--preemption", action="store_true", help="kept rows against a tower call (see above)")
    parser.add_argument("--heads", type=int, default=16, help="--preemption: the tower's heads (default 16)")
    parser.add_argument("--mlp", type=int, default=4304, help="--preemption: the tower's MLP width (default 4304)")
    parser.add_argument("--hidden", type=int, default=4096, help="--preemption: the rows' width (default 4096)")
    parser.add_argument("--sides", type=int, nargs="+", default=[448, 896], help="--preemption: square image sides")
    harness.add_arguments(parser, rounds=5)
    args = parser.parse_args()
    harness.start(__doc__.splitlines()[0])
    if args.preemption:
        preemption(args)
        return
    args.width, args.depth = args.width or 384, args.depth or 4
    heads = max(1, args.width // 64)
    tower = dict(
        depth=args.depth,
        hidden_size=args.width,
        num_heads=heads,
        intermediate_size=4 * args.width,
        patch_size=16,
        num_position_embeddings=2304,  # a 48 x 48 learned grid, as published
    )
    print(f"tower: width {args.width}, {args.depth} blocks, {heads} heads, patch 16; image {SIDE} x {SIDE}")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        ckpt = write_tiny_hybrid_target(root / "c", vision=tower, preprocessor=PUBLISHED_PROCESSOR)
        export(ckpt, root / "t", weight_format="keep", quiet=True)
        app = build_app(root / "t", options=RuntimeOptions(enable_prefix_caching=False), name="vl")
        served = app.state.model.images
        calls = count_calls(served.prompter.encoder)
        with BackgroundServer(app) as server:
            client = OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=600)
            rounds, tower_calls = harness.Rounds({"cold": [], "warm": []}), {"cold": [], "warm": []}
            for r in range(args.rounds + 1):  # round 0 warms the server up and is not counted
                url = picture_url(args.seed * 1000 + r)
                for name in ("cold", "warm"):
                    before = len(calls)
                    measured = ttft(client, url, args.max_tokens)
                    if r:
                        rounds.seconds[name].append(measured.seconds)
                        rounds.outputs[name] = measured.output
                        tower_calls[name].append(len(calls) - before)
                if r:
                    harness.require_equal(rounds.outputs, "cold")
        print(f"TTFT, one {SIDE} x {SIDE} image (median of {args.rounds} rounds; tower calls per request):")
        harness.report(rounds, base="cold")
        for name, counts in tower_calls.items():
            print(f"  {name}: tower calls {counts}")

        # 8 new images in one prompt, encoded one per call as the server does
        urls = [picture_url(10**6 + i) for i in range(8)]
        content, shown = served.message_content(messages(urls)[0]["content"], "messages[0]")
        text = app.state.model.chat_template.render([{"role": "user", "content": content}])
        before = len(calls)
        traced, rss, (ids, prompt) = peak_memory(lambda: served.prepare(text, shown, app.state.model.limits))
        embeds = sum(image.embeds.nbytes for image in prompt.images)
        processed = served.prompter.processor.process(Image.open(io.BytesIO(base64.b64decode(urls[0][22:]))))
        print(
            f"8 images, one prompt of {len(ids)} tokens: {len(calls) - before} tower calls; peak extra host arrays "
            f"(tracemalloc) {traced / 2**20:.1f} MiB, peak extra RSS {rss / 2**20:.1f} MiB; one image's pixel values "
            f"{processed.pixel_values.nbytes / 2**20:.2f} MiB, the 8 images' embeddings {embeds / 2**20:.2f} MiB"
        )
        encoder = served.prompter.encoder
        inputs = [served.processed(u, "bench") for u in urls]
        pixels = np.concatenate([p.pixel_values for p in inputs])
        grid = np.concatenate([p.grid for p in inputs])
        traced, rss, _ = peak_memory(lambda: encoder.infer(*encoder.checked(pixels, grid)))
        print(
            f"  the same 8 in ONE tower call (for contrast, measured after): peak extra host arrays "
            f"{traced / 2**20:.1f} MiB, peak extra RSS {rss / 2**20:.1f} MiB"
        )


if __name__ == "__main__":
    main()
