"""Candidate 2-bit formats against today's, by the rounding variance they add to real activations.

A static model of the format, not a gradient measurement: each float activation the
eager backward of a warm model saves (after ``--warmup`` fp32 steps; parameters and
tensors under 4096 elements left out) is cut into feature groups of 256 tokens, as gact
stores it at the adaptive levels, and each format's expected squared rounding error is
computed in closed form, over the tensor's own variance.

Tensors holding infinities (an attention mask's bias) are left out. The candidates keep
the estimate unbiased:

* uniform levels over each group's range, stochastic or dithered rounding (today's);
* four levels placed unevenly in the range (0, a, 1 - a, 1), stochastic rounding between
  neighbours (dither needs even steps), ``a`` the best for these tensors;
* widths of 1 to 4 bits chosen per group from its range (same average bits, dithered):
  what bits chosen finer than per tensor could buy within one tensor;
* uniform dithered levels after a random-sign Hadamard rotation along the features
  (``runtime.rotation``, blocks of 32 and 128), on every tensor, and on each tensor where it
  lowers that tensor's error (what the adaptive solver could choose per tensor);
* for the derivative a GELU or SiLU backward reads (``passes.derivatives`` saves it at
  low bits): levels at its plateaus (the group's min, 0, 1, max), and levels at each
  group's terciles (two more words a group).

    python benchmarks/format_variance.py --task charlm-llama --name format_variance_llama
"""

from __future__ import annotations

import argparse
import math
import sys

import torch

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent.parent))
from benchmarks._results import save_table  # noqa: E402
from benchmarks.warm_gradient_error import warm_task  # noqa: E402
from gact_fx.runtime.rotation import rotate  # noqa: E402

GROUP = 256
SPREAD = (0.3, 0.35, 0.375, 0.4, 0.45)  # the inner levels' place, as a share of the range
ROTATIONS = (32, 128)


