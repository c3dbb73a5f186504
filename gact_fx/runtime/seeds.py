"""Rounding seeds: one fresh, reproducible seed per quantize call, without touching torch's RNG.

Stochastic rounding must not draw from the global generator: that would shift every
later dropout mask and make compressed runs incomparable with uncompressed ones. Each
quantize call instead asks this module for a seed, derived from a process-wide base
seed and a call counter. ``manual_seed`` makes a run reproducible; ``pin`` fixes the
seed of one slot (one saved-tensor site) so that repeated calls agree, which
``torch.library.opcheck`` needs.
"""

from __future__ import annotations

import itertools
import threading

_MASK64 = (1 << 64) - 1


def _mix64(value: int) -> int:
    """splitmix64 finaliser: decorrelates consecutive counters into unrelated seeds."""
    value = (value + 0x9E3779B97F4A7C15) & _MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (value ^ (value >> 31)) & ((1 << 63) - 1)


class RoundingSeeds:
    """Hands out seeds: ``mix(base, counter)``, or a pinned value for a pinned slot."""

    def __init__(self, base_seed: int = 0) -> None:
        self._lock = threading.Lock()
        self._pinned: dict[int, int] = {}
        self.manual_seed(base_seed)

    def manual_seed(self, base_seed: int) -> None:
        with self._lock:
            self._base = _mix64(int(base_seed))
            self._counter = itertools.count()

    def next_seed(self, slot: int) -> int:
        with self._lock:
            pinned = self._pinned.get(slot)
            if pinned is not None:
                return pinned
            return _mix64(self._base ^ next(self._counter))

    def pin(self, slot: int, seed: int) -> None:
        with self._lock:
            self._pinned[slot] = _mix64(seed)

    def unpin_all(self) -> None:
        with self._lock:
            self._pinned.clear()


DEFAULT_SEEDS = RoundingSeeds()


def manual_seed(seed: int) -> None:
    """Make gact's stochastic rounding reproducible (independent of ``torch.manual_seed``)."""
    DEFAULT_SEEDS.manual_seed(seed)
