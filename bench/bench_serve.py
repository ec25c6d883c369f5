"""Serving benchmark: `ovbuild serve` on the shipped demo pair, N concurrent streaming clients, with the draft and
with the target alone, side by side in one run.

Each side starts the real command in a subprocess on a free loopback port, warms it up, then sends every client's
request at once (the prompts cycle through the demo's code starts) and reads the streams. It reports aggregate
tokens/s (completion tokens over the wall time of the whole burst), TTFT p50 / p99 (request sent to first text
received, queueing included) and, with the draft, the acceptance the server's /metrics counted.

    python bench/bench_serve.py [--clients 16 64] [--max-tokens 64] [--target DIR --draft DIR (exported)]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from ovbuild.demo import DEMO_PROMPTS, export_pair, shipped_pair

PROMPTS = [*DEMO_PROMPTS, "def read(path):\n", "import sys\n\n", "    for i in range(", "    return "]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`ovbuild serve` in a subprocess, ready once /health answers."""

    def __init__(self, target: Path, draft: Path | None):
        self.port = free_port()
        cmd = [sys.executable, "-m", "ovbuild.cli", "serve", "--target", str(target), "--served-model-name", "demo"]
        cmd += ["--port", str(self.port), "--log-level", "warning", "--max-requests", "1024"]
        cmd += ["--draft", str(draft)] if draft else []
        self.process = subprocess.Popen(cmd)
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


async def one(http: httpx.AsyncClient, prompt: str, max_tokens: int) -> tuple[float, int]:
    """(TTFT in s, completion tokens) of one streaming request."""
    body = {"model": "demo", "prompt": prompt, "max_tokens": max_tokens, "stream": True}
    body["stream_options"] = {"include_usage": True}
    start, ttft, tokens = time.perf_counter(), None, 0
    async with http.stream("POST", "/v1/completions", json=body) as answer:
        async for line in answer.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk["choices"] and chunk["choices"][0]["text"] and ttft is None:
                ttft = time.perf_counter() - start
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return ttft if ttft is not None else float("nan"), tokens


async def burst(url: str, clients: int, max_tokens: int) -> tuple[float, list[float], int]:
    limits = httpx.Limits(max_connections=clients + 4)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as http:
        start = time.perf_counter()
        results = await asyncio.gather(*(one(http, PROMPTS[i % len(PROMPTS)], max_tokens) for i in range(clients)))
        wall = time.perf_counter() - start
    return wall, [r[0] for r in results], sum(r[1] for r in results)


def counters(url: str) -> dict[str, float]:
    out = {}
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith("ovbuild_spec_decode"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def measure(target: Path, draft: Path | None, client_counts: list[int], max_tokens: int) -> dict[int, dict]:
    server = Server(target, draft)
    try:
        asyncio.run(burst(server.url, 4, 8))  # warm-up: first-call allocations stay out of the figures
        rows = {}
        for clients in client_counts:
            before = counters(server.url)
            wall, ttfts, tokens = asyncio.run(burst(server.url, clients, max_tokens))
            after = counters(server.url)
            drafts = after.get("ovbuild_spec_decode_num_drafts_total", 0) - before.get(
                "ovbuild_spec_decode_num_drafts_total", 0
            )
            accepted = after.get("ovbuild_spec_decode_num_accepted_tokens_total", 0) - before.get(
                "ovbuild_spec_decode_num_accepted_tokens_total", 0
            )
            rows[clients] = {
                "tokens_per_s": tokens / wall,
                "ttft_p50_ms": float(np.percentile(ttfts, 50)) * 1e3,
                "ttft_p99_ms": float(np.percentile(ttfts, 99)) * 1e3,
                "tau": 1 + accepted / drafts if drafts else 1.0,
                "tokens": tokens,
                "wall_s": wall,
            }
        return rows
    finally:
        server.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--target", help="exported target folder (default: the shipped demo pair, exported now)")
    parser.add_argument("--draft", help="exported draft folder")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_serve_") as tmp:
        if args.target:
            target, draft = Path(args.target), Path(args.draft) if args.draft else None
        else:
            target, draft = export_pair(*shipped_pair(), Path(tmp))
        with_draft = measure(target, draft, args.clients, args.max_tokens) if draft else {}
        alone = measure(target, None, args.clients, args.max_tokens)
    print(f"\novbuild serve, {args.max_tokens} tokens per request, streaming clients all at once")
    print(f"{'clients':>7} {'side':>12} {'tokens/s':>9} {'TTFT p50':>9} {'TTFT p99':>9} {'tau':>5} {'speed-up':>8}")
    for clients in args.clients:
        a = alone[clients]
        for side, row in (("draft", with_draft.get(clients)), ("target alone", a)):
            if row is None:
                continue
            ratio = f"{row['tokens_per_s'] / a['tokens_per_s']:.2f}x" if side == "draft" else ""
            print(
                f"{clients:>7} {side:>12} {row['tokens_per_s']:>9.1f} {row['ttft_p50_ms']:>7.0f}ms "
                f"{row['ttft_p99_ms']:>7.0f}ms {row['tau']:>5.2f} {ratio:>8}"
            )


if __name__ == "__main__":
    main()
