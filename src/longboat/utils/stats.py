"""Small statistics shared by the evaluations (language-model benchmarks, closed-loop policy success)."""

from __future__ import annotations

import math

Z95 = 1.959963984540054  # the standard normal's 97.5% quantile


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a success rate (95% by default; sound near 0 and 1, unlike the normal one);
    (0, 1) when there is no trial, and exactly 0 or 1 at the ends when every trial failed or succeeded."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (0.0 if successes == 0 else centre - half), (1.0 if successes == n else centre + half)
