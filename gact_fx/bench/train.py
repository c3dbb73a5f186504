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
    "3 bit": {"bits": 3},  # L1 and L1.2 at 3 bits (two bit planes)
    "3 bit, attention floor 4": {"bits": 3, "nonlinear_bits": 4},
    "3 bit, rotation 32": {"bits": 3, "rotation": 32},
    "3 bit, attention floor 4, rotation 32": {"bits": 3, "nonlinear_bits": 4, "rotation": 32},
    "L1.2, rotation 32": {"level": "L1.2", "rotation": 32},
    "3 bit, rotation 32, groups of 128": {"bits": 3, "rotation": 32, "group_size": 128},
    "L1.2, rotation 32, groups of 128": {"level": "L1.2", "rotation": 32, "group_size": 128},
    "L1.2, groups of 128": {"level": "L1.2", "group_size": 128},
    "L1.2, attention floor 4": {"level": "L1.2", "nonlinear_bits": 4},
    "L2 (adaptive 4)": {"level": "L2"},
    "L2.1 (adaptive 3)": {"level": "L2.1"},
    "L2.2 (adaptive 2)": {"level": "L2.2"},
    # the adaptive levels before they grouped by feature
    "L2.1, contiguous groups": {"level": "L2.1", "feature_groups": False},
    "L2.2, contiguous groups": {"level": "L2.2", "feature_groups": False},
    "L1, feature groups": {"level": "L1", "feature_groups": True},
    "L1.2, feature groups": {"level": "L1.2", "feature_groups": True},
    "L2.2, feature groups": {"level": "L2.2", "feature_groups": True},
    # each parameter's gradient error against its own scale (gradient_metric='relative')
    "L2.2, relative metric": {"level": "L2.2", "gradient_metric": "relative"},
    "L2.2, feature groups, relative metric": {"level": "L2.2", "feature_groups": True, "gradient_metric": "relative"},
    "L2.1, feature groups, relative metric": {"level": "L2.1", "feature_groups": True, "gradient_metric": "relative"},
}  # gact options by level, for benchmarks/convergence.py


def largest_norm_ratio(norms: list[float], reference: list[float]) -> float | None:
    """The largest ratio of one run's gradient norm to a reference run's at the same step."""
    return max((a / b for a, b in zip(norms, reference) if b > 0), default=None)


@dataclass
class TrainResult:
    task: str
    method: str
    options: dict
    metric: str
    curve: list[tuple[int, float]] = field(default_factory=list)  # (step, metric)
    losses: list[tuple[int, float]] = field(default_factory=list)  # (step, training loss)
    grad_norms: list[float] = field(default_factory=list)  # the gradient's norm at every step
    seconds: float = 0.0
    diverged: bool = False
    average_bits: float | None = None  # over every compressed float tensor, floors included
    activation_ratio: float | None = None  # activation bytes without gact / with (the report)

    @property
    def final(self) -> float:
        return self.curve[-1][1] if self.curve else float("nan")


def train(task, method: str, options: dict | Method, *, steps: int, eval_every: int, seed: int = 0,
          progress=None, compiler: str = "auto", max_grad_norm: float | None = None) -> TrainResult:
    """``options``: gact options, or a ``bench.methods.Method`` (compiled with ``compiler``).
    ``max_grad_norm``: clip the gradients' total norm to it before each step (as the
    transformers Trainer does by default, at 1.0); the recorded norms are the unclipped ones."""
    if isinstance(options, Method):
        with options.patches():
            gact = dict(options.gact) if options.gact is not None else {"enabled": False}
            return _train(task, method, options.backend(compiler), gact, steps, eval_every, seed, progress,
                          max_grad_norm)
    return _train(task, method, gact_fx.backend(**options), dict(options), steps, eval_every, seed, progress,
                  max_grad_norm)


def _train(task, method, backend, options, steps, eval_every, seed, progress, max_grad_norm=None) -> TrainResult:
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
        result.grad_norms.append(_gradient_norm(model))
        if max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
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
    if options.get("enabled", True):  # without gact (fp32, torch's fp8 pass) the report says nothing
        result.average_bits, result.activation_ratio = _bits_reached(backend.report())
    return result


def _gradient_norm(model: torch.nn.Module) -> float:
    norms = [p.grad.detach().float().norm() for p in model.parameters() if p.grad is not None]
    return float(torch.stack(norms).norm()) if norms else 0.0


def _bits_reached(report) -> tuple[float | None, float | None]:
    """Average bits over the compressed float tensors (in force at the end) and the activation ratio."""
    rows = [r for r in report.rows if r.stored == "compressed" and r.dtype != "bool" and r.bits is not None]
    elements = sum(r.stored_numel for r in rows)
    average = sum(r.bits * r.stored_numel for r in rows) / elements if elements else None
    after = report.activation_bytes_after
    return average, (report.activation_bytes_before / after if after else None)

