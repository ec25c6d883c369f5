"""What every stage shares: the special tokens, the log line and JSON files."""

from __future__ import annotations

import json
import time
from pathlib import Path

EOS = "<|endoftext|>"
MASK = "<|mask|>"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n")


def read_json(path: Path):
    return json.loads(path.read_text())
