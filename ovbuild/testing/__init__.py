"""Tiny deterministic checkpoints for tests and the demo, and the NMSE helper every parity test uses."""

from ovbuild.reference.layers import nmse
from ovbuild.testing.tiny import (
    TINY_DRAFT,
    TINY_TARGET,
    write_tiny_dflash,
    write_tiny_target,
)
from ovbuild.testing.tiny_dflash2 import TINY_DFLASH2, write_tiny_dflash2, write_tiny_dflash2_short_window
from ovbuild.testing.tiny_dspark import DSPARK_KINDS, TINY_DSPARK, write_tiny_dspark

# NMSE bound of an f32 graph (f32 KV cache, f32 inference) against the float64 reference. Measured 1e-16 (heads,
# convs) to 8e-13 (DFlash v2 draft) on AVX-512 + bf16 and on AVX2-only alike; any real formula error lands above 1e-6.
F32_NMSE = 1e-10

__all__ = [
    "DSPARK_KINDS",
    "F32_NMSE",
    "TINY_DFLASH2",
    "TINY_DRAFT",
    "TINY_DSPARK",
    "TINY_TARGET",
    "nmse",
    "write_tiny_dflash",
    "write_tiny_dflash2",
    "write_tiny_dflash2_short_window",
    "write_tiny_dspark",
    "write_tiny_target",
]
