"""`ovbuild serve --replicas N`: the OpenAI app of ovbuild.serve.app on N Ray Serve replicas (needs ovbuild[ray]).

Two deployments. `EngineReplica` (N replicas) each compiles the models and runs the same app over its own engine; it
is called by handle with the HTTP request and streams back the app's ASGI messages. `Ingress` (one replica) takes the
HTTP requests from Ray Serve's proxy, keys each on its prompt's first blocks (ovbuild.serve.affinity) and calls the
engines through a handle whose request router, `PrefixAffinityRouter`, sends it to the replica holding that prefix,
or to the least loaded one. /metrics and /health gather every live replica's, labelled with its replica id. A replica
whose process dies fails its requests with a 503; Ray Serve starts a new one, and the router stops choosing the dead.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import ray
from ray import serve
from ray.exceptions import ActorUnavailableError, NodeDiedError, RayActorError, WorkerCrashedError
from ray.serve.config import RequestRouterConfig
from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from ovbuild.runtime.pipeline import RuntimeOptions
from ovbuild.serve import affinity
from ovbuild.serve.affinity import AffinityConfig, AffinityTable, block_keys, pick, request_prefix
from ovbuild.serve.protocol import error_body

REPLICA_HEADER = "x-ovbuild-replica"  # the replica that answered, on every response of the engines
APP_NAME = "ovbuild"
# A replica's process or node is gone, or it cannot be reached: its requests fail, the client may retry.
REPLICA_LOST = (RayActorError, ActorUnavailableError, WorkerCrashedError, NodeDiedError)
# How long /metrics and /health wait for one replica's answer before leaving it out.
_GATHER_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class RayOptions:
    """How many replicas, what each gets, and which Ray cluster (None: a local one started here)."""

    replicas: int = 2
    replica_cpus: float = 1.0  # Ray CPUs reserved per engine replica
    threads: int | None = None  # OpenVINO inference threads per replica (None: OpenVINO's default)
    address: str | None = None
    affinity: AffinityConfig = field(default_factory=AffinityConfig)
    health_check_period_s: float = 10.0


class PrefixAffinityRouter(RequestRouter):
    """Ray Serve request router of the engines: a request goes to the replica owning its longest block key, unless
    that one is `imbalance` requests busier than the least loaded; else to the least loaded (Ray Serve probes the
    queue lengths of a rank's replicas and takes the shortest). A call naming `replica=` goes to that replica."""

    def initialize_state(self, imbalance: int = AffinityConfig.imbalance, max_keys: int = AffinityConfig.max_keys):
        self.imbalance = imbalance
        self.table = AffinityTable(max_keys)

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        kwargs = pending_request.kwargs if pending_request is not None else {}
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        if (wanted := kwargs.get("replica")) in by_id:
            return [[by_id[wanted]]]
        cache = self.replica_queue_len_cache
        loads = {rid: cache.get(r.replica_id) or 0 for rid, r in by_id.items()}
        owner = pick(self.table.owner(kwargs.get("affinity") or []), loads, self.imbalance)
        # Ray Serve takes the shortest queue of a rank, the first on a tie: shuffled, new prefixes spread out.
        everyone = random.sample(candidate_replicas, len(candidate_replicas))
        return [[by_id[owner]], everyone] if owner is not None else [everyone]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result) -> None:
        if keys := pending_request.kwargs.get("affinity"):
            self.table.assign(keys, replica_id.unique_id)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        self._publish()

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._publish()

    def _publish(self) -> None:
        ids = frozenset(rid.unique_id for rid in self.curr_replicas)
        self.table.keep_only(ids)
        affinity.LIVE_REPLICAS[self.app_name] = ids


