"""Serving benchmark: `ovbuild serve` on the shipped demo pair, N concurrent streaming clients, with the draft and
with the target alone, side by side in one run.

Each side runs the real command in a subprocess on a free loopback port, both at once (on the demo pair the target
alone is the target exported without taps, as one serves it without a draft), warmed up. A burst sends every
client's request at once (the prompts cycle through the demo's code starts) and reads the streams; every round runs
one burst per side, in a new random order. It reports aggregate tokens/s (completion tokens over the wall time of the
whole burst), TTFT p50 / p99 (request sent to first text received, queueing included), the acceptance the server's
/metrics counted, and the speed-up as the median of per-round ratios.

With --baseline SRC (the source tree of another ovbuild revision, e.g. a `git worktree add` of it), every side
also runs from that tree, in the same rounds: the ratio of each side to its baseline tells whether a change made
serving slower.

    python bench/bench_serve.py [--clients 16 64] [--max-tokens 64] [--rounds 5] [--seed 0]
                                [--target DIR --draft DIR (exported)] [--baseline SRC]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from ovbuild.demo import DEMO_PROMPTS, export_pair, shipped_pair
from ovbuild.export import export

import harness

BASELINE = " (baseline)"  # the suffix of the sides served from --baseline's tree
PROMPTS = [*DEMO_PROMPTS, "def read(path):\n", "import sys\n\n", "    for i in range(", "    return "]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`ovbuild serve` in a subprocess, ready once /health answers."""

    def __init__(self, target: Path, draft: Path | None, source: Path | None = None):
        """source: the tree whose ovbuild serves (None: the one this benchmark imports)."""
        self.port = free_port()
        cmd = [sys.executable, "-m", "ovbuild.cli", "serve", "--target", str(target), "--served-model-name", "demo"]
        cmd += ["--port", str(self.port), "--log-level", "warning", "--max-requests", "1024"]
        cmd += ["--draft", str(draft)] if draft else []
        env = {**os.environ, "PYTHONPATH": str(source)} if source else None
        self.process = subprocess.Popen(cmd, env=env)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("ovbuild serve did not start")
            time.sleep(0.2)

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(30)


async def one(http: httpx.AsyncClient, prompt: str, max_tokens: int) -> tuple[float, int, str]:
    """(TTFT in s, completion tokens, text) of one streaming greedy request."""
    body = {"model": "demo", "prompt": prompt, "max_tokens": max_tokens, "stream": True}
    body["stream_options"] = {"include_usage": True}
    start, ttft, tokens, text = time.perf_counter(), None, 0, ""
    async with http.stream("POST", "/v1/completions", json=body) as answer:
        async for line in answer.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk["choices"] and chunk["choices"][0]["text"]:
                ttft = time.perf_counter() - start if ttft is None else ttft
                text += chunk["choices"][0]["text"]
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return ttft if ttft is not None else float("nan"), tokens, text


async def burst(url: str, clients: int, max_tokens: int) -> tuple[float, list[float], int, list[str]]:
    limits = httpx.Limits(max_connections=clients + 4)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as http:
        start = time.perf_counter()
        results = await asyncio.gather(*(one(http, PROMPTS[i % len(PROMPTS)], max_tokens) for i in range(clients)))
        wall = time.perf_counter() - start
    return wall, [r[0] for r in results], sum(r[1] for r in results), [r[2] for r in results]