def feature_groups(x: torch.Tensor) -> torch.Tensor:
    """[groups, GROUP]: each feature's values over blocks of GROUP tokens (whole blocks only)."""
    rows = x.reshape(-1, x.shape[-1]).double()
    tokens = rows.shape[0] // GROUP * GROUP
    if tokens == 0:
        return rows.new_zeros(0, GROUP)
    return rows[:tokens].reshape(tokens // GROUP, GROUP, -1).transpose(1, 2).reshape(-1, GROUP)


def dithered_error(groups: torch.Tensor, bits: int = 2) -> torch.Tensor:
    """Expected squared error of dithered rounding to ``2**bits`` uniform levels over each
    group's range: a step's square over 12 an element."""
    steps = (groups.amax(1) - groups.amin(1)) / (2 ** bits - 1)
    return (steps ** 2).sum() * groups.shape[1] / 12


def rotated_error(x: torch.Tensor, block: int) -> torch.Tensor | None:
    """``dithered_error`` of ``x`` rotated along its features by ``block`` (the error rotates back
    unchanged: the rotation is orthogonal); None where the features do not fill whole blocks."""
    if x.shape[-1] % block:
        return None
    return dithered_error(feature_groups(rotate(x.float(), block)))


def stochastic_variance(groups: torch.Tensor, levels: torch.Tensor) -> torch.Tensor:
    """Expected squared error of rounding each value to one of its two neighbouring
    ``levels`` ([groups, k], sorted) with the probabilities that keep it unbiased."""
    at = torch.searchsorted(levels.contiguous(), groups.contiguous(), right=True).clamp(1, levels.shape[-1] - 1)
    low, high = levels.gather(-1, at - 1), levels.gather(-1, at)
    return ((groups - low) * (high - groups)).clamp(min=0).sum()


def levels_at(low: torch.Tensor, high: torch.Tensor, shares) -> torch.Tensor:
    """Each group's levels at ``shares`` (from 0 to 1) of its range from ``low`` to ``high``."""
    shares = torch.as_tensor(shares, dtype=torch.float64)
    return low + (high - low) * shares


def per_group_widths(range_squared: torch.Tensor, average: float, widths=(1, 2, 3, 4)) -> torch.Tensor:
    """Dithered error (``step**2 / 12`` a value) with each group's width chosen from its
    range under an average of ``average`` bits (a Lagrange multiplier, bisected)."""
    bits = torch.tensor(widths, dtype=torch.float64)
    steps = (2 ** bits - 1) ** 2
    low, high = 1e-30, 1e30
    for _ in range(200):
        price = math.sqrt(low * high)
        chosen = (range_squared[:, None] / steps + price * bits).argmin(1)
        low, high = (price, high) if bits[chosen].mean() > average else (low, price)
    chosen = (range_squared[:, None] / steps + high * bits).argmin(1)
    return (range_squared / steps[chosen]).sum() * GROUP / 12


def derivative(x: torch.Tensor, act: str) -> torch.Tensor:
    if act == "silu":
        s = torch.sigmoid(x)
        return s * (1 + x * (1 - s))
    return 0.5 * (1 + torch.erf(x / math.sqrt(2))) + x * torch.exp(-x * x / 2) / math.sqrt(2 * math.pi)


def capture(model, batch, loss):
    """The float activations the eager backward saves, and the inputs of the MLP's activation."""
    parameters = {p.data_ptr() for p in model.parameters()}
    saved, activation_inputs = [], []

    def pack(t):
        if (t.is_floating_point() and t.numel() >= 4096 and t.dim() >= 2 and t.data_ptr() not in parameters
                and bool(t.isfinite().all())):  # a mask's -inf takes gact's general path, not this format
            saved.append(t.detach().clone())
        return t

    def grab(module, inputs):
        activation_inputs.append(inputs[0].detach())

    hooks = [m.register_forward_pre_hook(grab) for name, m in model.named_modules()
             if type(m).__name__.endswith("Activation")]
    if not hooks:  # the char GPT calls F.gelu on fc1's output
        hooks = [m.register_forward_hook(lambda m, i, out: activation_inputs.append(out.detach()))
                 for name, m in model.named_modules() if name.endswith("fc1")]
    (tokens,), targets = batch
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss(model(tokens), targets).backward()
    for hook in hooks:
        hook.remove()
    return saved, activation_inputs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=["charlm", "charlm-llama", "charlm-bert"], default="charlm")
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--name", help="also write the table to benchmarks/results/NAME.json (for BENCHMARKS.md)")
    args = parser.parse_args(argv)
    task, model, batch, _ = warm_task(args.task, args.warmup)
    saved, activation_inputs = capture(model, batch, task.loss)
    act = "silu" if args.task == "charlm-llama" else "gelu"
    print(f"{len(saved)} saved activations, {len(activation_inputs)} {act} inputs", file=sys.stderr, flush=True)

    def errors(tensors, derivative_levels: bool = False):
        """Each format's error summed over the tensors, over the tensors' summed variance
        (``derivative_levels``: also the levels a derivative's values suggest)."""
        totals, signal = {}, 0.0
        for x in tensors:
            groups = feature_groups(x)
            if groups.numel() == 0:
                continue
            low, high = groups.amin(1, keepdim=True), groups.amax(1, keepdim=True)
            range_squared = ((high - low) ** 2).flatten()
            signal += float(groups.var() * groups.numel())
            dithered = dithered_error(groups)
            found = {
                "uniform, stochastic (today's rounding)":
                    stochastic_variance(groups, levels_at(low, high, (0, 1 / 3, 2 / 3, 1))),
                "uniform, dithered (today's `rounding=\"dithered\"`)": dithered,
                "3 bits, dithered (for scale)": dithered_error(groups, 3),
                "widths 1-4 chosen per group, 2 on average, dithered": per_group_widths(range_squared, 2),
            }
            for share in SPREAD:
                found[f"levels at 0, {share}, {1 - share}, 1 of the range, stochastic"] = stochastic_variance(
                    groups, levels_at(low, high, (0, share, 1 - share, 1)))
            for block in ROTATIONS if not derivative_levels else ():
                rotated = rotated_error(x, block)
                rotated = dithered if rotated is None else rotated
                found[f"uniform, dithered, rotation {block} on every tensor"] = rotated
                found[f"uniform, dithered, rotation {block} where it lowers the tensor's error"] = min(rotated, dithered)
            if derivative_levels:
                plateaus = torch.cat([low, low.clamp(min=0).minimum(high), high.clamp(max=1).maximum(low), high], 1)
                terciles = torch.quantile(groups.float(), torch.tensor([1 / 3, 2 / 3]), dim=1).t().double()
                found["levels at the plateaus: min, 0, 1, max, stochastic"] = stochastic_variance(
                    groups, plateaus.sort(1)[0])
                found["levels at the group's terciles (two more words a group), stochastic"] = stochastic_variance(
                    groups, torch.cat([low, terciles, high], 1).sort(1)[0])
            for name, value in found.items():
                totals[name] = totals.get(name, 0.0) + float(value)
        return {name: value / signal for name, value in totals.items()}

    rows = errors(saved)
    derivatives = [derivative(x.double(), act) for x in activation_inputs]
    derivative_rows = errors(derivatives, derivative_levels=True)
    base = rows["uniform, dithered (today's `rounding=\"dithered\"`)"]
    dbase = derivative_rows["uniform, dithered (today's `rounding=\"dithered\"`)"]
    lines = [f"{args.task} after {args.warmup} fp32 steps; 2-bit formats over feature groups of {GROUP} tokens; "
             "the expected squared rounding error over the tensors' variance (closed form, a static model of "
             "the format); the last column against uniform dithered. Command: "
             f"`benchmarks/format_variance.py --task {args.task}`\n",
             "| tensors | format | error / variance | vs dithered |", "| --- | --- | --- | --- |"]
    for name, value in rows.items():
        lines.append(f"| {len(saved)} saved activations | {name} | {value:.4f} | {value / base:.2f}x |")
    for name, value in derivative_rows.items():
        lines.append(f"| {len(derivatives)} {act} derivatives | {name} | {value:.4f} | {value / dbase:.2f}x |")
    text = "\n".join(lines)
    print(text)
    if args.name:
        print(f"wrote {save_table(args.name, text)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
