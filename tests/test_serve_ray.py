"""`ovbuild serve --replicas 2` on a local Ray instance, with the trained demo pair (its greedy answers do not hang
on near-ties, so they are the same however requests are batched, as in test_serve_load): answers equal the
single-process server's, a conversation stays on one replica, /metrics and /health cover every replica, and a replica
whose process is killed mid-load fails only its own requests, with 503s, while the others answer right and Ray
replaces it."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import socket
import time

import httpx
import pytest

ray = pytest.importorskip("ray", reason="the Ray Serve tests need the ray extra: pip install 'ovbuild[ray]'")

from ovbuild.demo import export_pair, shipped_pair  # noqa: E402
from ovbuild.runtime.pipeline import EXACT_TARGET, FAST_DRAFT, RuntimeOptions  # noqa: E402
from ovbuild.serve.affinity import AffinityConfig  # noqa: E402
from ovbuild.serve.server import BackgroundServer, build_app  # noqa: E402
from ovbuild.testing.tokenizer import CHAT_TEMPLATE  # noqa: E402

pytestmark = pytest.mark.slow

MODEL = "demo"
PROMPTS = ["def add(a, b):", "import os\n", "class Stack:", "for i in range(", "    return ", "x = [1, 2,"]
# Long enough for several affinity blocks of text (AffinityConfig: 32 tokens * 4 characters each).
PREFIX_HITS = "ovbuild_prefix_cache_hits_total"  # context tokens a replica found in its prefix cache
# Small caches, and no copies compiled per row count (26 s of compiling on one thread): replicas start in seconds.
# The single-process server runs with the same options, so answers must be equal.
OPTIONS = RuntimeOptions(
    target=dataclasses.replace(EXACT_TARGET, cache_mb=32, static_rows=False),
    draft=dataclasses.replace(FAST_DRAFT, cache_mb=16, static_rows=False),
)
SYSTEM = "You are a careful assistant that answers questions about Python code in short sentences. " * 4


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """The exported demo pair; its target gets a chat template (the demo checkpoint ships none) as checkpoints ship
    one, in chat_template.jinja, so conversations can be served."""
    target, draft = export_pair(*shipped_pair(), tmp_path_factory.mktemp("serve_ray"))
    (target / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")
    return target, draft


@pytest.fixture(scope="module")
def single(pair):
    """The single-process server: what every answer of the replicas must equal."""
    with BackgroundServer(build_app(*pair, OPTIONS, name=MODEL)) as s:
        yield s.url


@pytest.fixture(scope="module")
def cluster(pair):
    """Two engine replicas on a local Ray instance (half a CPU and one OpenVINO thread each); Ray is shut down at
    the end."""
    from ray import serve

    from ovbuild.serve.ray_app import RayOptions, build_ray_app, start

    options = RayOptions(replicas=2, replica_cpus=0.5, threads=1, health_check_period_s=1.0)
    app = build_ray_app(*pair, OPTIONS, MODEL, 64, 256, options)
    port = _free_port()
    try:
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
        start(app, "127.0.0.1", port, address=None)
        url = f"http://127.0.0.1:{port}"
        _wait_for_replicas(url, 2, timeout=120)
        yield url
    finally:
        serve.shutdown()
        ray.shutdown()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_replicas(url: str, n: int, timeout: float, other_than: set[str] = frozenset()) -> dict:
    """/health once it lists n healthy replicas, none of them in `other_than`."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            health = httpx.get(f"{url}/health", timeout=15).json()
            ids = {r["replica"] for r in health.get("replicas", ()) if r["status"] == "ok"}
            if len(ids) == n and not ids & other_than:
                return health
        except (httpx.HTTPError, ValueError):
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"{n} healthy replicas did not come up in {timeout} s")
        time.sleep(0.5)


def _ask(url: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}{path}", json={"model": MODEL, **body}, timeout=60)


def _metric(url: str, name: str) -> dict[str, float]:
    """{replica id: value} of one unlabelled-per-replica sample of /metrics."""
    out = {}
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line.startswith(name + "{"):
            labels, value = line[len(name) + 1 :].rsplit("} ", 1)
            replica = dict(kv.split("=", 1) for kv in labels.split(","))["replica"].strip('"')
            out[replica] = out.get(replica, 0.0) + float(value)
    return out


