"""Train a task under one gact configuration and record the curve: the accuracy runner.

Every run starts from the same weights, data order and gact rounding seed; only the
options differ (a run may draw its rounding from another seed, ``noise_seed``, to show
how far the noise alone moves a result). A run can also start from a ``WarmStart``: the
state fp32 training reached after some steps (weights, optimizer, schedule, data order),
from which each method continues as fp32 would have. Evaluation runs under ``torch.no_grad()`` (no
compression cost).
"""

from __future__ import annotations

import copy
import logging
import time
from dataclasses import dataclass, field

import torch

import gact_fx

from .methods import PLAIN_FORMAT, Method
from .tasks import lr_scale

log = logging.getLogger("gact_fx.bench")

# The solver's options with query and key floored at 4 bits, rotated and debiased,
# dithered (docs/accuracy.md, "About 12x"); also warm-screened.
_ROTATED = {"feature_groups": True, "gradient_metric": "relative", "nonlinear_bits": 4, "nonlinear_rotation": 32,
            "rounding": "dithered", "debias_attention": True}
ADAPTIVE_ROTATED = {
    f"adaptive {bits}, feature groups, relative metric, attention floor 4, dithered, debiased, q/k rotation 32": {
        "avg_bits": bits, **_ROTATED}
    for bits in (2.25, 2.5, 2.75)
}

# The budget over every byte held (``AdaptiveConfig.budget``): 2.65 bits a full-precision
# element is 12.1x fewer activation bytes than fp32, whatever the model's floors, masks and
# rebuilt tensors; with query and key at 4 bits (rotated, debiased) as above, or at their
# default floor of 8, paid from the same bytes. 3.2 bits is 10x.
ADAPTIVE_BYTES = {
    "adaptive 2.65 in bytes, feature groups, relative metric, attention floor 4, dithered, debiased, "
    "q/k rotation 32": {"avg_bits": 2.65, "budget": "bytes", **_ROTATED},
    "adaptive 2.65 in bytes, feature groups, relative metric, dithered": {
        "avg_bits": 2.65, "budget": "bytes", "feature_groups": True, "gradient_metric": "relative",
        "rounding": "dithered"},
    # 10x, a candidate for the default's level: query and key at their floor of 8, no debiasing
    "adaptive 3.2 in bytes, feature groups, relative metric, dithered": {
        "avg_bits": 3.2, "budget": "bytes", "feature_groups": True, "gradient_metric": "relative",
        "rounding": "dithered"},
}
# The same budgets with attention's value rebuilt from the QKV projection's input
# (``recompute_projections``): its bytes go to the other tensors.
ADAPTIVE_BYTES |= {f"{name}, projections rebuilt": {**options, "recompute_projections": True}
                   for name, options in ADAPTIVE_BYTES.items() if options["avg_bits"] == 2.65}

