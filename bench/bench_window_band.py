"""Cost of the in-block window band: draft call time with and without it, side by side in one run.

A bidirectional sliding layer whose window is below the block gets a query-to-query band (qq_bias) so that block
rows `window` or more apart do not see each other; drafts whose window is at least the block get none, and their IR
must be byte-identical to a build without the mechanism. For both kinds of v2 draft (window 16 and window 4, block 8,
hidden 512, both layers sliding) this prints the median draft call time of a decode-like pack (8 sequences with 64
cached context rows, each 3 new context rows + a block) and of a prefill-like chunk (1 sequence, 2,040 context rows
+ a block), built without the band ("before") and with it ("after").

    python bench/bench_window_band.py [--calls 20] [--kv-cache-precision u8]
"""

from __future__ import annotations

import argparse
import hashlib
import re
import statistics
import tempfile
import time
from pathlib import Path
from unittest import mock

import numpy as np
import openvino as ov

from ovbuild.families import load_draft
from ovbuild.graph import dflash
from ovbuild.graph.dflash2 import build_dflash2_draft
from ovbuild.graph.paged_attention import PagedInputs
from ovbuild.runtime.kv_cache import SequenceRows
from ovbuild.runtime.paged_model import PagedModel
from ovbuild.targets import load_target
from ovbuild.testing import TINY_DFLASH2, write_tiny_dflash2, write_tiny_target
from ovbuild.weights.checkpoint import Checkpoint

GEOMETRY = dict(hidden_size=512, intermediate_size=1536, num_attention_heads=8, num_key_value_heads=2, head_dim=64)
BLOCK = 8


def build(cfg, weights, target_weights, band: bool) -> ov.Model:
    """The v2 draft IR; band=False builds it as before the band existed (PagedAttention's window alone)."""
    if band:
        return build_dflash2_draft(cfg, weights, target_weights)
    with mock.patch.object(dflash, "PagedInputs", lambda **_: PagedInputs()):
        return build_dflash2_draft(cfg, weights, target_weights)


def ir_digest(model: ov.Model, folder: Path) -> str:
    """sha256 of the serialized xml + bin, auto-generated node names (`Multiply_1234`, a per-process counter) masked."""
    ov.save_model(model, folder / "m.xml", compress_to_fp16=False)
    xml = re.sub(r'"([A-Za-z0-9]+)_\d+"', r'"\1_#"', (folder / "m.xml").read_text())
    return hashlib.sha256(xml.encode() + (folder / "m.bin").read_bytes()).hexdigest()


def pack(cfg, sequences: list[tuple[int, int, int]], rng) -> tuple[list[SequenceRows], dict[str, np.ndarray]]:
    """(seq, past, new context rows) per sequence, each followed by a full block."""
    rows, ids, tt, pos, cand, start = [], [], [], [], [], 0
    for seq, past, n_ctx in sequences:
        n = n_ctx + BLOCK
        rows.append(SequenceRows(seq, past, n))
        ids += [cfg.mask_token_id] * n_ctx + [5] + [cfg.mask_token_id] * (BLOCK - 1)
        tt += [0] * n_ctx + [1] * BLOCK
        pos += range(past, past + n)
        cand += range(start + n_ctx + 1, start + n)
        start += n
    width = cfg.num_taps * cfg.target_hidden_size
    inputs = {
        "input_ids": np.array(ids, np.int64),
        "token_type_ids": np.array(tt, np.int32),
        "position_ids": np.array(pos, np.int64),
        "hidden_states": rng.standard_normal((start, width)).astype(np.float32),
        "candidate_indices": np.array(cand, np.int64),
    }
    return rows, inputs


def median_ms(models: list[PagedModel], rows, inputs, calls: int) -> list[float]:
    """Median call time of each model, calls interleaved so that load changes on the machine hit all alike."""
    times = [[] for _ in models]
    for i in range(calls + 1):
        for j in range(len(models)) if i % 2 else reversed(range(len(models))):
            start = time.perf_counter()
            models[j].run(rows, inputs)
            if i:  # call 0 is the warm-up (first-inference allocations)
                times[j].append(time.perf_counter() - start)
    return [1e3 * statistics.median(t) for t in times]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--kv-cache-precision", default="u8")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        _, tweights = load_target(Checkpoint.open(write_tiny_target(tmp / "t", **GEOMETRY)))
        print(f"v2 draft: 2 sliding layers, hidden 512, 8 heads / 2 KV heads, block {BLOCK}; median of {args.calls}")
        print(f"{'window':>6} {'IR before == after':>18} {'workload':>9} {'before ms':>9} {'after ms':>9} {'ratio':>6}")
        for window in (16, 4):
            nested = {**TINY_DFLASH2["dflash_config"], "block_size": BLOCK}
            folder = write_tiny_dflash2(
                tmp / f"w{window}",
                sliding_window=window,
                dflash_config=nested,
                layer_types=["sliding_attention"] * 2,
                target_hidden_size=GEOMETRY["hidden_size"],
                **GEOMETRY,
            )
            cfg, weights = load_draft(Checkpoint.open(folder))
            irs = {band: build(cfg, weights, tweights, band) for band in (False, True)}
            (tmp / f"ir{window}a").mkdir(), (tmp / f"ir{window}b").mkdir()
            same = ir_digest(irs[False], tmp / f"ir{window}a") == ir_digest(irs[True], tmp / f"ir{window}b")
            models = {band: PagedModel(m, kv_cache_precision=args.kv_cache_precision) for band, m in irs.items()}
            decode = [(s, 64, 3) for s in range(8)]
            for model in models.values():  # commit 64 context rows per sequence first
                for s in range(8):
                    rows, inputs = pack(cfg, [(s, 0, 64)], rng)
                    model.run(rows, inputs)
            for name, sequences in (("decode", decode), ("prefill", [(100, 0, 2040)])):
                rows, inputs = pack(cfg, sequences, rng)
                before, after = median_ms([models[False], models[True]], rows, inputs, args.calls)
                print(f"{window:>6} {same!s:>18} {name:>9} {before:>9.2f} {after:>9.2f} {after / before:>5.2f}x")


if __name__ == "__main__":
    main()