class EngineReplica:
    """One engine replica: the models compiled here, the OpenAI app over its own engine, called by handle."""

    def __init__(
        self,
        target: str,
        draft: str | None,
        options: RuntimeOptions,
        name: str,
        max_requests: int,
        default_max_tokens: int,
        threads: int | None,
        **parsers,
    ):
        """parsers: reasoning_parser, tool_call_parser, as the single-process server takes them (build_app)."""
        from ovbuild.ir import core
        from ovbuild.serve.server import build_app

        if threads:  # replicas sharing a machine: each keeps to its share of the cores
            core().set_property("CPU", {"INFERENCE_NUM_THREADS": threads})
        self.app = build_app(target, draft, options, name, max_requests, default_max_tokens, **parsers)
        self.engine = self.app.state.engine
        self.engine.start()
        self.id = serve.get_replica_context().replica_id.unique_id

    async def forward(
        self, method: str, path: str, query: bytes, headers: list, body: bytes, affinity=None, replica=None
    ) -> AsyncIterator[dict]:
        """Run one HTTP request through the app; yields its ASGI messages (the response start, then body parts).
        A consumer that stops (its client left) ends the app's request as a disconnect does."""
        messages: asyncio.Queue = asyncio.Queue()
        left = asyncio.Event()
        sent = False

        async def receive() -> dict:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await left.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            if message["type"] == "http.response.start":
                message = {
                    **message,
                    "headers": [*message.get("headers", []), (REPLICA_HEADER.encode(), self.id.encode())],
                }
            await messages.put(message)

        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "root_path": "",
            "query_string": query,
            "headers": headers,
            "client": None,
            "server": None,
        }
        task = asyncio.create_task(self.app(scope, receive, send))
        task.add_done_callback(lambda _: messages.put_nowait(None))
        try:
            while (message := await messages.get()) is not None:
                yield message
                if message["type"] == "http.response.body" and not message.get("more_body", False):
                    break
            if task.done() and task.exception() is not None:
                raise task.exception()
        finally:
            left.set()
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def health(self, replica=None) -> dict:
        """This replica's id, process, node and engine counters."""
        stats = self.engine.stats.__dict__
        status = "ok" if self.engine.alive else "engine stopped"
        node = ray.get_runtime_context().get_node_id()
        return {"replica": self.id, "pid": os.getpid(), "node": node, "status": status, **stats}

    async def metrics(self, replica=None) -> tuple[str, bytes]:
        """(replica id, this replica's Prometheus exposition)."""
        body, _ = self.engine.metrics.exposition()
        return self.id, body

    def check_health(self) -> None:
        """Ray Serve's health check: a replica whose engine thread stopped is replaced."""
        if not self.engine.alive:
            raise RuntimeError("the engine thread stopped")

    def __del__(self):
        with contextlib.suppress(Exception):
            self.engine.stop()


class Ingress:
    """The HTTP entry: forwards each request to an engine replica chosen by the router; gathers /metrics, /health."""

    def __init__(self, engines, affinity: AffinityConfig):
        self.engines = engines
        self.affinity = affinity
        self.app_name = serve.get_replica_context().app_name  # the engines are in the same application

    async def __call__(self, request: Request) -> Response:
        path = request.url.path
        if request.method == "GET" and path == "/metrics":
            return await self._metrics()
        if request.method == "GET" and path == "/health":
            return await self._health()
        body = await request.body()
        keys = block_keys(request_prefix(path, _json(body)), self.affinity) if request.method == "POST" else []
        headers = [(k.lower(), v) for k, v in request.headers.raw]
        stream = self.engines.options(stream=True).forward.remote(
            request.method, path, request.url.query.encode(), headers, body, affinity=keys
        )
        try:
            start = await stream.__anext__()
            first = await stream.__anext__()
        except REPLICA_LOST as e:
            return _replica_lost(e)
        status, headers = start["status"], _headers(start)
        if not first.get("more_body", False):
            return Response(first.get("body", b""), status_code=status, headers=headers)
        return StreamingResponse(_rest(first, stream), status_code=status, headers=headers)

    async def _replicas(self) -> list[str]:
        """Live engine replica ids, as the router knows them (a first call makes the router learn them)."""
        if not affinity.LIVE_REPLICAS.get(self.app_name):
            await self.engines.health.remote()
        return sorted(affinity.LIVE_REPLICAS.get(self.app_name, ()))

    async def _gather(self, method: str) -> dict[str, object]:
        """{replica id: its answer to `method`, None if it did not answer in time or is gone}, every live replica
        called in turn: calls made within one HTTP request share its internal request id, by which Ray Serve's router
        pairs a chosen replica with its waiting call, so at once they would be paired wrongly."""
        answers: dict[str, object] = {}
        for rid in await self._replicas():
            answers[rid] = None
            with contextlib.suppress(asyncio.TimeoutError, *REPLICA_LOST):
                call = getattr(self.engines, method).remote(replica=rid)
                answers[rid] = await asyncio.wait_for(_await(call), _GATHER_TIMEOUT_S)
        return answers

    async def _health(self) -> Response:
        """200 when every live replica answers healthy; each replica's id, process, node, status and counters."""
        answers = await self._gather("health")
        replicas = [h if h is not None else {"replica": rid, "status": "unreachable"} for rid, h in answers.items()]
        ok = bool(replicas) and all(h["status"] == "ok" for h in replicas)
        body = {"status": "ok" if ok else "degraded", "replicas": replicas}
        return JSONResponse(body, status_code=200 if ok else 503)

    async def _metrics(self) -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST

        from ovbuild.serve.ray_metrics import labelled

        texts = dict(answer for answer in (await self._gather("metrics")).values() if answer is not None)
        return Response(labelled(texts), media_type=CONTENT_TYPE_LATEST)


