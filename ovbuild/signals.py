"""SIGINT and SIGTERM as exceptions, so that `finally` blocks and context managers clean up; and the few steps that
must not be cut in half (moving an export into place, removing its partial folder) hold them back until done."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

HANDLED = (signal.SIGINT, signal.SIGTERM)


class Terminated(BaseException):
    """SIGTERM arrived: raised in the main thread like KeyboardInterrupt (not an Exception, so nothing swallows it)."""


def _raise_terminated(signum, frame) -> None:
    raise Terminated


def _on_main_thread() -> bool:
    # Python runs signal handlers, and lets them be set, on the main thread only.
    return threading.current_thread() is threading.main_thread()


@contextmanager
def sigterm_raises() -> Iterator[None]:
    """Within the block, SIGTERM raises Terminated (Python's default for SIGTERM is to die without any cleanup)."""
    if not _on_main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


@contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold SIGINT and SIGTERM back while the block runs, then deliver the first that arrived (if any).

    The handlers are swapped rather than the signals masked: a signal can be delivered to any thread (OpenVINO runs
    its own), and Python then runs the handler on the main thread whatever the main thread's mask says.
    """
    if not _on_main_thread():
        yield
        return
    received: list[int] = []
    previous = {s: signal.signal(s, lambda signum, frame: received.append(signum)) for s in HANDLED}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)
        if received:
            deliver(received[0])


def deliver(signum: int) -> None:
    """Act on `signum` as its current handler would: a Python handler is called right here (raising, say,
    KeyboardInterrupt), an ignored signal does nothing, and the default action is taken by the system."""
    handler = signal.getsignal(signum)
    if callable(handler):
        handler(signum, None)
    elif handler != signal.SIG_IGN:
        signal.raise_signal(signum)