# The uniform methods name the groups they ran with before feature groups became the
# default (contiguous), so that a method keeps one meaning across result files.
METHODS = {
    "fp32": {"enabled": False},
    # fp32 without Inductor's fusions: the same arithmetic rounded in another order, which
    # shows how far differences at float32's last bit alone move a run from fp32's
    "fp32, eager": {"enabled": False, "compiler": "eager"},
    "L1.1 (8 bit)": {"level": "L1.1", "feature_groups": False},
    "L1 (4 bit)": {"level": "L1", "feature_groups": False},
    "L1.2 (2 bit)": {"level": "L1.2", "feature_groups": False},
    "3 bit": {"bits": 3, "feature_groups": False},  # L1 and L1.2 at 3 bits (two bit planes)
    "3 bit, feature groups": {"bits": 3, "feature_groups": True},
    "3 bit, attention floor 4": {"bits": 3, "nonlinear_bits": 4, "feature_groups": False},
    "3 bit, rotation 32": {"bits": 3, "rotation": 32, "feature_groups": False},
    "3 bit, attention floor 4, rotation 32": {"bits": 3, "nonlinear_bits": 4, "rotation": 32, "feature_groups": False},
    "L1.2, rotation 32": {"level": "L1.2", "rotation": 32, "feature_groups": False},
    "3 bit, rotation 32, groups of 128": {"bits": 3, "rotation": 32, "group_size": 128, "feature_groups": False},
    "L1.2, rotation 32, groups of 128": {"level": "L1.2", "rotation": 32, "group_size": 128, "feature_groups": False},
    "L1.2, groups of 128": {"level": "L1.2", "group_size": 128, "feature_groups": False},
    "L1.2, attention floor 4": {"level": "L1.2", "nonlinear_bits": 4, "feature_groups": False},
    "L2 (adaptive 4)": {"level": "L2"},
    "L2.1 (adaptive 3)": {"level": "L2.1"},
    "L2.2 (adaptive 2)": {"level": "L2.2"},
    # the adaptive levels before they grouped by feature
    "L2.1, contiguous groups": {"level": "L2.1", "feature_groups": False},
    "L2.2, contiguous groups": {"level": "L2.2", "feature_groups": False},
    "L1, feature groups": {"level": "L1", "feature_groups": True},
    "L1.1, feature groups": {"level": "L1.1", "feature_groups": True},  # 8 bits: a control for the feature groups
    # where a gap comes from: the default with some tensors at 8 bits. "*.mlp.*" matches what the derivative
    # pass saves for a gated MLP's backward (GELU's derivative times the gate, the activation), not the
    # gated product, which is named after the MLP itself ("...mlp:mul")
    "L1, feature groups, MLP at 8": {"level": "L1", "feature_groups": True, "overrides": {"*.mlp.*": 8}},
    "L1, feature groups, MLP and attention at 8": {"level": "L1", "feature_groups": True,
                                                   "overrides": {"*.mlp.*": 8, "*.attn.*": 8, "*.attn:*": 8}},
    "L1, feature groups, MLP and norms at 8": {"level": "L1", "feature_groups": True,
                                               "overrides": {"*.mlp.*": 8, "*norm:*": 8}},
    "L1, feature groups, attention floor 4": {"level": "L1", "nonlinear_bits": 4, "feature_groups": True},
    "L1.2, feature groups": {"level": "L1.2", "feature_groups": True},
    "L2.2, feature groups": {"level": "L2.2", "feature_groups": True},
    # each parameter's gradient error against its own scale (gradient_metric='relative')
    "L2.2, relative metric": {"level": "L2.2", "gradient_metric": "relative"},
    "L2.2, feature groups, relative metric": {"level": "L2.2", "feature_groups": True, "gradient_metric": "relative"},
    "L2.1, feature groups, relative metric": {"level": "L2.1", "feature_groups": True, "gradient_metric": "relative"},
    # adaptive between L2.1 and L2.2
    "adaptive 2.5, feature groups": {"avg_bits": 2.5, "feature_groups": True},
    "adaptive 2.5, feature groups, relative metric": {"avg_bits": 2.5, "feature_groups": True,
                                                      "gradient_metric": "relative"},
    "adaptive 2.75, feature groups, relative metric": {"avg_bits": 2.75, "feature_groups": True,
                                                       "gradient_metric": "relative"},
    # dithered rounding (rounding='dithered'): the same codes, half the variance
    "L1, feature groups, dithered": {"level": "L1", "feature_groups": True, "rounding": "dithered"},
    "3 bit, feature groups, dithered": {"bits": 3, "feature_groups": True, "rounding": "dithered"},
    "3 bit, feature groups, attention floor 4, dithered": {"bits": 3, "nonlinear_bits": 4, "feature_groups": True,
                                                           "rounding": "dithered"},
    "3 bit, feature groups, attention floor 4, dithered, debiased": {
        "bits": 3, "nonlinear_bits": 4, "feature_groups": True, "rounding": "dithered", "debias_attention": True},
    "L1.2, feature groups, dithered": {"level": "L1.2", "feature_groups": True, "rounding": "dithered"},
    "L2.2, feature groups, dithered": {"level": "L2.2", "feature_groups": True, "rounding": "dithered"},
    "L2.2, feature groups, relative metric, dithered": {"level": "L2.2", "feature_groups": True,
                                                        "gradient_metric": "relative", "rounding": "dithered"},
    "adaptive 2.5, feature groups, relative metric, dithered": {"avg_bits": 2.5, "feature_groups": True,
                                                                "gradient_metric": "relative", "rounding": "dithered"},
    # Runs before exact_statistics existed (results committed before 2026-11-27) rounded
    # the norms' row statistics with everything else; every run since keeps them exact.
    # The names ending in "exact statistics" repeat an earlier method, to tell the two apart.
    "3 bit, feature groups, dithered, exact statistics": {"bits": 3, "feature_groups": True, "rounding": "dithered",
                                                          "exact_statistics": True},
    "3 bit, feature groups, attention floor 4, dithered, debiased, exact statistics": {
        "bits": 3, "nonlinear_bits": 4, "feature_groups": True, "rounding": "dithered", "debias_attention": True,
        "exact_statistics": True},
    "L1, feature groups, exact statistics": {"level": "L1", "feature_groups": True, "exact_statistics": True},
    "adaptive 2.5, feature groups, relative metric, attention floor 4, dithered, debiased": {
        "avg_bits": 2.5, "feature_groups": True, "gradient_metric": "relative", "nonlinear_bits": 4,
        "rounding": "dithered", "debias_attention": True},
    "3 bit, feature groups, attention floor 4, dithered, q/k rotation 32": {
        "bits": 3, "nonlinear_bits": 4, "nonlinear_rotation": 32, "feature_groups": True, "rounding": "dithered"},
    "3 bit, feature groups, attention floor 4, dithered, debiased, q/k rotation 32": {
        "bits": 3, "nonlinear_bits": 4, "nonlinear_rotation": 32, "feature_groups": True, "rounding": "dithered",
        "debias_attention": True},
    # recompute_projections: attention's value rebuilt from the QKV projection's input
    "3 bit, feature groups, dithered, projections rebuilt": {"bits": 3, "feature_groups": True, "rounding": "dithered",
                                                             "recompute_projections": True},
    "L1, feature groups, projections rebuilt": {"level": "L1", "feature_groups": True, "recompute_projections": True},
    **ADAPTIVE_ROTATED,
    **ADAPTIVE_BYTES,
}  # gact options by level, for benchmarks/convergence.py
METHODS = {name: options if options.get("enabled") is False else {**PLAIN_FORMAT, **options}
           for name, options in METHODS.items()}


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
    warm_steps: int = 0  # fp32 steps before this run's first (its curve counts on from them)

    @property
    def final(self) -> float:
        return self.curve[-1][1] if self.curve else float("nan")


