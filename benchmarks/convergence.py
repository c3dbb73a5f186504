"""Convergence on real data, offline: final metric and curves per gact level.

    python benchmarks/convergence.py --task mnist1d --steps 2000
    python benchmarks/convergence.py --task charlm --steps 1000 --methods fp32 "L1.2 (2 bit)" "L2.2 (adaptive 2)"

Writes benchmarks/results/convergence_<task>.json and .png, and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys

import torch

from gact_fx.bench.metadata import metadata
from gact_fx.bench.tasks import TASKS
from gact_fx.bench.train import METHODS, train

RESULTS = pathlib.Path(__file__).resolve().parent / "results"


def plot(results, task, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4.5))
    for result in results:
        steps, values = zip(*result.curve) if result.curve else ((), ())
        axis.plot(steps, values, label=result.method, linewidth=2 if result.method == "fp32" else 1.2)
    axis.set_xlabel("step")
    axis.set_ylabel(task.metric)
    axis.set_title(f"{task.name}: {task.metric} by gact level (CPU)")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=sorted(TASKS), default="mnist1d")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    task = TASKS[args.task](seed=args.seed)
    results = []
    for method in args.methods:
        def progress(result):
            step, value = result.curve[-1]
            print(f"  {method:20s} step {step:5d}/{args.steps}  {task.metric} {value:.4f}", file=sys.stderr, flush=True)

        print(f"{task.name}: {method}", file=sys.stderr, flush=True)
        torch._dynamo.reset()
        results.append(train(task, method, METHODS[method], steps=args.steps, eval_every=args.eval_every, seed=args.seed, progress=progress))
    RESULTS.mkdir(exist_ok=True)
    stem = RESULTS / f"convergence_{args.task}"
    meta = metadata("cpu") | {"compiler": "auto (eager on the CPU)"}
    stem.with_suffix(".json").write_text(json.dumps({"meta": meta, "results": [dataclasses.asdict(r) for r in results]}, indent=1))
    plot(results, task, stem.with_suffix(".png"))
    reference = next((r for r in results if r.method == "fp32"), None)
    print(f"| method | final {task.metric} | vs fp32 | average bits | train time s |")
    print("| --- | --- | --- | --- | --- |")
    for r in results:
        if reference is None or r.diverged:
            delta = "diverged" if r.diverged else "-"
        elif task.higher_is_better:
            delta = f"{100 * (r.final - reference.final):+.2f} pp"
        else:
            delta = f"{100 * (r.final - reference.final) / reference.final:+.2f}%"
        bits = "-" if r.average_bits is None else f"{r.average_bits:.2f}"
        print(f"| {r.method} | {r.final:.4f} | {delta} | {bits} | {r.seconds:.0f} |")


if __name__ == "__main__":
    main()
