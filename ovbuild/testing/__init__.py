"""Tiny deterministic checkpoints for tests and the demo, and the NMSE helper every parity test uses."""

from ovbuild.runtime.reference.layers import nmse
from ovbuild.testing.tiny import (
    TINY_DRAFT,
    TINY_TARGET,
    write_tiny_dflash,
    write_tiny_target,
)
from ovbuild.testing.tiny_dflash2 import TINY_DFLASH2, write_tiny_dflash2

__all__ = [
    "TINY_DFLASH2",
    "TINY_DRAFT",
    "TINY_TARGET",
    "nmse",
    "write_tiny_dflash",
    "write_tiny_dflash2",
    "write_tiny_target",
]