def test_answers_equal_the_single_process_server(cluster, single):
    bodies = [("/v1/completions", {"prompt": p, "max_tokens": 12}) for p in PROMPTS]
    bodies += [("/v1/completions", {"prompt": PROMPTS[0], "max_tokens": 12, "temperature": 0.8, "seed": 7})]
    bodies += [("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 12})]
    for path, body in bodies:
        expected, answer = _ask(single, path, body), _ask(cluster, path, body)
        assert answer.status_code == expected.status_code == 200, answer.text
        e, a = expected.json()["choices"][0], answer.json()["choices"][0]
        assert a.get("text", a.get("message")) == e.get("text", e.get("message")), (path, body)
        assert answer.headers["x-ovbuild-replica"]
    streamed = httpx.post(
        f"{cluster}/v1/completions",
        json={"model": MODEL, "prompt": PROMPTS[1], "max_tokens": 12, "stream": True},
        timeout=60,
    )
    assert streamed.status_code == 200 and streamed.text.rstrip().endswith("data: [DONE]")
    expected = _ask(single, "/v1/completions", {"prompt": PROMPTS[1], "max_tokens": 12}).json()["choices"][0]["text"]
    chunks = [line[6:] for line in streamed.text.splitlines() if line.startswith("data: {")]
    assert "".join(httpx.Response(200, content=c).json()["choices"][0]["text"] for c in chunks) == expected
    bad = _ask(cluster, "/v1/completions", {"prompt": "x", "max_tokens": -1})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "max_tokens"


def test_a_conversation_stays_on_one_replica(cluster, single):
    """Every turn of a conversation whose prefix spans affinity blocks lands on the replica of its first turn."""
    assert len(SYSTEM) > 2 * AffinityConfig.block_tokens * AffinityConfig.chars_per_token
    for c in range(3):
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"conversation {c}: hello"}]
        before = _metric(cluster, "ovbuild_request_success_total")
        hits_before = _metric(cluster, PREFIX_HITS)
        replicas = []
        for turn in range(4):
            answer = _ask(cluster, "/v1/chat/completions", {"messages": messages, "max_tokens": 8})
            assert answer.status_code == 200, answer.text
            assert (
                answer.json()["choices"][0]["message"]
                == _ask(single, "/v1/chat/completions", {"messages": messages, "max_tokens": 8}).json()["choices"][0][
                    "message"
                ]
            )
            replicas.append(answer.headers["x-ovbuild-replica"])
            messages += [answer.json()["choices"][0]["message"], {"role": "user", "content": f"and turn {turn}?"}]
        assert len(set(replicas)) == 1, f"conversation {c} moved between replicas: {replicas}"
        after = _metric(cluster, "ovbuild_request_success_total")
        served = {r: after.get(r, 0) - before.get(r, 0) for r in after}
        assert served[replicas[0]] == 4, served
        # Its replica found this conversation's earlier turns in its prefix cache.
        hits = _metric(cluster, PREFIX_HITS)
        assert hits.get(replicas[0], 0.0) > hits_before.get(replicas[0], 0.0), (hits_before, hits)


def test_metrics_and_health_cover_every_replica(cluster):
    health = httpx.get(f"{cluster}/health", timeout=30).json()
    ids = {r["replica"] for r in health["replicas"]}
    assert health["status"] == "ok" and len(ids) == 2
    assert len({r["pid"] for r in health["replicas"]}) == 2
    tokens = _metric(cluster, "ovbuild_generation_tokens_total")
    assert set(tokens) == ids


def test_a_killed_replica_fails_only_its_requests_with_503_and_is_replaced(cluster, single):
    """Streamed and whole answers: each is right, or a 503 (a stream already started ends with that error event, its
    text so far a prefix of the right one)."""
    bodies = [{"prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": 100, "ignore_eos": True} for i in range(16)]
    expected = {b["prompt"]: _ask(single, "/v1/completions", b).json()["choices"][0]["text"] for b in bodies[:6]}
    victim = _wait_for_replicas(cluster, 2, timeout=30)["replicas"][0]

    async def load() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=cluster, timeout=120) as http:
            calls = [
                asyncio.create_task(http.post("/v1/completions", json={"model": MODEL, "stream": i % 2 == 1, **b}))
                for i, b in enumerate(bodies)
            ]
            while not any(  # kill it while it runs requests
                r["replica"] == victim["replica"] and r.get("running")
                for r in (await http.get("/health")).json()["replicas"]
            ):
                await asyncio.sleep(0.02)
            os.kill(victim["pid"], signal.SIGKILL)
            return await asyncio.gather(*calls)

    answers = asyncio.run(load())
    lost = 0
    for i, (body, answer) in enumerate(zip(bodies, answers, strict=True)):
        right = expected[body["prompt"]]
        if answer.status_code == 503:
            assert answer.json()["error"]["code"] == "replica_lost"
            lost += 1
            continue
        assert answer.status_code == 200, answer.text
        if i % 2 == 0:
            assert answer.json()["choices"][0]["text"] == right
            continue
        events = [line[len("data: ") :] for line in answer.text.splitlines() if line.startswith("data: ")]
        chunks = [httpx.Response(200, content=e).json() for e in events if e != "[DONE]"]
        text = "".join(c["choices"][0]["text"] for c in chunks if "choices" in c)
        if events[-1] == "[DONE]":
            assert text == right
        else:
            assert chunks[-1]["error"]["code"] == "replica_lost" and right.startswith(text)
            lost += 1
    assert 0 < lost < len(bodies)
    # New requests go to the live replica while Ray starts a new one, then to both.
    for body in bodies[:6]:
        answer = _ask(cluster, "/v1/completions", body)
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["text"] == expected[body["prompt"]]
        assert answer.headers["x-ovbuild-replica"] != victim["replica"]
    health = _wait_for_replicas(cluster, 2, timeout=90, other_than={victim["replica"]})
    assert victim["pid"] not in {r["pid"] for r in health["replicas"]}
