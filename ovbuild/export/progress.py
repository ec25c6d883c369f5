"""What a person sees while exporting: a per-layer progress bar on a terminal, log lines of the `ovbuild` logger."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from ovbuild.export.streaming import layer_of

WIDTH = 30


class LayerProgress:
    """`building draft [#######.......] 3/5 layers.2.mlp.up_proj` redrawn in place on stderr; silent when disabled."""

    def __init__(self, label: str, num_layers: int, enabled: bool):
        self.label, self.total, self.enabled = label, num_layers, enabled
        self.done = 0
        self._drawn = False

    def __call__(self, canonical: str) -> None:
        """Called with each tensor name the build reads; a new layer index advances the bar."""
        layer = layer_of(canonical)
        if layer is not None:
            self.done = max(self.done, min(layer, self.total))
        self._draw(canonical)

    def close(self) -> None:
        """Draw the bar full and end its line."""
        self.done = self.total
        self._draw("done")
        if self._drawn:
            sys.stderr.write("\n")
            sys.stderr.flush()

    def _draw(self, text: str) -> None:
        if not self.enabled:
            return
        filled = WIDTH * self.done // max(self.total, 1)
        bar = "#" * filled + "." * (WIDTH - filled)
        sys.stderr.write(f"\r{self.label} [{bar}] {self.done}/{self.total} layers  {text:<40.40}")
        sys.stderr.flush()
        self._drawn = True


def human_size(n: int) -> str:
    """Bytes as `917 B`, `12.3 MB`, `2.6 GB` (powers of 1000)."""
    size, units = float(n), ["B", "kB", "MB", "GB", "TB"]
    while size >= 1000 and len(units) > 1:
        size /= 1000
        units.pop(0)
    return f"{n} B" if units[0] == "B" else f"{size:.1f} {units[0]}"


def on_terminal() -> bool:
    """Whether stderr is a terminal (progress bars and info lines are shown only there)."""
    return sys.stderr.isatty()


@contextmanager
def stderr_logging(verbose: bool) -> Iterator[None]:
    """Send the `ovbuild` logger to stderr for one command: info lines when verbose, else warnings only."""
    logger = logging.getLogger("ovbuild")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("ovbuild: %(message)s"))
    previous = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO if verbose else logging.WARNING)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)


@contextmanager
def hub_progress(enabled: bool) -> Iterator[None]:
    """Let huggingface_hub draw its download bars only when ours are shown."""
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    silence = not enabled and not are_progress_bars_disabled()
    if silence:
        disable_progress_bars()
    try:
        yield
    finally:
        if silence:
            enable_progress_bars()