@dataclass
class WarmStart:
    """fp32 training's state after ``steps`` steps of a schedule ``steps + then`` long."""

    steps: int
    then: int  # the steps each method continues for
    model: dict
    optimizer: dict
    schedule: dict
    generator: torch.Tensor

    def restore(self, model, optimizer, schedule, generator) -> None:
        model.load_state_dict(self.model)
        optimizer.load_state_dict(copy.deepcopy(self.optimizer))
        schedule.load_state_dict(self.schedule)
        generator.set_state(self.generator)


def warm_start(task, *, steps: int, then: int, seed: int = 0, max_grad_norm: float | None = None) -> WarmStart:
    """Train ``task`` in fp32 for ``steps`` of a ``steps + then`` schedule and keep its state."""
    run = _Run(task, "fp32 (warm start)", gact_fx.backend(enabled=False), {"enabled": False}, seed, max_grad_norm,
               schedule_steps=steps + then)
    run.go(steps, eval_every=steps, progress=None)
    return WarmStart(steps, then, copy.deepcopy(run.model.state_dict()), copy.deepcopy(run.optimizer.state_dict()),
                     run.schedule.state_dict(), run.generator.get_state())


def train(task, method: str, options: dict | Method, *, steps: int, eval_every: int, seed: int = 0,
          progress=None, compiler: str = "auto", max_grad_norm: float | None = None,
          warm: WarmStart | None = None, noise_seed: int | None = None) -> TrainResult:
    """``options``: gact options, or a ``bench.methods.Method`` (compiled with ``compiler``).
    ``max_grad_norm``: clip the gradients' total norm to it before each step (as the
    transformers Trainer does by default, at 1.0); the recorded norms are the unclipped ones.
    ``warm``: continue from that fp32 state (made with the same task, seed and clipping)
    for its ``then`` steps, which must be ``steps``. ``noise_seed``: gact's rounding seed
    (default ``seed``); data, weights and order still follow ``seed``."""
    if warm is not None and warm.then != steps:
        raise ValueError(f"the warm start was made for {warm.then} more steps, not {steps}")
    schedule_steps = warm.steps + steps if warm is not None else steps
    if isinstance(options, Method):
        with options.patches():
            gact = dict(options.gact) if options.gact is not None else {"enabled": False}
            return _Run(task, method, options.backend(compiler), gact, seed, max_grad_norm, schedule_steps=schedule_steps,
                        warm=warm, noise_seed=noise_seed).go(steps, eval_every, progress)
    return _Run(task, method, gact_fx.backend(**options), dict(options), seed, max_grad_norm,
                schedule_steps=schedule_steps, warm=warm, noise_seed=noise_seed).go(steps, eval_every, progress)