async def _await(response):
    return await response


async def _rest(first: dict, stream) -> AsyncIterator[bytes]:
    """The body of a streamed answer; a replica lost midway ends it with an in-band error (the status is sent)."""
    yield first.get("body", b"")
    try:
        async for message in stream:
            if message["type"] == "http.response.body":
                yield message.get("body", b"")
    except REPLICA_LOST as e:
        body = error_body(_lost_message(e), "service_unavailable_error", None, "replica_lost")
        yield f"data: {json.dumps(body)}\n\n".encode()
    finally:
        stream.cancel()


def _headers(start: dict) -> dict[str, str]:
    skip = {"content-length", "transfer-encoding", "connection"}
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in start.get("headers", []) if k.lower() not in skip}


def _json(body: bytes) -> dict:
    with contextlib.suppress(ValueError):
        parsed = json.loads(body)
        if isinstance(parsed, dict):
            return parsed
    return {}


def _lost_message(e: Exception) -> str:
    return (
        f"the replica serving this request stopped ({type(e).__name__}); Ray Serve is replacing it and new requests go "
        "to the live replicas: retry the request"
    )


def _replica_lost(e: Exception) -> JSONResponse:
    body = error_body(_lost_message(e), "service_unavailable_error", None, "replica_lost")
    return JSONResponse(body, status_code=503, headers={"retry-after": "1"})


def build_ray_app(
    target: str | Path,
    draft: str | Path | None,
    options: RuntimeOptions | None,
    name: str | None,
    max_requests: int,
    default_max_tokens: int,
    ray_options: RayOptions,
    **parsers,
):
    """The Ray Serve application: N engine replicas behind the ingress (deploy it with serve.run). parsers:
    reasoning_parser, tool_call_parser, passed to every replica's app."""
    r = ray_options
    engines = serve.deployment(
        EngineReplica,
        name="EngineReplica",
        num_replicas=r.replicas,
        ray_actor_options={"num_cpus": r.replica_cpus},
        max_ongoing_requests=max_requests,
        health_check_period_s=r.health_check_period_s,
        request_router_config=RequestRouterConfig(
            request_router_class=PrefixAffinityRouter,
            request_router_kwargs={"imbalance": r.affinity.imbalance, "max_keys": r.affinity.max_keys},
        ),
    ).bind(
        str(Path(target).resolve()),
        str(Path(draft).resolve()) if draft is not None else None,
        options or RuntimeOptions(),
        name or str(target),
        max_requests,
        default_max_tokens,
        r.threads,
        **parsers,
    )
    ingress = serve.deployment(
        Ingress, name="Ingress", ray_actor_options={"num_cpus": 0}, max_ongoing_requests=max_requests * r.replicas
    )
    return ingress.bind(engines, r.affinity)


def app_builder(args: dict):
    """`serve run ovbuild.serve.ray_app:app_builder target=DIR [draft=DIR] [replicas=N] [replica_cpus=C]
    [threads=T] [name=NAME] [max_requests=M] [reasoning_parser=P] [tool_call_parser=P]`: the application with the
    runtime's default options."""
    ray_options = RayOptions(
        replicas=int(args.get("replicas", 2)),
        replica_cpus=float(args.get("replica_cpus", 1)),
        threads=int(args["threads"]) if "threads" in args else None,
    )
    return build_ray_app(
        args["target"],
        args.get("draft"),
        RuntimeOptions(),
        args.get("name"),
        int(args.get("max_requests", 256)),
        int(args.get("default_max_tokens", 256)),
        ray_options,
        reasoning_parser=args.get("reasoning_parser"),
        tool_call_parser=args.get("tool_call_parser", "hermes"),
    )


def start(app, host: str, port: int, address: str | None, local_cpus: float | None = None) -> None:
    """Connect to the cluster at `address` (None: start a local Ray instance), then deploy the app on Serve's HTTP
    proxy at host:port."""
    # "local": a new instance, never a cluster that RAY_ADDRESS or an earlier `ray start` on this machine names
    if not ray.is_initialized():
        ray.init(address=address or "local", num_cpus=local_cpus if address is None else None)
    serve.start(http_options={"host": host, "port": port})
    serve.run(app, name=APP_NAME, route_prefix="/")
