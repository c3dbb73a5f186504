"""Bit allocation: GACT's gradient-variance model and the solvers (numbers only, no torch.fx)."""

from .solvers import AllocationProblem, dynamic_programming, exact, greedy, solve
from .variance import FULL_PRECISION, quantization_variance, total_variance

__all__ = [
    "AllocationProblem", "FULL_PRECISION", "dynamic_programming", "exact", "greedy", "quantization_variance",
    "solve", "total_variance",
]
