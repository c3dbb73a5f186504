"""Replay the first steps of a convergence run with the exact gradient beside the compressed one.

Each step's compressed gradient against the exact one at the same weights and batch
(``gact_fx.bench.replay``): whether a gradient-norm spike of the run is the model's own
or the compression's. The run is ``benchmarks/convergence.py``'s with the same task,
method, seed and ``--noise-seed``, over a schedule ``--schedule-steps`` long. Adds one row
per run to benchmarks/results/replay_gradient_error.json (a run of the same task, method,
seeds and steps is replaced). CPU, 1 thread.

    python benchmarks/replay_gradient_error.py --task charlm-llama --steps 80 \\
        --method "3 bit, feature groups, dithered, projections rebuilt"
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import statistics
import sys

import torch

from gact_fx.bench.metadata import metadata
from gact_fx.bench.replay import replay
from gact_fx.bench.tasks import TASKS
from gact_fx.bench.train import METHODS

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from benchmarks._results import RESULTS  # noqa: E402

NAME = "replay_gradient_error"
KEY = ("task", "method", "seed", "noise_seed", "steps")


def summary(run: dict) -> dict:
    """The run's row: the median and largest error, and the steps of the largest norms."""
    rows = run["rows"]
    spike = max(rows, key=lambda r: r["norm"])
    exact_spike = max(rows, key=lambda r: r["exact_norm"])
    worst = max(rows, key=lambda r: r["relative_error"])
    return {
        "median_error": statistics.median(r["relative_error"] for r in rows),
        "worst": worst,
        "spike": spike,
        "spike_over_median": spike["norm"] / statistics.median(r["norm"] for r in rows),
        "exact_spike": exact_spike,
    }


def markdown(runs: list[dict]) -> str:
    lines = ["| task | seed | method | steps | median error | largest error (step) | largest norm, compressed (step) "
             "| exact norm at that step | its error | largest exact norm (step) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for run in runs:
        s = summary(run)
        seed = f"{run['seed']}" + (f", rounding {run['noise_seed']}" if run["noise_seed"] is not None else "")
        lines.append(
            f"| {run['task']} | {seed} | {run['method']} | {run['steps']} | {s['median_error']:.3f} | "
            f"{s['worst']['relative_error']:.3f} ({s['worst']['step']}) | {s['spike']['norm']:.2f} "
            f"({s['spike']['step']}; {s['spike_over_median']:.1f}x the median) | {s['spike']['exact_norm']:.2f} | "
            f"{s['spike']['relative_error']:.3f} | {s['exact_spike']['exact_norm']:.2f} ({s['exact_spike']['step']}) |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=sorted(TASKS), default="charlm-llama")
    parser.add_argument("--method", choices=[m for m in METHODS if m != "fp32"], required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--noise-seed", type=int, metavar="N", help="gact's rounding seed (default: --seed)")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--schedule-steps", type=int, default=1000, help="the convergence run's length")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    task = TASKS[args.task](seed=args.seed)

    def progress(row):
        print(f"  step {row.step:4d}  loss {row.loss:.3f}  norm {row.norm:8.3f}  exact {row.exact_norm:8.3f}  "
              f"error {row.relative_error:.3f}", file=sys.stderr, flush=True)

    rows = replay(task, METHODS[args.method], steps=args.steps, seed=args.seed, noise_seed=args.noise_seed,
                  schedule_steps=args.schedule_steps, progress=progress)
    run = {"task": args.task, "method": args.method, "seed": args.seed, "noise_seed": args.noise_seed,
           "steps": args.steps, "schedule_steps": args.schedule_steps, "rows": [dataclasses.asdict(r) for r in rows]}
    path = RESULTS / f"{NAME}.json"
    runs = json.loads(path.read_text())["runs"] if path.exists() else []
    runs = [r for r in runs if tuple(r[k] for k in KEY) != tuple(run[k] for k in KEY)] + [run]
    table = markdown(runs)
    RESULTS.mkdir(exist_ok=True)
    path.write_text(json.dumps({"meta": metadata("cpu"), "markdown": table, "runs": runs}, indent=1) + "\n")
    print(table)


if __name__ == "__main__":
    main()
