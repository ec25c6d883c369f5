"""What a call costs right after the other model's call: a speculative step runs the target and the draft in turn, so
neither finds its weights and threads as its previous call left them.

On the demo pair: draft calls back to back, each after a target call, each after 1.5 ms of sleep (idle threads, no
eviction) and each after 1.5 ms of busy host work (the calling thread spinning); the same for a draft compiled with
one inference thread, whose calls run in the calling thread (no worker to wake); target calls back to back and each
after a draft call. Side by side in one process, interleaved rounds in a new order each round, medians.

    python bench/bench_model_switch.py [--rounds 7] [--calls 60]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from ovbuild.ir import read_ir
from ovbuild.runtime.drafters.block import BlockDrafter
from ovbuild.runtime.machine import describe
from ovbuild.runtime.padding import DRAFT_PADDING
from ovbuild.runtime.paged_model import PagedModel

from bench_row_padding import demo_pair, draft_call, rounds, show, target_call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=60)
    args = parser.parse_args()
    print(describe())
    calls = range(args.calls)
    with tempfile.TemporaryDirectory(prefix="ovbuild_switch_") as tmp:
        target, _, draft_dir = demo_pair(Path(tmp))
        drafter = BlockDrafter.from_folder(draft_dir)
        one_thread = BlockDrafter.from_folder(draft_dir)  # takes no plugin properties: its model is swapped for one
        one_thread.model = PagedModel(
            read_ir(draft_dir), "CPU", "u8", properties={"INFERENCE_NUM_THREADS": "1"}, padding=DRAFT_PADDING
        )

        def after(first, then) -> float:
            first()
            return then()

        def spin(seconds: float) -> None:
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                pass

        rng = np.random.default_rng(0)
        for label, d in (("demo draft", drafter), ("demo draft, one inference thread", one_thread)):
            print(f"\n{label} (3 context rows, a block proposing 4 tokens):")
            cases = {
                "back to back": lambda d=d: [draft_call(d, 3) for _ in calls],
                "each after a 4-row target call": lambda d=d: [
                    after(lambda: target_call(target, 4), lambda: draft_call(d, 3)) for _ in calls
                ],
                "each after 1.5 ms of sleep": lambda d=d: [
                    after(lambda: time.sleep(0.0015), lambda: draft_call(d, 3)) for _ in calls
                ],
                "each after 1.5 ms of busy host work": lambda d=d: [
                    after(lambda: spin(0.0015), lambda: draft_call(d, 3)) for _ in calls
                ],
            }
            show(rounds(cases, args.rounds, rng), "back to back")
        print("\ndemo target (4 rows):")
        cases = {
            "back to back": lambda: [target_call(target, 4) for _ in calls],
            "each after a draft call": lambda: [
                after(lambda: draft_call(drafter, 3), lambda: target_call(target, 4)) for _ in calls
            ],
        }
        show(rounds(cases, args.rounds, rng), "back to back")
        print(f"\n(per call: median of {args.calls} calls per round, median over {args.rounds} rounds)")


if __name__ == "__main__":
    main()
