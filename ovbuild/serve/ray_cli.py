"""`ovbuild serve --replicas N [--ray-address ADDR]`: deploy the Ray Serve application and serve until interrupted."""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

from ovbuild.errors import ConfigError, MissingDependencyError, OvbuildError
from ovbuild.runtime.pipeline import RuntimeOptions, check_options
from ovbuild.signals import sigterm_raises


def serve_on_ray(args: argparse.Namespace, options: RuntimeOptions) -> int:
    """Start (or join) Ray, deploy N engine replicas behind the ingress on host:port; serve until interrupted, then
    delete the application (and stop the local Ray instance)."""
    if args.replicas < 1:
        raise ConfigError(f"--replicas must be at least 1, got {args.replicas}")
    if not args.replica_cpus > 0:
        raise ConfigError(f"--replica-cpus must be positive, got {args.replica_cpus}")
    check_options(options, with_draft=args.draft is not None)  # as each replica's Pipeline will, but before Ray
    if args.ray_address is None:  # a local instance: the folders are here (on a cluster they are on the workers)
        for flag, folder in (("--target", args.target), ("--draft", args.draft)):
            if folder is not None and not Path(folder).is_dir():
                raise ConfigError(f"{flag} {folder}: no such folder")
    try:
        import ray
        from ray import serve

        from ovbuild.serve.ray_app import APP_NAME, RayOptions, build_ray_app, start
    except ImportError as e:
        raise MissingDependencyError(
            f"ovbuild serve --replicas needs Ray Serve: pip install 'ovbuild[ray]' ({e})"
        ) from e
    ray_options = RayOptions(
        replicas=args.replicas,
        replica_cpus=args.replica_cpus,
        threads=max(1, math.ceil(args.replica_cpus)),
        address=args.ray_address,
    )
    app = build_ray_app(
        args.target,
        args.draft,
        options,
        args.served_model_name,
        args.max_requests,
        args.default_max_tokens,
        ray_options,
        reasoning_parser=args.reasoning_parser,
        tool_call_parser=args.tool_call_parser,
    )
    try:
        start(app, args.host, args.port, args.ray_address)
    except (ConnectionError, ray.exceptions.AuthenticationError) as e:
        where = f"--ray-address {args.ray_address}" if args.ray_address else "a local Ray instance"
        raise OvbuildError(f"{where}: cannot connect to the Ray cluster ({type(e).__name__}: {e})") from e
    except RuntimeError as e:  # serve.run: a replica's constructor failed (a bad folder, too little memory, ...)
        raise OvbuildError(f"ovbuild serve --replicas: the replicas did not start: {e}") from e
    print(
        f"ovbuild serve: {args.replicas} replicas on Ray Serve at http://{args.host}:{args.port} (Ctrl-C stops)",
        file=sys.stderr,
    )
    try:  # until Ctrl-C or SIGTERM (ovbuild.cli turns both into exceptions, and its exit code)
        with sigterm_raises():  # ray.init put its own SIGTERM handler in place, which aborts: ours cleans up
            while True:
                time.sleep(3600)
    finally:
        serve.delete(APP_NAME)
        ray.shutdown()  # a local instance stops with it; a cluster keeps running
    return 0