class _Run:
    """One training run: the model, optimizer, schedule (``schedule_steps`` long) and data
    order it owns, and its result. From a warm start, its steps count on from the start's."""

    def __init__(self, task, method, backend, options, seed, max_grad_norm, *, schedule_steps: int,
                 warm: WarmStart | None = None, noise_seed: int | None = None):
        torch.manual_seed(seed)
        gact_fx.manual_seed(seed if noise_seed is None else noise_seed)
        self.task, self.method, self.backend, self.options = task, method, backend, options
        self.max_grad_norm = max_grad_norm
        self.model = task.model()
        self.optimizer = task.optimizer(self.model)
        self.schedule = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: lr_scale(s, schedule_steps))
        self.generator = torch.Generator().manual_seed(seed)
        if warm is not None:
            warm.restore(self.model, self.optimizer, self.schedule, self.generator)
        self.result = TrainResult(task.name, method, options, task.metric, warm_steps=warm.steps if warm else 0)

    def go(self, steps: int, eval_every: int, progress, observer=None) -> TrainResult:
        """``observer``: an object whose ``before(step, inputs, target)`` runs before each
        step's forward and ``after(step, loss)`` after its backward (``bench.replay``)."""
        task, model, optimizer, schedule, result = self.task, self.model, self.optimizer, self.schedule, self.result
        first = result.warm_steps + 1
        last = first + steps - 1
        compiled = torch.compile(model, backend=self.backend)
        started = time.perf_counter()
        for step in range(first, last + 1):
            inputs, target = task.batch(step, self.generator)
            if observer is not None:
                observer.before(step, inputs, target)
            loss = task.loss(compiled(*inputs), target)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            result.grad_norms.append(_gradient_norm(model))
            if observer is not None:
                observer.after(step, loss)
            if self.max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), self.max_grad_norm)
            optimizer.step()
            schedule.step()
            if not torch.isfinite(loss):
                result.diverged = True
                log.warning("%s / %s diverged at step %d", task.name, self.method, step)
                break
            if step % eval_every == 0 or step == last:
                result.losses.append((step, loss.item()))
                result.curve.append((step, task.evaluate(compiled)))
                if progress is not None:
                    progress(result)
        result.seconds = time.perf_counter() - started
        if self.options.get("enabled", True):  # without gact (fp32, torch's fp8 pass) the report says nothing
            result.average_bits, result.activation_ratio = _bits_reached(self.backend.report())
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

