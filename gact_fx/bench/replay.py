"""A convergence run replayed with the exact gradient beside the compressed one at each step.

A convergence run's largest gradient norm against fp32's at the same step compares two
trajectories: once their weights part, a spike in one need not fall on the same step in
the other. Here each step's compressed gradient is compared with the exact gradient at
the same weights and batch (the plain module, uncompiled, in full precision), so that a
spike is seen to be the model's own (the exact norm spikes too) or the compression's
(only the compressed one does). The replay runs the convergence loop itself
(``bench.train``) with an observer, so it follows the same trajectory as ``train`` with
the same options.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

import gact_fx

from .train import _Run


@dataclass(frozen=True)
class StepGradient:
    step: int
    loss: float
    norm: float  # the compressed gradient's
    exact_norm: float  # the exact gradient's, at the same weights and batch
    relative_error: float  # ||g - g_exact|| / ||g_exact||


def replay(task, options: dict, *, steps: int, seed: int = 0, noise_seed: int | None = None,
           schedule_steps: int = 1000, progress: Callable[[StepGradient], None] | None = None) -> list[StepGradient]:
    """Train ``task`` with gact ``options`` for ``steps`` of a ``schedule_steps`` schedule
    (``bench.train``'s loop), taking the exact gradient before each compressed step."""
    run = _Run(task, "replay", gact_fx.backend(**options), dict(options), seed, None, schedule_steps=schedule_steps,
               noise_seed=noise_seed)
    observer = _ExactBeside(task, run.model, progress)
    run.go(steps, eval_every=steps, progress=None, observer=observer)
    return observer.rows


class _ExactBeside:
    """Takes the exact gradient before each step of a run, and compares the step's with it."""

    def __init__(self, task, model: torch.nn.Module, progress) -> None:
        self._task, self._model, self._progress = task, model, progress
        self._exact: torch.Tensor | None = None
        self.rows: list[StepGradient] = []

    def before(self, step: int, inputs, target) -> None:
        rng = torch.get_rng_state()  # the compressed step draws what it draws without the replay
        self._model.zero_grad(set_to_none=True)
        self._task.loss(self._model(*inputs), target).backward()
        self._exact = _flat_grad(self._model)
        torch.set_rng_state(rng)

    def after(self, step: int, loss: torch.Tensor) -> None:
        got, exact = _flat_grad(self._model), self._exact
        exact_norm = float(exact.norm())
        self.rows.append(StepGradient(step, float(loss), float(got.norm()), exact_norm,
                                      float((got - exact).norm()) / exact_norm if exact_norm else 0.0))
        if self._progress is not None:
            self._progress(self.rows[-1])


def _flat_grad(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.detach().float().flatten() for p in model.parameters() if p.grad is not None])
