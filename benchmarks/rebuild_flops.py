"""What ``recompute_projections`` adds to a training step, counted in FLOPs (not timed).

For each transformer task: the floating-point operations of one eager training step of
its model (``torch.utils.flop_counter``), and those of the matmuls gact's backward runs
again to rebuild attention's value, with the fused projection narrowed to the value's
columns (``passes.narrow``) and run whole. A count, the same on every machine; what it
costs in time depends on the device (the GPU suite has a row for it).

    python benchmarks/rebuild_flops.py
    python benchmarks/rebuild_flops.py --tasks charlm --name rebuild_flops
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import warnings

import torch
from torch.utils.flop_counter import FlopCounterMode

import gact_fx
from gact_fx.bench.tasks import TASKS
from gact_fx.passes import affine
from gact_fx.passes.narrow import MATMULS, find_narrowing

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from benchmarks._results import save_table  # noqa: E402

OPTIONS = {"bits": 3, "rounding": "dithered", "feature_groups": True, "recompute_projections": True}


class RebuiltMatmuls:
    """Counts the FLOPs of the matmuls ``passes.affine`` adds to each backward it rewrites."""

    def __init__(self, narrow: bool) -> None:
        self.flops = 0
        self.narrow = narrow

    def __enter__(self) -> RebuiltMatmuls:
        self._rebuild, self._find = affine._rebuild, affine.find_narrowing

        def rebuild(fw, bw, saved, rebuilds):
            count = self._rebuild(fw, bw, saved, rebuilds)
            for node in bw.graph.nodes:
                if node.target in MATMULS and node.meta.get("gact", {}).get("role") == "rebuilt":
                    a, b = (arg.meta["val"] for arg in node.args[-2:])
                    self.flops += 2 * int(a.shape[0]) * int(a.shape[1]) * int(b.shape[1])
            return count

        affine._rebuild = rebuild
        affine.find_narrowing = find_narrowing if self.narrow else (lambda carrier, chain: None)
        return self

    def __exit__(self, *exc) -> None:
        affine._rebuild, affine.find_narrowing = self._rebuild, self._find


def one_step(task, compiled=None):
    model = task.model()
    x, y = task.batch(0, torch.Generator().manual_seed(0))
    task.loss((compiled or (lambda m: m))(model)(*x), y).backward()


def measure(name: str) -> dict:
    task = TASKS[name](seed=0)
    torch.manual_seed(0)
    with FlopCounterMode(display=False) as counter:
        one_step(task)
    row = {"task": name, "step": counter.get_total_flops()}
    for narrow in (True, False):
        torch._dynamo.reset()
        torch.manual_seed(0)
        with RebuiltMatmuls(narrow) as rebuilt:
            backend = gact_fx.backend(compiler="eager", **OPTIONS)
            one_step(task, lambda m, backend=backend: torch.compile(m, backend=backend))
        row["narrowed" if narrow else "whole"] = rebuilt.flops
    return row


def markdown(rows: list[dict]) -> str:
    lines = ["| task | training step (GFLOP) | value rebuilt, narrowed | value rebuilt, projection whole |",
             "| --- | --- | --- | --- |"]
    for row in rows:
        cells = [f"{row[k] / 1e9:.3f} GFLOP (+{100 * row[k] / row['step']:.2f}%)" for k in ("narrowed", "whole")]
        lines.append(f"| {row['task']} | {row['step'] / 1e9:.2f} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=["charlm", "charlm-llama", "charlm-bert"],
                        choices=[n for n in TASKS if n.startswith("charlm")])
    parser.add_argument("--name", help="write benchmarks/results/NAME.json")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", category=UserWarning)
    rows = []
    for name in args.tasks:
        rows.append(measure(name))
        print(f"{name}: done", file=sys.stderr, flush=True)
    table = markdown(rows)
    print(table)
    if args.name:
        save_table(args.name, table, rows=rows)


if __name__ == "__main__":
    main()
