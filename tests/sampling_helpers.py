"""Statistics shared by the sampling tests."""

from __future__ import annotations

import math
from collections import Counter


def two_sample_chi_square(a: Counter, b: Counter) -> tuple[float, float]:
    """Pearson statistic of two equal-size samples over their cells (cells under 10 in total pooled), and the 1e-4
    critical value (Wilson-Hilferty)."""
    cells = sorted(set(a) | set(b), key=lambda c: -(a[c] + b[c]))
    big = [c for c in cells if a[c] + b[c] >= 10]
    rest = [c for c in cells if a[c] + b[c] < 10]
    pairs = [(a[c], b[c]) for c in big] + ([(sum(a[c] for c in rest), sum(b[c] for c in rest))] if rest else [])
    stat = sum((x - y) ** 2 / (x + y) for x, y in pairs)
    df = len(pairs) - 1
    return stat, df * (1 - 2 / (9 * df) + 3.72 * math.sqrt(2 / (9 * df))) ** 3
