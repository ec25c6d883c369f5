"""A bounded load test of `ovbuild serve` on loopback: 64 concurrent streaming clients on the trained demo pair (so
the draft is accepted and losslessness means something), a quarter of them leaving midway. Every completed output
equals the target alone, every cache block comes back, and the server stays healthy. Not timed: bench_serve.py is."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from ovbuild.demo import DEMO_PROMPTS
from ovbuild.runtime.pipeline import Pipeline
from ovbuild.serve.server import BackgroundServer, build_app

pytestmark = pytest.mark.slow  # end to end: `pytest -m "not slow"` leaves it out

PROMPTS = [*DEMO_PROMPTS, "def read(path):\n", "import sys\n\n", "    for i in range(", "    return "]
CLIENTS, MAX_TOKENS, LEAVING_EVERY = 64, 12, 4
MODEL = "demo"


async def client(http: httpx.AsyncClient, i: int) -> tuple[str, str | None]:
    """One streaming client: (text, finish reason); every LEAVING_EVERY-th leaves after two chunks (None). Odd
    clients pin the draft length (the adaptive planner may find that drafting does not pay on a busy machine, and
    the draft must surely run for losslessness to mean something); the others leave it to the planner."""
    leaves = i % LEAVING_EVERY == 0
    body = {"model": MODEL, "prompt": PROMPTS[i % len(PROMPTS)], "stream": True}
    body |= {"num_assistant_tokens": 4} if i % 2 else {}
    # a leaving client asks for far more than it waits for, so it surely leaves a running request
    body |= {"max_tokens": 400, "ignore_eos": True} if leaves else {"max_tokens": MAX_TOKENS}
    text, reason, chunks = "", None, 0
    async with http.stream("POST", "/v1/completions", json=body) as answer:
        assert answer.status_code == 200, await answer.aread()
        async for line in answer.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[len("data: ") :])["choices"][0]
            text += choice["text"]
            reason = choice["finish_reason"] or reason
            chunks += 1
            if leaves and chunks == 2:
                return text, None  # leaving the `async with` closes the connection mid-stream
    return text, reason


async def crowd(url: str) -> list[tuple[str, str | None]]:
    limits = httpx.Limits(max_connections=CLIENTS, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as http:
        return await asyncio.wait_for(asyncio.gather(*(client(http, i) for i in range(CLIENTS))), timeout=120)


def test_64_streaming_clients_some_leaving(demo_pair):
    alone, _ = Pipeline(demo_pair[0]).generate(PROMPTS, MAX_TOKENS, use_draft=False)
    with BackgroundServer(build_app(*demo_pair, name=MODEL)) as server:
        results = asyncio.run(crowd(server.url))
        deadline = time.monotonic() + 10
        while (health := httpx.get(f"{server.url}/health", timeout=10).json())["outstanding"] and (
            time.monotonic() < deadline
        ):
            time.sleep(0.05)
        metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
        after = httpx.post(
            f"{server.url}/v1/completions", json={"model": MODEL, "prompt": PROMPTS[0], "max_tokens": 4}, timeout=30
        )
    completed = [(i, r) for i, r in enumerate(results) if i % LEAVING_EVERY]
    assert len(completed) == CLIENTS - CLIENTS // LEAVING_EVERY
    for i, (text, reason) in completed:
        expected = alone[i % len(PROMPTS)]
        assert text == expected.text, f"client {i}: {text!r} != target alone {expected.text!r}"
        assert reason == ("length" if expected.finish_reason == "length" else "stop")
    assert health["outstanding"] == 0 and health["running"] == 0
    assert health["free_blocks"] == health["total_blocks"], "cache blocks leaked"
    finished = [line for line in metrics.splitlines() if line.startswith("ovbuild_request_success_total")]
    assert f'ovbuild_request_success_total{{finished_reason="abort"}} {float(CLIENTS // LEAVING_EVERY)}' in finished, (
        finished
    )
    assert "ovbuild_spec_decode_num_accepted_tokens_total 0.0" not in metrics, "the draft was never accepted"
    assert after.status_code == 200 and after.json()["usage"]["completion_tokens"] == 4
