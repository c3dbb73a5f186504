"""Compile time of the gact backend against plain Inductor on the CPU, cold and warm.

Every measurement runs in a fresh Python process with an Inductor cache directory of its
own, so that nothing carries over from an earlier model or method in memory or on disk:

* *cold*: the first process on an empty cache. Inductor generates and builds every
  kernel, and gact builds its CPU codec library (once per machine in practice);
* *warm*: a second process on the same cache, where kernels and FX graphs come from disk:
  what a user waits from the second run of the same script on.

The time is the first training step, forward and backward, both compiled: what the user
waits before training starts. The second step is timed too: for adaptive levels
(``--levels``) it is a sensitivity probe, as the first one also is, which re-runs the
compiled backward once exact and once per probed tensor; the first step less the second
is then about the compile. The median of the steps after three warm-up ones is reported
beside them, so the rows show that the compiled program is the one the step-time tables
measure. One torch thread.

    python benchmarks/compile_time.py
    python benchmarks/compile_time.py --models char-gpt --bits 2 8 --repeats 3
    python benchmarks/compile_time.py --models fashion-cnn char-gpt bert llama-base   # + a transformers Llama
    python benchmarks/compile_time.py --models bert llama-base --levels L2.2          # + adaptive bits
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks._results import save_table  # noqa: E402

MODELS = ("fashion-cnn", "char-gpt", "bert")
BASE_WIDTH = ("bert-base", "gpt2-base", "llama-base")  # transformers at base width, 4 layers, batch 4 x 256
OFF = "off"  # the --method of plain Inductor (gact disabled)


def backend_of(method: str):
    """gact's backend for a method: ``off``, a uniform width (``"2"``) or an adaptive level (``"L2.2"``)."""
    import gact_fx
    from gact_fx.bench.methods import PLAIN_FORMAT

    if method == OFF:
        return gact_fx.backend(enabled=False, compiler="inductor")
    if method.isdigit():
        return gact_fx.backend(bits=int(method), compiler="inductor", **PLAIN_FORMAT)
    return gact_fx.backend(level=method, compiler="inductor", **PLAIN_FORMAT)


def time_steps(model, inputs, backend, steps: int) -> tuple[float, float, float]:
    """(first step s, second step s, median s of ``steps`` steps after two more warm-up ones)."""
    import torch

    from benchmarks.cpu_step_time import projection_loss

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend)

    def step() -> float:
        started = time.perf_counter()
        model.zero_grad(set_to_none=True)
        projection_loss(compiled(*inputs)).backward()
        return time.perf_counter() - started

    first, second = step(), step()
    for _ in range(2):
        step()
    return first, second, statistics.median(step() for _ in range(steps))


def child(model_name: str, method: str, steps: int) -> dict:
    """In the measuring process: build, compile and time one model under one method."""
    import torch

    from benchmarks.cpu_step_time import cases

    torch.set_num_threads(1)
    if model_name in BASE_WIDTH:
        from gact_fx.bench.zoo import TEXT_VOCAB, text_model

        torch.manual_seed(0)
        model = text_model(model_name.split("-")[0], 4, hidden=768, heads=12, sequence=256)
        inputs = (torch.randint(0, TEXT_VOCAB, (4, 256)),)
    else:
        model, inputs = cases()[model_name]
    first_s, second_s, step_s = time_steps(model, inputs, backend_of(method), steps)
    return dict(first_s=first_s, second_s=second_s, step_ms=1e3 * step_s)


def measure(model_name: str, method: str, cache: pathlib.Path, steps: int) -> dict:
    """Run ``child`` in a new process on the Inductor cache ``cache``."""
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache), PYTHONPATH=str(ROOT))
    command = [sys.executable, __file__, "--child", model_name, method, "--steps", str(steps)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=ROOT)
    if done.returncode:
        raise RuntimeError(f"{model_name} / {method} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def label(method: str) -> str:
    if method == OFF:
        return "plain Inductor"
    return f"gact {method} bit" if method.isdigit() else f"gact {method} (adaptive)"


def markdown(rows: list[dict], args) -> str:
    lines = [f"One thread; a fresh process per cell, median of {args.repeats} cold and {args.repeats} warm runs; "
             f"second step: its median over all runs (an adaptive level's is a sensitivity probe, as is its first "
             f"step); step ms: median of the {args.steps} steps after the first and three warm-up steps.\n",
             "| model | method | cold first step s | vs plain Inductor | warm first step s | vs plain Inductor | "
             "second step s | step ms |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    base = {r["model"]: r for r in rows if r["method"] == OFF}
    for r in rows:
        b = base[r["model"]]
        second = f"{r['second_s']:.2f}" if "second_s" in r else "-"
        lines.append(f"| {r['model']} | {label(r['method'])} | {r['cold_s']:.1f} | {r['cold_s'] / b['cold_s']:.2f}x | "
                     f"{r['warm_s']:.1f} | {r['warm_s'] / b['warm_s']:.2f}x | {second} | {r['step_ms']:.1f} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS + BASE_WIDTH))
    parser.add_argument("--bits", nargs="+", type=int, default=[2])
    parser.add_argument("--levels", nargs="+", default=[], help="adaptive levels too (L2, L2.2, ...)")
    parser.add_argument("--repeats", type=int, default=2, help="cold (and warm) runs per cell")
    parser.add_argument("--steps", type=int, default=5, help="steps timed after the first")
    parser.add_argument("--name", default="compile_time", help="results file: benchmarks/results/NAME.json")
    parser.add_argument("--child", nargs=2, metavar=("MODEL", "METHOD"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(*args.child, args.steps)))
        return
    import torch

    torch.set_num_threads(1)  # as in the measuring processes, which the results' metadata describes
    methods = [OFF] + [str(bits) for bits in args.bits] + list(args.levels)
    rows = []
    with tempfile.TemporaryDirectory(prefix="gact-compile-time-") as scratch:
        for model_name in args.models:
            for method in methods:
                cold, warm, seconds, steps = [], [], [], []
                for repeat in range(args.repeats):
                    cache = pathlib.Path(scratch) / f"{model_name}-{method}-{repeat}"
                    first = measure(model_name, method, cache, args.steps)
                    second = measure(model_name, method, cache, args.steps)
                    cold.append(first["first_s"])
                    warm.append(second["first_s"])
                    seconds += [first["second_s"], second["second_s"]]
                    steps += [first["step_ms"], second["step_ms"]]
                    print(f"{model_name} {label(method)} run {repeat + 1}/{args.repeats}: cold {first['first_s']:.1f} s, "
                          f"warm {second['first_s']:.1f} s", file=sys.stderr, flush=True)
                rows.append(dict(model=model_name, method=method, cold_s=statistics.median(cold),
                                 warm_s=statistics.median(warm), second_s=statistics.median(seconds),
                                 step_ms=statistics.median(steps), cold_runs=cold,
                                 warm_runs=warm))
    table = markdown(rows, args)
    print(table)
    save_table(args.name, table, rows=rows)


if __name__ == "__main__":
    main()
