"""When adaptive bits measure the sensitivities again: soon, then less and less often, and
at once when the gradient norm jumps.

Sensitivities move during training (attention's query and key rose 1e4-1e5x over the
first 200 steps of a character LM), so an allocation measured at step 0 must not stand
until ``adapt_interval``. ``ProbeSchedule`` starts with an interval of
``adapt_interval / 64`` calls and doubles it after every probe up to ``adapt_interval``;
``GradientMonitor`` watches the norm of a graph's gradients and reports a jump (10x its
recent median), after which the schedule starts again from its shortest interval. Plain
objects with no torch graph inside: the controller owns one of each per graph.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

import torch

from . import _compat

INITIAL_FRACTION = 64  # the first interval is adapt_interval / 64 calls


@dataclass
class ProbeSchedule:
    max_interval: int  # ``adapt_interval``
    interval: int = 0  # calls between the last probe and the next (0: none yet)
    next_call: int = 1  # the call that probes next

    @property
    def first_interval(self) -> int:
        return max(1, self.max_interval // INITIAL_FRACTION)

    def due(self, calls: int) -> bool:
        return calls >= self.next_call

    def probed(self, calls: int) -> None:
        """A probe ran at ``calls``: the next one comes after a longer interval."""
        self.interval = min(self.max_interval, max(self.first_interval, 2 * self.interval))
        self.next_call = calls + self.interval

    def restart(self, calls: int) -> None:
        """Measure at the next call, then soon again."""
        self.interval = 0
        self.next_call = calls + 1

    def state_dict(self) -> dict:
        return {"interval": self.interval, "next_call": self.next_call}

    def load_state_dict(self, state: dict) -> None:
        self.interval, self.next_call = int(state["interval"]), int(state["next_call"])


@dataclass
class GradientMonitor:
    """Squared gradient norms per call, checked in batches (one device sync per batch)."""

    jump: float = 10.0  # a norm this many times the recent median is a jump
    check_every: int = 8  # calls between two checks
    history: deque = field(default_factory=lambda: deque(maxlen=32))  # recent norms (floats)
    pending: list = field(default_factory=list)  # squared norms not yet read (device scalars)

    def note(self, gradients) -> None:
        present = [g for g in gradients if isinstance(g, torch.Tensor) and g.is_floating_point()]
        if present:
            self.pending.append(_compat.squared_norm(present))

    def jumped(self) -> float | None:
        """The ratio of the largest new norm to the recent median, when it is a jump."""
        if len(self.pending) < self.check_every:
            return None
        squared = read_floats(self.pending)
        norms = [value ** 0.5 for value in squared]
        self.pending.clear()
        reference = statistics.median(self.history) if len(self.history) >= 4 else None
        self.history.extend(n for n in norms if n == n)  # NaN is not a reference
        if reference is None or reference <= 0:
            return None
        ratio = max(norms) / reference
        return ratio if ratio >= self.jump or ratio != ratio else None


def read_floats(scalars) -> list[float]:
    """Scalar tensors as floats, in one device sync where they share a device."""
    try:
        return torch.stack(list(scalars)).tolist() if scalars else []
    except RuntimeError:  # on several devices
        return [float(value) for value in scalars]
