"""One draw's gradient error, and the bias, on a transformer task after a short fp32 warm-up.

Trains a convergence task's model (``charlm``: the GPT, ``charlm-llama``: the Llama)
in fp32 for ``--warmup`` steps, then takes one batch's exact gradient and ``--draws``
compressed ones per configuration: the mean relative error of one draw, and the error
of their mean against the averaging floor (one draw's error / sqrt(draws); about 1 when
the gradient is unbiased), and one draw's error per parameter tensor (the root mean
square over tensors of each one's relative error: the noise an Adam-type optimiser's
update carries, as it divides each gradient by its own scale). Against the minibatch's
own noise (the variance of one batch's exact gradient about the mean over
``--batches`` batches, at the same weights): the variance one draw adds, as a share of
it, over the whole gradient and at the parameter tensor where the share is largest, and
the share of gradient elements where it exceeds the minibatch's own. Adaptive levels
first probe every tensor (two calls, not counted). CPU, eager path, 1 thread. Prints a Markdown table (and writes it to benchmarks/results/NAME.json with
``--name``).

    python benchmarks/warm_gradient_error.py --task charlm-llama
    python benchmarks/warm_gradient_error.py --task charlm --configs "uniform 2" "L2.2"
    python benchmarks/warm_gradient_error.py --configs "uniform 2" --group-sizes 256 64
    python benchmarks/warm_gradient_error.py --configs "uniform 2" --rotations 0 32 128

``--rotations`` runs each configuration also with ``rotation`` set to each block (0: none);
``--statistics exact rounded`` with norms' row statistics kept exact and rounded.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import torch

import gact_fx
from gact_fx.bench.methods import PLAIN_FORMAT
from gact_fx.bench.tasks import TASKS
from gact_fx.bench.train import ADAPTIVE_BYTES, ADAPTIVE_ROTATED

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from benchmarks._results import save_table  # noqa: E402
from tests.helpers import flat_grad, loss_draws, relative_error  # noqa: E402

_PROBE_ALL = {"probe_tensors": 10_000, "adapt_interval": 10**6}  # every tensor measured once, then frozen
# "uniform N" is contiguous groups, as the tables before feature groups became the default
CONFIGS = {
    "uniform 4": {"bits": 4, "feature_groups": False},
    "uniform 3": {"bits": 3, "feature_groups": False},
    "uniform 3, attention floor 4": {"bits": 3, "nonlinear_bits": 4, "feature_groups": False},
    "uniform 3, feature groups": {"bits": 3, "feature_groups": True},
    "uniform 2, attention floor 4": {"bits": 2, "nonlinear_bits": 4, "feature_groups": False},
    "uniform 4, feature groups": {"bits": 4, "feature_groups": True},
    "uniform 4, feature groups, attention floor 4": {"bits": 4, "nonlinear_bits": 4, "feature_groups": True},
    # what the backward reads through an exponential (attention's query and key) kept exact
    "uniform 4, feature groups, attention exact": {"bits": 4, "nonlinear_bits": 32, "feature_groups": True},
    "uniform 3, feature groups, attention floor 4": {"bits": 3, "nonlinear_bits": 4, "feature_groups": True},
    "uniform 4, feature groups, dithered": {"bits": 4, "feature_groups": True, "rounding": "dithered"},
    "uniform 3, feature groups, dithered": {"bits": 3, "feature_groups": True, "rounding": "dithered"},
    "uniform 3, feature groups, dithered, projections rebuilt": {"bits": 3, "feature_groups": True,
                                                                 "rounding": "dithered", "recompute_projections": True},
    "uniform 4, feature groups, projections rebuilt": {"bits": 4, "feature_groups": True,
                                                       "recompute_projections": True},
    "uniform 2, feature groups, dithered": {"bits": 2, "feature_groups": True, "rounding": "dithered"},
    "uniform 4, feature groups, attention floor 4, dithered": {"bits": 4, "nonlinear_bits": 4, "feature_groups": True,
                                                               "rounding": "dithered"},
    "uniform 3, feature groups, attention floor 4, dithered": {"bits": 3, "nonlinear_bits": 4, "feature_groups": True,
                                                               "rounding": "dithered"},
    "uniform 4, feature groups, attention floor 4, dithered, debiased": {
        "bits": 4, "nonlinear_bits": 4, "feature_groups": True, "rounding": "dithered", "debias_attention": True},
    "uniform 3, feature groups, attention floor 4, dithered, debiased": {
        "bits": 3, "nonlinear_bits": 4, "feature_groups": True, "rounding": "dithered", "debias_attention": True},
    "uniform 2": {"bits": 2, "feature_groups": False},
    "uniform 2, feature groups": {"bits": 2, "feature_groups": True},
    "L2.1": {"level": "L2.1", **_PROBE_ALL},
    "L2.1, feature groups, relative metric": {"level": "L2.1", "feature_groups": True, "gradient_metric": "relative",
                                              **_PROBE_ALL},
    "L2.1, feature groups": {"level": "L2.1", "feature_groups": True, **_PROBE_ALL},
    "adaptive 2.5, feature groups": {"avg_bits": 2.5, "feature_groups": True, **_PROBE_ALL},
    "adaptive 2.5, feature groups, relative metric": {"avg_bits": 2.5, "feature_groups": True,
                                                      "gradient_metric": "relative", **_PROBE_ALL},
    "adaptive 2.75, feature groups, relative metric": {"avg_bits": 2.75, "feature_groups": True,
                                                       "gradient_metric": "relative", **_PROBE_ALL},
    "adaptive 3.25, feature groups, relative metric, attention floor 4": {
        "avg_bits": 3.25, "feature_groups": True, "gradient_metric": "relative", "nonlinear_bits": 4, **_PROBE_ALL},
    "adaptive 3.375, feature groups, relative metric, attention floor 4": {
        "avg_bits": 3.375, "feature_groups": True, "gradient_metric": "relative", "nonlinear_bits": 4, **_PROBE_ALL},
    "adaptive 3.5, feature groups, relative metric, attention floor 4": {
        "avg_bits": 3.5, "feature_groups": True, "gradient_metric": "relative", "nonlinear_bits": 4, **_PROBE_ALL},
    "adaptive 3.75, feature groups, relative metric, attention floor 4": {
        "avg_bits": 3.75, "feature_groups": True, "gradient_metric": "relative", "nonlinear_bits": 4, **_PROBE_ALL},
    "adaptive 3.75, feature groups, attention floor 4": {
        "avg_bits": 3.75, "feature_groups": True, "nonlinear_bits": 4, **_PROBE_ALL},
    "L2.2": {"level": "L2.2", **_PROBE_ALL},
    "L2.2, feature groups": {"level": "L2.2", "feature_groups": True, **_PROBE_ALL},
    "L2.2, no rebuilt tensors": {"level": "L2.2", "recompute_affine": False, **_PROBE_ALL},
    "L2.2, relative metric": {"level": "L2.2", "gradient_metric": "relative", **_PROBE_ALL},
    "L2.2, feature groups, relative metric": {"level": "L2.2", "feature_groups": True, "gradient_metric": "relative",
                                              **_PROBE_ALL},
    "L2.2, feature groups, dithered": {"level": "L2.2", "feature_groups": True, "rounding": "dithered", **_PROBE_ALL},
    "L2.2, feature groups, relative metric, dithered": {"level": "L2.2", "feature_groups": True,
                                                        "gradient_metric": "relative", "rounding": "dithered",
                                                        **_PROBE_ALL},
    "adaptive 2.5, feature groups, relative metric, dithered": {"avg_bits": 2.5, "feature_groups": True,
                                                                "gradient_metric": "relative", "rounding": "dithered",
                                                                **_PROBE_ALL},
    "uniform 3, feature groups, attention floor 4, dithered, q/k rotation 32": {
        "bits": 3, "nonlinear_bits": 4, "nonlinear_rotation": 32, "feature_groups": True, "rounding": "dithered"},
    "uniform 3, feature groups, attention floor 4, dithered, debiased, q/k rotation 32": {
        "bits": 3, "nonlinear_bits": 4, "nonlinear_rotation": 32, "feature_groups": True, "rounding": "dithered",
        "debias_attention": True},
    "adaptive 2.5, feature groups, relative metric, attention floor 4, dithered, debiased": {
        "avg_bits": 2.5, "feature_groups": True, "gradient_metric": "relative", "nonlinear_bits": 4,
        "rounding": "dithered", "debias_attention": True, **_PROBE_ALL},
    **{name: {**options, **_PROBE_ALL} for name, options in {**ADAPTIVE_ROTATED, **ADAPTIVE_BYTES}.items()},
}


def per_parameter_error(draw: torch.Tensor, exact: torch.Tensor, sizes: list[int]) -> float:
    """The root mean square over parameter tensors of each one's relative error."""
    errors = [relative_error(d, e) for d, e in zip(draw.split(sizes), exact.split(sizes)) if e.norm() > 0]
    return (sum(e * e for e in errors) / len(errors)) ** 0.5


