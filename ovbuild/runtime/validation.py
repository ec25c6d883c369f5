"""Run-time input checks, made before any model is compiled or any request queued; each names the bad value.

`name` is how the caller's user knows the value: `--max-new-tokens` on the command line, `max_new_tokens` in Python.
"""

from __future__ import annotations

import math
import numbers
import os
import tempfile
from pathlib import Path

import numpy as np

from ovbuild.errors import ConfigError, RequestError
from ovbuild.runtime.model.machine import physical_memory_mb


def check_positive_int(value: object, name: str) -> int:
    """`value` as an int when it is an integer >= 1 (bools and floats are refused, not rounded)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def check_stop_strings(stops: tuple[str, ...], name: str) -> None:
    """Stop strings are non-empty text: an empty one would match before the first token."""
    for stop in stops:
        if not isinstance(stop, str):
            raise ConfigError(f"{name}: a stop string must be text, got {stop!r}")
        if not stop:
            raise ConfigError(f'{name} "" is empty: an empty stop string would end every request at once')
        check_utf8(stop, f"{name} {stop!r}")


def check_utf8(text: str, what: str) -> None:
    """Text the tokenizer can take: no lone surrogates (how Python carries non-UTF-8 bytes of argv or files)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = text[e.start].encode("utf-8", "surrogateescape") if 0xDC80 <= ord(text[e.start]) <= 0xDCFF else None
        shown = f"byte 0x{bad.hex()}" if bad else f"code point U+{ord(text[e.start]):04X}"
        raise RequestError(f"{what} is not valid UTF-8 ({shown} at character {e.start})") from None


def check_cache_mb(value: object, name: str) -> float:
    """A cache size in MB: a finite number > 0 and no larger than the machine's physical memory."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{name} must be a finite number of megabytes > 0, got {value!r}")
    memory = physical_memory_mb()
    if memory is not None and value > memory:
        raise ConfigError(f"{name} = {value:g} MB is more than this machine's physical memory ({memory:.0f} MB)")
    return float(value)


def check_writable(path: str | Path, name: str) -> None:
    """A file can be created or replaced at `path`: checked by creating (and removing) a file beside it."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{name} {path}: is a folder, not a file")
    parent = path.parent
    if not parent.is_dir():
        raise ConfigError(f"{name} {path}: cannot be written (no folder {parent})")
    try:
        with tempfile.NamedTemporaryFile(dir=parent, prefix=f".{path.name}.", suffix=".check"):
            pass
    except OSError as e:
        raise ConfigError(f"{name} {path}: cannot be written ({e.strerror or e})") from None
    if path.exists() and not os.access(path, os.W_OK):
        raise ConfigError(f"{name} {path}: cannot be written (permission denied)")


def token_ids(prompt: object, what: str) -> np.ndarray:
    """A prompt of token ids as an int64 array [S]; floats, nested lists and ids beyond int64 are refused."""
    ids = np.asarray(prompt)
    if ids.ndim != 1 or (ids.size and not np.issubdtype(ids.dtype, np.integer)):
        raise RequestError(f"{what}: the prompt must be a flat list of integer token ids, got {ids.dtype} {ids.shape}")
    return ids.astype(np.int64)


def check_token_ids(ids: np.ndarray, vocab_size: int | None, what: str) -> None:
    """Every id indexes the target's embedding: 0 <= id < vocab_size."""
    bad = np.flatnonzero((ids < 0) | (ids >= vocab_size)) if vocab_size is not None else np.flatnonzero(ids < 0)
    if len(bad):
        limit = f"0..{vocab_size - 1}" if vocab_size is not None else ">= 0"
        raise RequestError(
            f"{what}: token id {int(ids[bad[0]])} at position {int(bad[0])} is outside the vocabulary ({limit})"
        )


def check_length(prompt_len: int, max_new_tokens: int, max_model_len: int | None, what: str) -> None:
    """Prompt and new tokens fit the positions the target serves."""
    if max_model_len is not None and prompt_len + max_new_tokens > max_model_len:
        raise RequestError(
            f"{what}: {prompt_len} prompt tokens + max_new_tokens {max_new_tokens} = "
            f"{prompt_len + max_new_tokens} positions, beyond max_model_len {max_model_len}"
        )


def check_prompt(
    ids: np.ndarray, max_new_tokens: int, vocab_size: int | None, max_model_len: int | None, what: str
) -> None:
    """A tokenized prompt the target can take: known token ids, and room for max_new_tokens after it."""
    check_token_ids(ids, vocab_size, what)
    check_length(len(ids), max_new_tokens, max_model_len, what)
