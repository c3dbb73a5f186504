"""GACT's gradient-variance model: ``V = sum_l C_l * S(b_l)``, ``S(b) = 1 / (2^b - 1)^2``.

``C_l`` is tensor l's measured sensitivity; ``S(b)`` the variance of stochastic rounding
at ``b`` bits relative to a unit range. Full precision (the pass-through "32 bits")
adds no variance.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

FULL_PRECISION = 32


def quantization_variance(bits: int) -> float:
    """``S(b)``; zero at full precision."""
    if bits >= FULL_PRECISION:
        return 0.0
    return 1.0 / (2**bits - 1) ** 2


def total_variance(sensitivities: Sequence[float], bits: Sequence[int]) -> float:
    return math.fsum(c * quantization_variance(b) for c, b in zip(sensitivities, bits))
