"""CPU step time and compile time of the gact backend against the same path without it.

One thread, median of several steps after warm-up, ratios against a baseline measured
in the same run. Prints a Markdown table (and writes JSON with --json).

    python benchmarks/cpu_step_time.py                     # all models, both compilers
    python benchmarks/cpu_step_time.py --models block --compilers eager
"""

from __future__ import annotations

import argparse
import copy
import pathlib
import statistics
import sys
import time

import torch

import gact_fx

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from benchmarks._results import save_table  # noqa: E402
from tests.helpers import ConvBlock, MLP, TransformerBlock, projection_loss, tiny_bert  # noqa: E402


def cases():
    torch.manual_seed(0)
    return {
        "mlp": (MLP(width=1024), (torch.randn(256, 64),)),
        "block": (TransformerBlock(dim=128), (torch.randn(16, 64, 128),)),
        "conv": (ConvBlock(channels=32), (torch.randn(32, 3, 32, 32),)),
        "bert": (tiny_bert(), (torch.randint(0, 128, (16, 64)),)),
    }


def measure(model, inputs, backend, steps):
    torch._dynamo.reset()
    model = copy.deepcopy(model)
    compiled = torch.compile(model, backend=backend)
    started = time.perf_counter()
    projection_loss(compiled(*inputs)).backward()
    compile_seconds = time.perf_counter() - started
    for _ in range(3):
        projection_loss(compiled(*inputs)).backward()
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        model.zero_grad(set_to_none=True)
        projection_loss(compiled(*inputs)).backward()
        times.append(time.perf_counter() - started)
    return compile_seconds, statistics.median(times)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mlp", "block", "conv", "bert"])
    parser.add_argument("--compilers", nargs="+", default=["eager", "inductor"])
    parser.add_argument("--bits", nargs="+", type=int, default=[8, 2])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--lowering", default="op", choices=("op", "aten"), help="gact's lowering (aten: Inductor only)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    all_cases = cases()
    for name in args.models:
        model, inputs = all_cases[name]
        for compiler in args.compilers:
            if compiler == "eager" and args.lowering == "aten":
                continue
            base_compile, base_step = measure(model, inputs, gact_fx.backend(enabled=False, compiler=compiler), args.steps)
            rows.append(dict(model=name, compiler=compiler, bits="off", compile_s=base_compile, step_ms=1e3 * base_step, ratio=1.0))
            print(f"{name} {compiler} off: {1e3 * base_step:.1f} ms", file=sys.stderr, flush=True)
            for bits in args.bits:
                backend = gact_fx.backend(bits=bits, compiler=compiler, lowering=args.lowering)
                compile_s, step = measure(model, inputs, backend, args.steps)
                rows.append(dict(model=name, compiler=compiler, bits=bits, compile_s=compile_s, step_ms=1e3 * step, ratio=step / base_step))
                print(f"{name} {compiler} {bits}b: {1e3 * step:.1f} ms", file=sys.stderr, flush=True)
    lines = [f"One thread, median of {args.steps} steps; lowering {args.lowering}.\n",
             "| model | compiler | gact bits | first call (compile) s | step ms | step vs gact off |", "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['compiler']} | {r['bits']} | {r['compile_s']:.1f} | {r['step_ms']:.1f} | {r['ratio']:.2f}x |")
    print("\n".join(lines))
    save_table("cpu_step_time", "\n".join(lines), rows=rows)


if __name__ == "__main__":
    main()
