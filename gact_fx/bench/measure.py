"""One (model, method) measurement: compile time, step time, saved bytes, peak memory, max batch.

* saved bytes: what autograd keeps after one forward when the caller keeps only the loss
  (``gact_fx.measure``: parameters and buffers left out, saved outputs counted), less
  the copies of weights the backward holds (Inductor's conv weight layouts on the CPU;
  from the compile's report), which are counted apart: the activations the method is
  about;
* peak memory: on CUDA ``max_memory_allocated`` over one step (weights included); on the
  CPU the peak of the allocations a step makes above what it started with, replayed
  from the profiler's ``[memory]`` events;
* step time: median of several steps after warm-up (CUDA-synchronised on a GPU);
* max batch (CUDA only): doubling then bisection, catching out-of-memory cleanly, never
  above a limit.

A failure is recorded with its message, never raised: one broken method must not stop
the suite.
"""

from __future__ import annotations

import copy
import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from ..measure import saved_bytes_by_kind
from .methods import Method
from .zoo import Workload


@dataclass
class Measurement:
    model: str
    size: str
    method: str
    batch: int
    compile_s: float | None = None
    step_ms: float | None = None
    saved_bytes: int | None = None  # activations held for the backward
    weight_copy_bytes: int | None = None  # copies of weights held for the backward (apart)
    peak_bytes: int | None = None
    max_batch: int | None = None
    bits: int | None = None
    error: str | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_training(step: Callable[[], None], *, device: str, steps: int, warming: Callable[[], bool] = lambda: False,
                  deadline: float = float("inf")) -> tuple[float, float]:
    """(seconds of the first step, which compiles; median ms of ``steps`` steps after warm-up).

    Warm-up runs while ``warming()`` (adaptive methods first measure every tensor), at
    most 20 steps or until ``deadline`` (``time.monotonic()``)."""
    started = time.perf_counter()
    step()
    _sync(device)
    compile_s = time.perf_counter() - started
    for _ in range(20):
        step()
        if not warming() or time.monotonic() > deadline:
            break
    times = []
    for _ in range(steps):
        _sync(device)
        started = time.perf_counter()
        step()
        _sync(device)
        times.append(time.perf_counter() - started)
    return compile_s, 1e3 * statistics.median(times)


def probing(backend) -> bool:
    """Whether an adaptive backend is still measuring its tensors' sensitivity (warm-up, not timed)."""
    controller = backend.controller
    return controller is not None and any(not r.fully_measured for r in controller.regions.values())


def _cpu_step_peak(step) -> int:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
        step()
    events = sorted(
        (e for e in profiler.profiler.kineto_results.events() if e.name() == "[memory]"), key=lambda e: e.start_ns()
    )
    live = peak = 0
    for event in events:
        live += event.nbytes()
        peak = max(peak, live)
    return peak


def _short(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}".splitlines()[0]
    return text[:160]


class _Runner:
    """A compiled copy of the workload's model under a method, and one training step."""

    def __init__(self, workload: Workload, method: Method, compiler: str):
        self.workload = workload
        self.model = copy.deepcopy(workload.model)
        if method.checkpoint:
            if workload.checkpointing is None:
                raise NotImplementedError("n/a: the model has no per-block checkpointing")
            workload.checkpointing(self.model)
        self.model.train()
        self.backend = method.backend(compiler)
        self.compiled = torch.compile(self.model, backend=self.backend)

    def step(self, inputs) -> None:
        self.model.zero_grad(set_to_none=True)
        self.workload.loss(self.compiled(*inputs)).backward()

    def probing(self) -> bool:
        return probing(self.backend)


def measure(workload: Workload, method: Method, *, model: str, size: str, compiler: str, device: str,
            steps: int, find_max_batch: bool = False) -> Measurement:
    batch = workload.default_batch
    result = Measurement(model, size, method.name, batch, bits=method.bits)
    try:
        with method.patches():
            runner = _Runner(workload, method, compiler)
            inputs = workload.batch(batch)
            result.compile_s, result.step_ms = time_training(
                lambda: runner.step(inputs), device=device, steps=steps, warming=runner.probing
            )
            # The compiled module's parameters and buffers are the model's: left out. Weight
            # copies: the graphs show casts and transposes; layout copies Inductor makes
            # later show only as saved tensors equal to a weight. Both see some copies.
            activations, layout_copies = saved_bytes_by_kind(runner.compiled, *inputs)
            held = activations + layout_copies
            result.weight_copy_bytes = max(layout_copies, runner.backend.report().parameter_copy_bytes)
            result.saved_bytes = held - result.weight_copy_bytes
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
                runner.step(inputs)
                result.peak_bytes = torch.cuda.max_memory_allocated()
            else:
                result.peak_bytes = _cpu_step_peak(lambda: runner.step(inputs))
            if find_max_batch and device == "cuda":
                result.max_batch = _max_batch(lambda size: _fits(runner, size), batch)
    except Exception as error:  # recorded in the table, not raised: the suite goes on
        result.error = _short(error)
    finally:
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
    return result


def _fits(runner: _Runner, batch: int) -> bool:
    try:
        runner.step(runner.workload.batch(batch))
        torch.cuda.synchronize()
        return True
    except torch.cuda.OutOfMemoryError:
        return False
    finally:
        runner.model.zero_grad(set_to_none=True)
        gc.collect()
        torch.cuda.empty_cache()


def _max_batch(fits: Callable[[int], bool], start: int, limit: int = 1 << 16) -> int:
    """Largest batch up to ``limit`` that ``fits`` (trains without running out of memory):
    doubling from ``start``, then bisection to within 1/32. No batch above ``limit`` is tried."""
    low, high = 0, max(1, min(start, limit))
    while high <= limit and fits(high):
        low, high = high, high * 2
    high = min(high, limit + 1)  # known not to fit, or past the limit: never tried
    while high - low > max(1, low // 32):
        middle = (low + high) // 2
        if fits(middle):
            low = middle
        else:
            high = middle
    return low
