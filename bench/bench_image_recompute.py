"""Preempting a request that shows an image: what keeping its embeddings holds against what recomputing them costs.

A preempted request gives its KV blocks back and is prefilled again later. Its image rows can come back two ways:
kept on the request (the tower's output, `rows x hidden` f32), or recomputed by running the vision tower again,
which needs the image kept instead (its pixel values as the tower takes them, or at least the resized uint8 image)
plus one tower call. The language model's prefill of the placeholder rows is the same either way, so it is left out.

The tower is a random Qwen3.5-family one at a published geometry (default: 27 blocks of width 1152, 16 heads, MLP
4304, patch 16, 2 x 2 merge: Qwen3-VL's SigLIP2-so400m size) whose merger writes rows of the language model's width
(--hidden, default 4096), exported alone through ovbuild.export and run by VisionEncoder, one image per call as the
serving path does. Per image side: the median seconds of a tower call (the cache bypassed), the peak extra RSS during
one, and the bytes each option keeps per image.

    python bench/bench_image_recompute.py [--width 1152] [--depth 27] [--hidden 4096] [--sides 448] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from bench_vision import PUBLISHED_PROCESSOR, peak_memory
from PIL import Image

from ovbuild.export import export
from ovbuild.llm import PROCESSORS
from ovbuild.runtime.vision.encoder import VisionEncoder
from ovbuild.testing.tiny_hybrid import write_tiny_hybrid_target

import harness


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=1152, help="the tower's width (default %(default)s)")
    parser.add_argument("--depth", type=int, default=27, help="the tower's blocks (default %(default)s)")
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--mlp", type=int, default=4304, help="the tower's MLP width (default %(default)s)")
    parser.add_argument("--hidden", type=int, default=4096, help="the language model's width (default %(default)s)")
    parser.add_argument("--sides", type=int, nargs="+", default=[448], help="square image sides (default 448)")
    harness.add_arguments(parser, rounds=3)
    args = parser.parse_args()
    harness.start(__doc__.splitlines()[0])
    tower = dict(
        depth=args.depth,
        hidden_size=args.width,
        num_heads=args.heads,
        intermediate_size=args.mlp,
        patch_size=16,
        num_position_embeddings=2304,
        out_hidden_size=args.hidden,
    )
    print(f"tower: {args.depth} blocks of width {args.width}, {args.heads} heads, MLP {args.mlp}; rows {args.hidden} wide")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        ckpt = write_tiny_hybrid_target(root / "c", vision=tower, preprocessor=PUBLISHED_PROCESSOR)
        export(ckpt, root / "t", weight_format="keep", quiet=True)
        encoder = VisionEncoder(root / "t")
        processor = PROCESSORS[encoder.record.family].from_folder(root / "t")
        print("| image | tokens | keep embeddings | keep pixel values | keep uint8 image | tower call | tower peak RSS |")
        print("|---|---|---|---|---|---|---|")
        for side in args.sides:
            pixels = np.random.default_rng(args.seed + side).integers(0, 256, (side, side, 3), dtype=np.uint8)
            processed = processor.process(Image.fromarray(pixels))
            inputs = encoder.checked(processed.pixel_values, processed.grid)
            encoder.infer(*inputs)  # warm-up
            seconds = []
            for _ in range(args.rounds):
                start = time.perf_counter()
                embeds = encoder.infer(*inputs)
                seconds.append(time.perf_counter() - start)
            _, rss, _ = peak_memory(lambda: encoder.infer(*inputs))  # noqa: B023 (called at once)
            # the resized uint8 image the pixel values come from: 3 bytes per pixel, P x P pixels per patch
            patches = int(np.prod(processed.grid[0]))
            uint8 = patches * encoder.record.patch_size**2 * 3
            mib = lambda n: f"{n / 2**20:.2f} MiB"  # noqa: E731
            print(
                f"| {side} x {side} | {embeds.shape[0]} | {mib(embeds.nbytes)} | {mib(processed.pixel_values.nbytes)} "
                f"| {mib(uint8)} | {statistics.median(seconds):.2f} s | {mib(rss)} |"
            )


if __name__ == "__main__":
    main()
