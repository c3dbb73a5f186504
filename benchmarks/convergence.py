"""Convergence on real data, offline: final metric, curves and gradient norms per gact level.

    python benchmarks/convergence.py --task mnist1d --steps 2000
    python benchmarks/convergence.py --task charlm --steps 1000 --methods fp32 "L1.2 (2 bit)" "L2.2 (adaptive 2)"
    python benchmarks/convergence.py --task charlm-llama --steps 1000 --clip-grad-norm 1.0   # as the transformers Trainer
    python benchmarks/convergence.py --task charlm-bert --warm-steps 300 --steps 700   # continued from fp32's step 300
    python benchmarks/convergence.py --task charlm-bert --steps 2000 --suffix _steps2000   # longer, in a file of its own
    python benchmarks/convergence.py --task charlm-bert --seed 4 --warm-steps 1800 --steps 200 --eval-every 50 \
        --methods fp32 "fp32, eager" "L1, feature groups"   # the last 200 steps of the 2000-step schedule

Methods can run in separate processes (``--part NAME`` writes ``convergence_<task>.NAME.json``)
and be merged (``--merge``; ``--append`` adds them to the results already there), so that two
cores train two methods at once. Writes
benchmarks/results/convergence_<task>.json and .png (the metric, and each run's gradient
norm against fp32's), and prints a Markdown table: the final metric against fp32, the
largest ratio of a run's gradient norm to fp32's at the same step, the average bits and
the activation bytes it actually reached.
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
from gact_fx.bench.train import METHODS, TrainResult, largest_norm_ratio, train, warm_start
from gact_fx.dynamo_backend import resolve_compiler

RESULTS = pathlib.Path(__file__).resolve().parent / "results"


def plot(results, task, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (axis, norms) = plt.subplots(1, 2, figsize=(12, 4.5))
    for result in results:
        steps, values = zip(*result.curve) if result.curve else ((), ())
        width = 2 if result.method == "fp32" else 1.2
        axis.plot(steps, values, label=result.method, linewidth=width)
        if result.grad_norms:
            norms.plot(range(1, len(result.grad_norms) + 1), result.grad_norms, label=result.method, linewidth=width * 0.6)
    axis.set_xlabel("step")
    axis.set_ylabel(task.metric)
    axis.set_title(f"{task.name}: {task.metric} by gact level (CPU)")
    norms.set_xlabel("step")
    norms.set_ylabel("gradient norm")
    norms.set_yscale("log")
    norms.set_title("gradient norm")
    for a in (axis, norms):
        a.grid(alpha=0.3)
        a.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def max_norm_ratio(result: TrainResult, reference: TrainResult | None) -> float | None:
    """The largest ratio of ``result``'s gradient norm to the reference's at the same step."""
    if reference is None or result is reference:
        return None
    return largest_norm_ratio(result.grad_norms, reference.grad_norms)


def table(results: list[TrainResult], task) -> str:
    reference = next((r for r in results if r.method == "fp32"), None)
    lines = [f"| method | final {task.metric} | vs fp32 | max gradient norm / fp32's | average bits | activations "
             "| train time s |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        if reference is None or r.diverged:
            delta = "diverged" if r.diverged else "-"
        elif task.higher_is_better:
            delta = f"{100 * (r.final - reference.final):+.2f} pp"
        else:
            delta = f"{100 * (r.final - reference.final) / reference.final:+.2f}%"
        ratio = max_norm_ratio(r, reference)
        bits = "-" if r.average_bits is None else f"{r.average_bits:.2f}"
        saved = "-" if r.activation_ratio is None else f"{r.activation_ratio:.1f}x smaller"
        lines.append(f"| {r.method} | {r.final:.4f} | {delta} | {'-' if ratio is None else f'{ratio:.2f}x'} | {bits} | "
                     f"{saved} | {r.seconds:.0f} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=sorted(TASKS), default="mnist1d")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--noise-seed", type=int, metavar="N",
                        help="draw gact's rounding from seed N (data and weights still follow --seed); each method's "
                             "row is named with it, so that it merges beside the run at the default seed")
    parser.add_argument("--part", help="write convergence_<task>.PART.json only (merge the parts later)")
    parser.add_argument("--merge", nargs="+", metavar="PART", help="merge these parts into convergence_<task>.json")
    parser.add_argument("--append", action="store_true", help="with --merge: keep the methods already in "
                        "convergence_<task>.json (a part's method replaces one of the same name)")
    parser.add_argument("--clip-grad-norm", type=float, metavar="NORM",
                        help="clip the gradients' total norm to NORM before each step (results: convergence_<task>_clipNORM, "
                             "0.5 written 0p5)")
    parser.add_argument("--warm-steps", type=int, default=0, metavar="N",
                        help="train fp32 for N steps first, then continue each method from that state for --steps "
                             "(one schedule of N + --steps steps: to fork a 2000-step run at step N, pass --steps "
                             "2000-N; results: convergence_<task>_warmN)")
    parser.add_argument("--suffix", default="", metavar="TEXT",
                        help="appended to the results' name, so that a run unlike the task's others (--steps 2000 "
                             "where the rest ran 1000: --suffix _steps2000) gets a file and an fp32 row of its own")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    task = TASKS[args.task](seed=args.seed)
    clip = f"_clip{args.clip_grad_norm:g}".replace(".", "p") if args.clip_grad_norm else ""  # no dot: parts are suffixes
    warm = f"_warm{args.warm_steps}" if args.warm_steps else ""
    if "." in args.suffix or "/" in args.suffix:
        parser.error(f"--suffix {args.suffix!r}: no dots or slashes (a part's name follows the first dot)")
    stem = RESULTS / (f"convergence_{args.task}{clip}{warm}" + (f"_seed{args.seed}" if args.seed else "") + args.suffix)
    if args.merge:
        parts = [json.loads(stem.with_suffix(f".{name}.json").read_text()) for name in args.merge]
        if args.append:
            kept = json.loads(stem.with_suffix(".json").read_text())
            merged = {r["method"] for part in parts for r in part["results"]}
            parts.insert(0, dict(kept, results=[r for r in kept["results"] if r["method"] not in merged]))
        results = [TrainResult(**r) for part in parts for r in part["results"]]
        meta = dict(parts[0]["meta"], command=" and ".join(part["meta"]["command"] for part in parts))
        return write(results, task, stem, meta)
    RESULTS.mkdir(exist_ok=True)
    meta = metadata("cpu") | {"compiler": f"auto ({resolve_compiler('auto', ())} on the CPU)", "threads": args.threads, "seed": args.seed,
                                **({"clip_grad_norm": args.clip_grad_norm} if args.clip_grad_norm else {}),
                                **({"warm_steps": args.warm_steps} if args.warm_steps else {})}
    start = None
    if args.warm_steps:
        print(f"{task.name}: fp32 for {args.warm_steps} steps (the warm start)", file=sys.stderr, flush=True)
        start = warm_start(task, steps=args.warm_steps, then=args.steps, seed=args.seed, max_grad_norm=args.clip_grad_norm)
    results = []
    for method in args.methods:
        def progress(result):
            step, value = result.curve[-1]
            print(f"  {method:20s} step {step:5d}/{args.warm_steps + args.steps}  {task.metric} {value:.4f}", file=sys.stderr,
                  flush=True)

        print(f"{task.name}: {method}", file=sys.stderr, flush=True)
        torch._dynamo.reset()
        result = train(task, method, METHODS[method], steps=args.steps, eval_every=args.eval_every, seed=args.seed,
                       progress=progress, max_grad_norm=args.clip_grad_norm, warm=start, noise_seed=args.noise_seed)
        if args.noise_seed is not None:
            result.method = f"{method}, rounding seed {args.noise_seed}"
        results.append(result)
        if args.part:  # after each method, so that a run stopped early keeps what it finished
            stem.with_suffix(f".{args.part}.json").write_text(
                json.dumps({"meta": meta, "results": [dataclasses.asdict(r) for r in results]}, indent=1))
    if args.part:
        return None
    return write(results, task, stem, meta)


def write(results: list[TrainResult], task, stem: pathlib.Path, meta: dict) -> None:
    stem.with_suffix(".json").write_text(json.dumps({"meta": meta, "results": [dataclasses.asdict(r) for r in results]}, indent=1))
    plot(results, task, stem.with_suffix(".png"))
    print(table(results, task))


if __name__ == "__main__":
    main()
