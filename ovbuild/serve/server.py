"""Building the app from exported folders, and running it: in the foreground (the CLI) or on a thread."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from ovbuild.errors import MissingDependencyError
from ovbuild.runtime.pipeline import Pipeline, RuntimeOptions


def build_app(
    target_dir: str | Path,
    draft_dir: str | Path | None = None,
    options: RuntimeOptions | None = None,
    name: str | Sequence[str] | None = None,
    max_requests: int = 256,
    default_max_tokens: int = 256,
    spec_decode_stats: bool = False,
    image_policy=None,
    **parsers,
):
    """Compile the models and return the ASGI app serving them (the engine thread starts with the app). `name`: the
    model name clients send, or several (aliases); default the target path. `spec_decode_stats`: every choice says
    how its speculative decoding went (with a draft). `image_policy`: where chat images may come from
    (`ovbuild.serve.images.ImagePolicy`; default: data URLs only), for a target exported with its vision tower.
    parsers: reasoning_parser, tool_call_parser (ServedModel)."""
    try:
        from ovbuild.serve.app import ServedModel, create_app
        from ovbuild.serve.engine import Engine
        from ovbuild.serve.images import ImagePolicy, ServedImages
    except ImportError as e:
        raise MissingDependencyError(f"ovbuild serve needs its extra: pip install 'ovbuild[serve]' ({e})") from e
    pipeline = Pipeline(target_dir, draft_dir, options)
    pipeline.compile_copies()  # steady latency from the first request on
    engine = Engine(pipeline.scheduler(), pipeline.decode, max_requests)
    stats = "summary" if spec_decode_stats and draft_dir is not None else "none"
    model = ServedModel.from_folder(name or str(target_dir), target_dir, pipeline, default_max_tokens, stats, **parsers)
    policy = image_policy or ImagePolicy()
    device = pipeline.options.device
    model.images = ServedImages.for_folder(target_dir, pipeline.tokenizer, device, policy, model.chat_template)
    app = create_app(engine, model)
    app.state.runtime = pipeline.describe()  # how the device compiled the models, for the startup log
    return app


class BackgroundServer:
    """uvicorn serving `app` on a thread, on a free loopback port (for tests, benchmarks and notebooks)."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0):
        import uvicorn

        self.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind((host, port))
        self.host, self.port = self.socket.getsockname()
        config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> BackgroundServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(15)
        self.socket.close()