def warm_model(task, steps: int):
    """The model after ``steps`` fp32 steps, the batch it is measured on, and the data order
    that continues after it."""
    torch.manual_seed(0)
    model = task.model()
    optimizer = task.optimizer(model)
    generator = torch.Generator().manual_seed(0)
    for step in range(steps):
        (tokens,), targets = task.batch(step, generator)
        optimizer.zero_grad()
        task.loss(model(tokens), targets).backward()
        optimizer.step()
    return model, task.batch(steps, generator), generator


def warm_task(name: str, steps: int):
    """One thread, the task ``name`` and ``warm_model`` of it, with a progress line."""
    torch.set_num_threads(1)
    task = TASKS[name]()
    print(f"{name}: {steps} fp32 steps ...", file=sys.stderr, flush=True)
    return (task, *warm_model(task, steps))


def batch_gradient(model, task, batch) -> torch.Tensor:
    """The exact (fp32, uncompiled) flat gradient of one batch's loss."""
    (tokens,), targets = batch
    model.zero_grad(set_to_none=True)
    task.loss(model(tokens), targets).backward()
    return flat_grad(model)


def minibatch_variance(model, task, generator, count: int) -> torch.Tensor:
    """Each gradient element's variance over ``count`` further batches (exact, fp32)."""
    grads = torch.stack([batch_gradient(model, task, task.batch(step, generator)) for step in range(count)])
    return ((grads - grads.mean(0)) ** 2).sum(0) / (count - 1)


