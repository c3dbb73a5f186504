"""Train a task under one gact configuration and record the curve: the accuracy runner.

Every run starts from the same weights, data order and gact rounding seed; only the
options differ. Evaluation runs under ``torch.no_grad()`` (no compression cost).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import torch

import gact_fx

from .methods import Method
from .tasks import lr_scale

log = logging.getLogger("gact_fx.bench")

METHODS = {
    "fp32": {"enabled": False},
    "L1.1 (8 bit)": {"level": "L1.1"},
    "L1 (4 bit)": {"level": "L1"},
    "L1.2 (2 bit)": {"level": "L1.2"},
    "L2 (adaptive 4)": {"level": "L2"},
    "L2.1 (adaptive 3)": {"level": "L2.1"},
    "L2.2 (adaptive 2)": {"level": "L2.2"},
}  # gact options by level, for benchmarks/convergence.py


@dataclass
class TrainResult:
    task: str
    method: str
    options: dict
    metric: str
    curve: list[tuple[int, float]] = field(default_factory=list)  # (step, metric)
    losses: list[tuple[int, float]] = field(default_factory=list)  # (step, training loss)
    seconds: float = 0.0
    diverged: bool = False
    average_bits: float | None = None

    @property
    def final(self) -> float:
        return self.curve[-1][1] if self.curve else float("nan")


def train(task, method: str, options: dict | Method, *, steps: int, eval_every: int, seed: int = 0,
          progress=None, compiler: str = "auto") -> TrainResult:
    """``options``: gact options, or a ``bench.methods.Method`` (compiled with ``compiler``)."""
    if isinstance(options, Method):
        with options.patches():
            return _train(task, method, options.backend(compiler), dict(options.gact or {}), steps, eval_every, seed, progress)
    return _train(task, method, gact_fx.backend(**options), dict(options), steps, eval_every, seed, progress)


def _train(task, method, backend, options, steps, eval_every, seed, progress) -> TrainResult:
    torch.manual_seed(seed)
    gact_fx.manual_seed(seed)
    model = task.model()
    compiled = torch.compile(model, backend=backend)
    optimizer = task.optimizer(model)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_scale(s, steps))
    generator = torch.Generator().manual_seed(seed)
    result = TrainResult(task.name, method, options, task.metric)
    started = time.perf_counter()
    for step in range(1, steps + 1):
        inputs, target = task.batch(step, generator)
        loss = task.loss(compiled(*inputs), target)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        if not torch.isfinite(loss):
            result.diverged = True
            log.warning("%s / %s diverged at step %d", task.name, method, step)
            break
        if step % eval_every == 0 or step == steps:
            result.losses.append((step, loss.item()))
            result.curve.append((step, task.evaluate(compiled)))
            if progress is not None:
                progress(result)
    result.seconds = time.perf_counter() - started
    if backend.controller is not None and backend.controller.tensors():  # none: every tensor was too small
        result.average_bits = backend.controller.average_bits()
    return result

