"""One draw's gradient error with groups along features against contiguous groups, at init.

For the models whose innermost dimension is not always a feature: MNIST-1D's 1-D CNN,
a small channels-first 2-D CNN (convolution, batch norm, ReLU), the digits MLP, and the
ViT on the digits. One batch, ``--draws`` compressed gradients per width, each against
the exact gradient; the mean relative error of one draw. CPU, eager path, 1 thread.

    python benchmarks/feature_groups_error.py --name feature_groups_error
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import gact_fx
from gact_fx.bench.methods import PLAIN_FORMAT
from gact_fx.bench.tasks import TASKS

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from benchmarks._results import save_table  # noqa: E402
from tests.helpers import flat_grad, loss_draws, relative_error  # noqa: E402


def conv2d_case():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
        nn.Conv2d(64, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))
    x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    return model, (x,), lambda out: F.cross_entropy(out, y)


def task_case(name: str):
    task = TASKS[name]()
    torch.manual_seed(0)
    model = task.model()
    (x,), y = task.batch(0, torch.Generator().manual_seed(0))
    return model, (x,), lambda out: task.loss(out, y)


CASES = {"MNIST-1D CNN": lambda: task_case("mnist1d"), "2-D CNN, channels first": conv2d_case,
         "digits MLP": lambda: task_case("digits"), "ViT on the digits": lambda: task_case("digits-vit")}


def one_draw_error(model, inputs, loss, exact, draws: int, **options) -> float:
    grads = loss_draws(model, inputs, loss, gact_fx.backend(compiler="eager", **{**PLAIN_FORMAT, **options}), draws)
    return sum(relative_error(g, exact) for g in grads) / len(grads)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=4)
    parser.add_argument("--name", help="also write the table to benchmarks/results/NAME.json (for BENCHMARKS.md)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    lines = ["| model | bits | contiguous groups | feature groups | feature against contiguous |",
             "| --- | --- | --- | --- | --- |"]
    print("\n".join(lines), flush=True)
    for name, case in CASES.items():
        model, inputs, loss = case()
        model.zero_grad(set_to_none=True)
        loss(model(*inputs)).backward()
        exact = flat_grad(model)
        for bits in (4, 3, 2):
            plain = one_draw_error(model, inputs, loss, exact, args.draws, bits=bits, feature_groups=False)
            grouped = one_draw_error(model, inputs, loss, exact, args.draws, bits=bits, feature_groups=True)
            lines.append(f"| {name} | {bits} | {plain:.3f} | {grouped:.3f} | {grouped / plain:.2f}x |")
            print(lines[-1], flush=True)
    if args.name:
        print(f"wrote {save_table(args.name, chr(10).join(lines))}", file=sys.stderr)


if __name__ == "__main__":
    main()