def added_variance(grads: list[torch.Tensor], exact: torch.Tensor) -> torch.Tensor:
    """Each gradient element's variance one draw adds about the exact gradient."""
    return ((torch.stack(grads) - exact) ** 2).mean(0)


def variance_shares(added: torch.Tensor, noise: torch.Tensor, sizes: dict[str, int]):
    """The variance one draw adds (``added_variance``), as a share of the minibatch's: over
    the whole gradient, and (share, name) of the parameter tensor where it is largest."""
    pieces = zip(sizes, added.split(list(sizes.values())), noise.split(list(sizes.values())))
    largest = max((float(a.sum() / n.sum()), name) for name, a, n in pieces if n.sum() > 0)
    return float(added.sum() / noise.sum()), largest


def elements_above(added: torch.Tensor, noise: torch.Tensor) -> float:
    """The share of gradient elements whose added variance exceeds the minibatch's own: where
    Adam, which divides each element's step by its own scale, sees mostly rounding noise."""
    measured = noise > 0
    return float((added[measured] > noise[measured]).float().mean())


def draws(model, batch, loss, options: dict, count: int):
    (tokens,), targets = batch
    backend = gact_fx.backend(compiler="eager", **{**PLAIN_FORMAT, **options})
    skip = 2 if "level" in options else 0
    grads = loss_draws(model, (tokens,), lambda output: loss(output, targets), backend, count, warmup=skip)
    return grads, backend.report()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=["charlm", "charlm-llama", "charlm-bert", "digits-vit"], default="charlm")
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--draws", type=int, default=6)
    parser.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    parser.add_argument("--group-sizes", nargs="+", type=int, default=[256],
                        help="each configuration at each of these group sizes (bytes held include the metadata)")
    parser.add_argument("--rotations", nargs="+", type=int, default=[0],
                        help="each configuration at each of these rotation blocks (0: none)")
    parser.add_argument("--statistics", nargs="+", choices=["exact", "rounded"], default=["exact"],
                        help="each configuration with norms' row statistics kept exact, or rounded like the rest "
                             "(exact_statistics)")
    parser.add_argument("--batches", type=int, default=16,
                        help="the minibatch noise is the gradient's variance over this many batches")
    parser.add_argument("--name", help="also write the table to benchmarks/results/NAME.json (for BENCHMARKS.md)")
    args = parser.parse_args(argv)
    task, model, batch, generator = warm_task(args.task, args.warmup)
    noise = minibatch_variance(model, task, generator, args.batches)
    exact = batch_gradient(model, task, batch)
    sizes = {name: p.numel() for name, p in model.named_parameters() if p.grad is not None}
    lines = ["| configuration | one draw's error | mean's error / averaging floor | one draw's error per parameter "
             "tensor | variance added / minibatch's | largest over tensors | elements above the minibatch's | "
             "activations vs fp32 |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    print("\n".join(lines), flush=True)
    runs = [(config, size, block, statistics) for config in args.configs for size in args.group_sizes
            for block in args.rotations for statistics in args.statistics]
    for config, group_size, block, statistics in runs:
        name = config + ("" if len(args.group_sizes) == 1 else f", groups of {group_size}")
        name += f", rotation {block}" if block else ""
        name += "" if args.statistics == ["exact"] else f", statistics {statistics}"
        print(f"  {name} ...", file=sys.stderr, flush=True)
        options = CONFIGS[config] | {"group_size": group_size, "rotation": block,
                                     "exact_statistics": statistics == "exact"}
        grads, report = draws(model, batch, task.loss, options, args.draws)
        single = sum(relative_error(g, exact) for g in grads) / len(grads)
        floor = single / len(grads) ** 0.5
        per_tensor = sum(per_parameter_error(g, exact, list(sizes.values())) for g in grads) / len(grads)
        added = added_variance(grads, exact)
        share, (largest, where) = variance_shares(added, noise, sizes)
        ratio = report.activation_bytes_before / max(1, report.activation_bytes_after)
        lines.append(f"| {name} | {single:.3f} | {relative_error(torch.stack(grads).mean(0), exact) / floor:.2f} | "
                     f"{per_tensor:.3f} | {share:.3f} | {largest:.3f} (`{where}`) | "
                     f"{elements_above(added, noise):.1%} | {ratio:.1f}x smaller |")
        print(lines[-1], flush=True)
    if args.name:
        print(f"wrote {save_table(args.name, chr(10).join(lines))}", file=sys.stderr)


if __name__ == "__main__":
    main()
