"""Cost of adaptive bits: a probe step against a normal step, amortised over the interval.

A probe step runs one extra backward of the compiled graph per probed tensor, plus one
exact; with ``probe_tensors`` k and ``adapt_interval`` N the steady-state overhead is
``(t_probe - t_step) / (N * t_step)``. Measuring every tensor once at the start costs
``ceil(L / k)`` probe steps, paid once. Early in training the probes come more often
(``gact_fx.schedule.ProbeSchedule``: from N/64 calls, doubling up to N): the last
column counts the probes that schedule makes in 10,000 steps. CPU, one thread, medians.

    python benchmarks/adaptive_overhead.py [--models block bert] [--interval 1000]
"""

from __future__ import annotations

import argparse
import copy
import math
import pathlib
import statistics
import sys
import time

import torch

import gact_fx
from gact_fx.bench.methods import PLAIN_FORMAT
from gact_fx.schedule import ProbeSchedule

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from benchmarks._results import save_table  # noqa: E402
from benchmarks.cpu_step_time import cases  # noqa: E402
from tests.helpers import projection_loss  # noqa: E402


def step_times(model, inputs, backend, steps, warmup):
    model = copy.deepcopy(model)
    compiled = torch.compile(model, backend=backend)
    times = []
    for index in range(warmup + steps):
        started = time.perf_counter()
        model.zero_grad(set_to_none=True)
        projection_loss(compiled(*inputs)).backward()
        if index >= warmup:
            times.append(time.perf_counter() - started)
    return statistics.median(times), backend


def scheduled_probes(interval: int, calls: int) -> int:
    """Probe steps the growing schedule makes in ``calls`` calls (the first at call 1)."""
    schedule, probes = ProbeSchedule(interval), 0
    for call in range(1, calls + 1):
        if schedule.due(call):
            schedule.probed(call)
            probes += 1
    return probes


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mlp", "block", "conv", "bert"])
    parser.add_argument("--interval", type=int, default=1000)
    parser.add_argument("--probe-tensors", type=int, default=16)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    all_cases = cases()
    lines = [f"Eager path, avg_bits=2, probe_tensors={args.probe_tensors}, one thread.\n",
             "| model | tensors | normal step ms | probe step ms | initial probe steps | overhead at interval "
             f"{args.interval} | with the schedule's {scheduled_probes(args.interval, 10_000)} probes and the initial ones "
             "over 10k steps |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for name in args.models:
        model, inputs = all_cases[name]
        torch._dynamo.reset()
        options = dict(avg_bits=2, probe_tensors=args.probe_tensors, compiler="eager", **PLAIN_FORMAT)
        normal, backend = step_times(model, inputs, gact_fx.backend(adapt_interval=10**9, **options), args.steps, 8)
        tensors = len(backend.controller.tensors())
        torch._dynamo.reset()
        probing, _ = step_times(model, inputs, gact_fx.backend(adapt_interval=1, **options), args.steps, 3)
        initial = math.ceil(tensors / args.probe_tensors)
        extra = probing - normal
        steady = extra / (args.interval * normal)
        with_initial = (extra * (initial + scheduled_probes(args.interval, 10_000))) / (10_000 * normal)
        lines.append(f"| {name} | {tensors} | {1e3 * normal:.1f} | {1e3 * probing:.1f} | {initial} | "
                     f"{100 * steady:.2f}% | {100 * with_initial:.2f}% |")
        print(lines[-1], flush=True)
    save_table("adaptive_overhead", "\n".join(lines))


if __name__ == "__main__":
    main()
