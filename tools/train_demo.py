#!/usr/bin/env python3
"""Train the ovbuild demo pair: a small Qwen3 target and a DFlash v1 draft for it, on Python stdlib code.

Development tool only (needs torch: ``pip install -e .[train]``). This is the entry point; the stages, the models'
training and the checks are in ``tools/demo_training/`` (its ``__init__`` describes every stage).

Reproduce everything (about 50 minutes on 2 idle CPU cores; see docs/demo_training.md)::

    python tools/train_demo.py
"""

from __future__ import annotations

import os

# The machine is shared: busy-waiting OpenMP threads make 2-thread torch up to 10x slower than 1 thread whenever
# another process holds a core. Passive waiting must be chosen before torch (and its OpenMP runtime) loads, i.e.
# before any demo_training module is imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import sys

from demo_training.cli import main

if __name__ == "__main__":
    sys.exit(main())
