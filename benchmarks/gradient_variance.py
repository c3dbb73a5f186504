"""Gradient variance of compressed training: uniform bits against GACT's adaptive bits.

For each model, the relative variance ``E||g - g_exact||^2 / ||g_exact||^2`` over rounding
seeds, at uniform 1/2/4/8 bits and at adaptive averages of 1.5 to 8 bits (allocation
from the sensitivity probe, then frozen). The figure also plots what GACT's variance
model ``sum_l C_l S(b_l)`` predicts for the adaptive allocations from the probe's
sensitivities. CPU, eager path. Writes benchmarks/results/gradient_variance.json and .png
and prints the Markdown table.

    python benchmarks/gradient_variance.py                      # all models
    python benchmarks/gradient_variance.py --models block bert --draws 8
"""

from __future__ import annotations

import argparse
import copy
import pathlib
import sys

import torch

import gact_fx
from gact_fx.allocation import quantization_variance
from gact_fx.bench.methods import PLAIN_FORMAT

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks._results import save_table  # noqa: E402
from tests.helpers import flat_grad, model_case, projection_loss  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
UNIFORM = (8, 4, 2, 1)
ADAPTIVE = (8, 6, 4, 3, 2, 1.5)


def real_task_case(name):
    from gact_fx.bench.tasks import CharLMTask, Mnist1dTask

    task = Mnist1dTask(batch_size=256) if name == "mnist1d" else CharLMTask(batch_size=16)
    torch.manual_seed(0)
    inputs, target = task.batch(0, torch.Generator().manual_seed(0))
    return task.model(), inputs, lambda output: task.loss(output, target)


def case(name):
    if name in ("mnist1d", "charlm"):
        return real_task_case(name)
    model, inputs = model_case(name)
    return model, inputs, projection_loss


def gradients(model, inputs, loss_fn, backend, draws, warmup=0):
    model = copy.deepcopy(model)
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    result = []
    for index in range(warmup + draws):
        model.zero_grad(set_to_none=True)
        torch.manual_seed(0)
        loss_fn(compiled(*inputs)).backward()
        if index >= warmup:
            result.append(flat_grad(model))
    return result


def relative_variance(draws, exact):
    return sum(float(((d - exact) ** 2).sum()) for d in draws) / len(draws) / float((exact**2).sum())


def measure(name, draws):
    model, inputs, loss_fn = case(name)
    torch._dynamo.reset()
    (exact,) = gradients(model, inputs, loss_fn, gact_fx.backend(enabled=False), 1)
    norm = float((exact**2).sum())
    row = {"model": name, "uniform": {}, "adaptive": {}, "predicted_adaptive": {}}
    for bits in UNIFORM:
        torch._dynamo.reset()
        row["uniform"][bits] = relative_variance(gradients(model, inputs, loss_fn, gact_fx.backend(bits=bits, **PLAIN_FORMAT), draws), exact)
    for average in ADAPTIVE:
        torch._dynamo.reset()
        backend = gact_fx.backend(avg_bits=average, probe_tensors=10_000, adapt_interval=10**9, **PLAIN_FORMAT)
        # the first step measures every tensor (and trains exactly); then the allocation is frozen
        row["adaptive"][average] = relative_variance(gradients(model, inputs, loss_fn, backend, draws, warmup=1), exact)
        tensors = backend.controller.tensors()
        row["predicted_adaptive"][average] = sum(t.sensitivity * quantization_variance(t.bits) for t in tensors) / norm
        row["tensors"] = len(tensors)
    return row


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = min(4, len(rows))
    figure, axes = plt.subplots((len(rows) + columns - 1) // columns, columns, figsize=(4 * columns, 3.3 * ((len(rows) + columns - 1) // columns)), squeeze=False)
    for axis, row in zip(axes.flat, rows):
        axis.semilogy(list(row["uniform"]), list(row["uniform"].values()), "o-", label="uniform")
        axis.semilogy(list(row["adaptive"]), list(row["adaptive"].values()), "s-", label="adaptive (GACT)")
        axis.semilogy(list(row["predicted_adaptive"]), list(row["predicted_adaptive"].values()), "k:", label="model prediction")
        axis.set_title(f"{row['model']} ({row['tensors']} tensors)")
        axis.set_xlabel("average bits")
        axis.grid(alpha=0.3)
    axes.flat[0].set_ylabel("relative gradient variance")
    axes.flat[0].legend(fontsize=7)
    for axis in list(axes.flat)[len(rows):]:
        axis.axis("off")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mlp", "block", "conv", "bert", "mnist1d", "charlm"])
    parser.add_argument("--draws", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = []
    for name in args.models:
        print(f"measuring {name} ...", file=sys.stderr, flush=True)
        rows.append(measure(name, args.draws))
    RESULTS.mkdir(exist_ok=True)
    plot(rows, RESULTS / "gradient_variance.png")
    lines = ["| model | tensors | uniform 8 | uniform 4 | uniform 2 | adaptive 4 | adaptive 3 | adaptive 2 | adaptive 2 <= uniform 4 | adaptive 4 <= uniform 8 |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        u, a = r["uniform"], r["adaptive"]
        lines.append(f"| {r['model']} | {r['tensors']} | {u[8]:.2e} | {u[4]:.2e} | {u[2]:.2e} | {a[4]:.2e} | {a[3]:.2e} | {a[2]:.2e} | "
                     f"{'yes' if a[2] <= u[4] else 'no'} | {'yes' if a[4] <= u[8] else 'no'} |")
    print("\n".join(lines))
    save_table("gradient_variance", "\n".join(lines), rows=rows)


if __name__ == "__main__":
    main()
