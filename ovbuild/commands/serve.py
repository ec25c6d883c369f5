"""`ovbuild serve`: an OpenAI-compatible server (completions, chat, streaming, metrics) on exported folders."""

from __future__ import annotations

import argparse
import sys

from ovbuild.commands.options import add_runtime_arguments, runtime_options
from ovbuild.serve.reasoning import FORMATS as REASONING_FORMATS
from ovbuild.serve.tools import FORMATS as TOOL_FORMATS


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "serve",
        help="serve an exported target (and draft) over an OpenAI-compatible HTTP API",
        description="Serve POST /v1/completions and /v1/chat/completions (streaming or not), GET /v1/models, "
        "/health and /metrics (Prometheus). Requests from every client share one continuously batched, "
        "speculatively decoded run. Needs the serve extra: pip install 'ovbuild[serve]'.",
    )
    p.add_argument("--target", required=True, help="exported target folder")
    p.add_argument("--draft", help="exported draft folder (omit to serve the target alone)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--served-model-name",
        nargs="+",
        help="the model name clients send, or several (aliases, all listed by /v1/models; default: the --target "
        "path). Names are compared as paths: ./exported/target and exported/target are one model",
    )
    p.add_argument(
        "--per-request-spec-decode-metrics",
        action="store_true",
        help="with a draft: each choice of an answer (a stream's last chunk of it) carries its "
        "speculative_decoding_stats, vLLM's per-request acceptance fields",
    )
    p.add_argument(
        "--max-requests",
        type=int,
        default=256,
        help="requests held at once, running and waiting; more are answered 503 with Retry-After, and one request "
        "of more choices (prompts x n) than this is a 400 (default 256)",
    )
    p.add_argument(
        "--default-max-tokens",
        type=int,
        default=256,
        help="completion budget of chat requests that set no max_tokens (completions default to 16, as OpenAI)",
    )
    p.add_argument(
        "--reasoning-parser",
        choices=sorted(REASONING_FORMATS),
        help="split the thinking (<think>...</think>) into reasoning_content; a constraint applies after it",
    )
    p.add_argument(
        "--tool-call-parser",
        default="hermes",
        choices=sorted(TOOL_FORMATS),
        help="how the model writes tool calls (hermes: <tool_call>{json}</tool_call>, Qwen2.5 / Qwen3)",
    )
    p.add_argument(
        "--allowed-local-media-path",
        metavar="DIR",
        help="chat image_url parts may name local files (a path or file:// URL) under DIR, symlinks resolved "
        "(default: no local files; data: URLs are always taken)",
    )
    p.add_argument(
        "--allow-remote-images",
        action="store_true",
        help="fetch http(s) image URLs of chat requests (default: refused with a 400; the server fetches nothing)",
    )
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    p.add_argument(
        "--replicas",
        type=int,
        help="serve from N Ray Serve replicas, each with its own engine, behind a prefix-affinity router (needs "
        "pip install 'ovbuild[ray]'; default: one process, no Ray)",
    )
    p.add_argument("--ray-address", help="with --replicas: the Ray cluster to join (default: a local Ray instance)")
    p.add_argument(
        "--replica-cpus",
        type=float,
        default=1.0,
        help="with --replicas: CPUs Ray reserves for each replica, and its OpenVINO threads (rounded up)",
    )
    add_runtime_arguments(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ovbuild.errors import MissingDependencyError
    from ovbuild.serve.images import ImagePolicy
    from ovbuild.serve.server import build_app

    if args.replicas is not None:
        from ovbuild.errors import UnsupportedError
        from ovbuild.serve.ray_cli import serve_on_ray

        if args.per_request_spec_decode_metrics:
            raise UnsupportedError("--per-request-spec-decode-metrics is not supported with --replicas")
        if args.allowed_local_media_path or args.allow_remote_images:  # replicas take data: URLs only
            raise UnsupportedError(
                "--allowed-local-media-path and --allow-remote-images are not supported with --replicas"
            )

        return serve_on_ray(args, runtime_options(args))

    app = build_app(
        args.target,
        args.draft,
        runtime_options(args),
        args.served_model_name,
        args.max_requests,
        args.default_max_tokens,
        args.per_request_spec_decode_metrics,
        image_policy(args, ImagePolicy),
        reasoning_parser=args.reasoning_parser,
        tool_call_parser=args.tool_call_parser,
    )
    try:
        import uvicorn
    except ImportError as e:
        raise MissingDependencyError("ovbuild serve needs uvicorn: pip install 'ovbuild[serve]'") from e
    if args.log_level in ("info", "debug"):
        print(f"ovbuild serve: {app.state.runtime}", file=sys.stderr)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0


def image_policy(args: argparse.Namespace, policy_class):
    """Where chat images may come from: --allowed-local-media-path (an existing folder) and --allow-remote-images."""
    from pathlib import Path

    from ovbuild.errors import ConfigError

    root = args.allowed_local_media_path
    if root is not None and not Path(root).is_dir():
        raise ConfigError(f"--allowed-local-media-path {root}: not a folder")
    return policy_class(Path(root) if root is not None else None, args.allow_remote_images)
