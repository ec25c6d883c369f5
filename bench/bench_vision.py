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
"""

from __future__ import annotations

import argparse
import base64
import io
import os
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path

import numpy as np
from openai import OpenAI
from PIL import Image

from ovbuild.export import export
from ovbuild.runtime.pipeline import RuntimeOptions
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=384, help="the vision tower's width (default %(default)s)")
    parser.add_argument("--depth", type=int, default=4, help="the vision tower's blocks (default %(default)s)")
    parser.add_argument("--max-tokens", type=int, default=4)
    harness.add_arguments(parser, rounds=5)
    args = parser.parse_args()
    harness.start(__doc__.splitlines()[0])
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