def counters(url: str) -> dict[str, float]:
    out = {}
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith("ovbuild_spec_decode"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def burst_row(server: Server, clients: int, max_tokens: int) -> dict:
    """One burst of `clients` streaming requests: tokens/s, TTFTs and the acceptance the server's /metrics counted."""
    before = counters(server.url)
    wall, ttfts, tokens, texts = asyncio.run(burst(server.url, clients, max_tokens))
    after = counters(server.url)
    drafts, accepted = (
        after.get(name, 0) - before.get(name, 0)
        for name in ("ovbuild_spec_decode_num_drafts_total", "ovbuild_spec_decode_num_accepted_tokens_total")
    )
    return {"tokens_per_s": tokens / wall, "ttfts": ttfts, "drafts": drafts, "accepted": accepted, "texts": texts}


def side_by_side(sides: dict[str, Server], client_counts: list[int], max_tokens: int, rounds: int, seed: int) -> dict:
    """Every side's burst once per round, in a new random order each round (harness.interleave), every side's texts
    equal to the target alone's: {clients: (rounds of seconds per token, {side: [row per round]})}."""
    for server in sides.values():
        asyncio.run(burst(server.url, 4, 8))  # warm-up: first-call allocations stay out of the figures
    runs = {}
    for clients in client_counts:
        rows: dict[str, list[dict]] = {side: [] for side in sides}

        def case(side: str, clients: int = clients, rows: dict = rows) -> harness.Measured:
            rows[side].append(burst_row(sides[side], clients, max_tokens))
            return harness.Measured(1 / rows[side][-1]["tokens_per_s"], rows[side][-1]["texts"])

        cases = {side: functools.partial(case, side) for side in sides}
        timed = harness.interleave(cases, rounds, seed=seed + clients, warmup=False)
        harness.require_equal(timed.outputs, "target alone")
        runs[clients] = (timed, rows)
    return runs


def report(runs: dict, max_tokens: int, rounds: int) -> None:
    print(
        f"\novbuild serve, {max_tokens} tokens per request, streaming clients all at once, {rounds} rounds interleaved"
    )
    print("(tokens/s and TTFT: medians over rounds; speed-up: median of per-round ratios to the target alone, min-max)")
    print(f"{'clients':>7} {'side':>23} {'tokens/s':>9} {'TTFT p50':>9} {'TTFT p99':>9} {'tau':>5}  speed-up")
    for clients, (timed, sides) in runs.items():
        for side, rows in sides.items():
            speed = [row["tokens_per_s"] for row in rows]
            p50, p99 = (statistics.median(float(np.percentile(r["ttfts"], q)) * 1e3 for r in rows) for q in (50, 99))
            drafts = sum(r["drafts"] for r in rows)
            tau = 1 + sum(r["accepted"] for r in rows) / drafts if drafts else 1.0
            base = side.removesuffix(BASELINE)
            ratio = "" if side == "target alone" else str(timed.ratio("target alone", side))
            if base != side:  # a baseline side: this revision's side against it
                ratio = f"{base} at this revision, speed / baseline: {timed.ratio(side, base)}"
            print(
                f"{clients:>7} {side:>23} {statistics.median(speed):>9.1f} {p50:>7.0f}ms {p99:>7.0f}ms {tau:>5.2f}  "
                f"{ratio}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--target", help="exported target folder (default: the shipped demo pair, exported now)")
    parser.add_argument("--draft", help="exported draft folder")
    parser.add_argument("--baseline", type=Path, help="source tree of another ovbuild revision to serve side by side")
    harness.add_arguments(parser, rounds=5)
    args = parser.parse_args()
    harness.start("ovbuild serve under load: the target alone and with its draft, side by side")
    with tempfile.TemporaryDirectory(prefix="bench_serve_") as tmp:
        if args.target:
            target, draft = Path(args.target), Path(args.draft) if args.draft else None
            alone = target
        else:
            target_ckpt, draft_ckpt = shipped_pair()
            target, draft = export_pair(target_ckpt, draft_ckpt, Path(tmp))
            alone = export(target_ckpt, Path(tmp) / "alone", quiet=True).out  # no taps, as one serves it alone
        sides = {"target alone": Server(alone, None)}
        try:
            if draft:
                sides["draft"] = Server(target, draft)
            if args.baseline:
                sides["target alone" + BASELINE] = Server(alone, None, args.baseline)
                if draft:
                    sides["draft" + BASELINE] = Server(target, draft, args.baseline)
            runs = side_by_side(sides, args.clients, args.max_tokens, args.rounds, args.seed)
        finally:
            for server in sides.values():
                server.close()
    report(runs, args.max_tokens, args.rounds)


if __name__ == "__main__":
    main()
