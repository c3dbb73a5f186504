"""Data-parallel ranks drawing the same rounding noise, against each drawing its own.

Simulates ``R`` data-parallel ranks in one process: ``R`` compressed copies of a task's
model, each on its own batch, their gradients averaged as DDP's all-reduce would. The
averaged gradient's error against the exact average, over several draws, with every rank
keyed as a single process (what each rank drew before the rank was mixed into the key),
and with each rank keyed as ``torch.distributed`` rank ``r`` now is (``runtime.registry``).
Independent noise should average to about one ``R``-th of one rank's error.

    python benchmarks/rank_noise.py
    python benchmarks/rank_noise.py --task charlm --ranks 2 8 --bits 2 4 --draws 6
"""

from __future__ import annotations

import argparse
import copy
import pathlib
import sys

import torch

import gact_fx
from gact_fx.bench.methods import PLAIN_FORMAT
from gact_fx.bench.tasks import TASKS
from gact_fx.runtime.registry import DIRECTORY, rank_seed

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from benchmarks._results import save_table  # noqa: E402


def gradient(model, task, batch) -> torch.Tensor:
    (inputs,), target = batch
    model.zero_grad()
    task.loss(model(inputs), target).backward()
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def averaged_error(task, base, batches, exact, bits: int, draws: int, own_noise: bool) -> float:
    """Mean over draws of the averaged gradient's squared error relative to ``exact``'s, the
    uncompressed average over ``batches``."""
    ranks = []
    for rank, batch in enumerate(batches):
        model = gact_fx.compress(copy.deepcopy(base), bits=bits, **PLAIN_FORMAT)
        gradient(model, task, batch)  # compiles
        seed = rank_seed(DIRECTORY.base_seed, rank if own_noise else 0)
        model.gact.backend.registry.reseed(seed)
        ranks.append(model)
    errors = []
    for _ in range(draws):
        average = sum(gradient(model, task, batch) for model, batch in zip(ranks, batches)) / len(batches)
        errors.append(float(((average - exact) ** 2).sum() / (exact ** 2).sum()))
    return sum(errors) / len(errors)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="charlm", choices=["charlm", "charlm-llama", "charlm-bert"])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 8])
    parser.add_argument("--bits", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--batch-size", type=int, default=8, help="each rank's batch")
    parser.add_argument("--draws", type=int, default=6)
    parser.add_argument("--name", default="rank_noise")
    args = parser.parse_args()
    torch.set_num_threads(1)
    task = TASKS[args.task](batch_size=args.batch_size)
    torch.manual_seed(0)
    base = task.model()
    generator = torch.Generator().manual_seed(0)
    batches = [task.batch(step, generator) for step in range(max(args.ranks))]
    per_batch = [gradient(base, task, batch) for batch in batches]  # each once, whatever the rank counts
    exact_averages = {ranks: sum(per_batch[:ranks]) / ranks for ranks in args.ranks}
    rows = []
    for bits in args.bits:
        for ranks, exact in exact_averages.items():
            shared, own = (averaged_error(task, base, batches[:ranks], exact, bits, args.draws, own_noise)
                           for own_noise in (False, True))
            rows.append(f"| {bits} | {ranks} | {shared:.3g} | {own:.3g} | {shared / own:.2f}x |")
            print(rows[-1], flush=True)
    markdown = "\n".join([
        f"{args.task}, {args.batch_size} sequences a rank; the averaged gradient's squared error over the exact "
        f"average's squared norm, mean of {args.draws} draws; CPU, the ranks simulated in one process. "
        f"Command: `benchmarks/rank_noise.py --task {args.task}`",
        "",
        "| bits | ranks | every rank a single process's noise | each rank its own | shared / own |",
        "| --- | --- | --- | --- | --- |",
        *rows,
    ])
    print(f"wrote {save_table(args.name, markdown)}")


if __name__ == "__main__":
    main()
