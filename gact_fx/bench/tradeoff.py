"""Loss against bytes held, over every convergence run: one table and one figure per task.

Each convergence file holds one seed's runs beside their own fp32 run. Here every run
becomes a point: its activation bytes against fp32's (the report's ratio) and its final
metric against that fp32 run's. A method whose bytes changed between runs (the format
changed under its name) is one row per ratio. A *format* is a method with its width left
out ("uniform, rotation 32" holds "3 bit, rotation 32" and "L1.2, rotation 32"), and the
figure draws one curve per format through its widths.
"""

from __future__ import annotations

import dataclasses
import re
import statistics
from collections import defaultdict
from dataclasses import dataclass

from .train import largest_norm_ratio

FIGURE = "loss_against_bytes.png"  # beside the result files; ``plots.loss_against_bytes`` draws it
_UNIFORM = re.compile(r"^(L1(\.\d)?( \(\d bit\))?|\d bit)(?=$|, | \()")
_ADAPTIVE = re.compile(r"^L2(\.\d)?( \(adaptive \d\))?(?=$|, )")


@dataclass(frozen=True)
class RunPoint:
    task: str  # the task, and the clipping its file trained with
    method: str
    ratio: float  # activation bytes of fp32 over the run's
    delta: float  # final metric against fp32's: percent (losses) or points (accuracies)
    norm_ratio: float | None  # the largest gradient norm against fp32's at the same step
    seed: int


def format_of(method: str) -> str:
    """A method's format: its name with the width (``3 bit``, ``L1.2 (2 bit)``, ``L2.2``) as
    ``uniform`` or ``adaptive``, and a re-run's `` (other signs)`` dropped."""
    name = method.removesuffix(" (other signs)")
    name = _UNIFORM.sub("uniform", name, count=1)
    return _ADAPTIVE.sub("adaptive", name, count=1)


def run_points(convergences: list[dict], higher_is_better: dict[str, bool]) -> list[RunPoint]:
    """Every compressed run of every convergence file that has an fp32 run beside it. A file
    whose fp32 run is longer or shorter than most of its task's is a task of its own,
    named with its steps ("char-bert, 2000 steps")."""
    points, lengths = [], []
    for data in convergences:
        meta = data["meta"]
        clip = meta.get("clip_grad_norm")
        warm = meta.get("warm_steps")
        reference = next((r for r in data["results"] if r["method"] == "fp32" and r.get("curve")), None)
        if reference is None:
            continue
        base = reference["curve"][-1][1]
        for r in data["results"]:
            if r is reference or not r.get("curve") or not r.get("activation_ratio") or r.get("diverged"):
                continue
            task = r["task"] + (f", clipped at {clip:g}" if clip else "") + (f", after {warm} fp32 steps" if warm else "")
            final = r["curve"][-1][1]
            delta = 100 * (final - base) if higher_is_better.get(r["task"]) else 100 * (final - base) / base
            norms = largest_norm_ratio(r.get("grad_norms") or [], reference.get("grad_norms") or [])
            points.append(RunPoint(task, r["method"], r["activation_ratio"], delta, norms, meta.get("seed", 0)))
            lengths.append(reference["curve"][-1][0])
    usual = {task: statistics.mode(n for p, n in zip(points, lengths) if p.task == task)
             for task in {p.task for p in points}}
    return [p if n == usual[p.task] else dataclasses.replace(p, task=f"{p.task}, {n} steps")
            for p, n in zip(points, lengths)]


def _rows(points: list[RunPoint]) -> dict[tuple[str, float], list[RunPoint]]:
    """The points of one task by method and ratio (to 0.1x)."""
    rows: dict[tuple[str, float], list[RunPoint]] = defaultdict(list)
    for p in points:
        rows[(p.method, round(p.ratio, 1))].append(p)
    return rows


def section(points: list[RunPoint], higher_is_better: dict[str, bool], figure: str = "") -> str:
    """The Markdown section: per task, one row per method and ratio, every run's result."""
    lines = ["## Loss against bytes held: every convergence run\n",
             "Every compressed run of the convergence sections above, against the fp32 run of its own file "
             "(same seed, same clipping), sorted by the bytes it holds. 'within 1%' counts the runs that ended "
             "within 1% of fp32's loss (for accuracies: within 1 point); 'mean' is over the runs. A method listed "
             "twice held different bytes in different runs: the format under its name changed between them.\n",
             figure]
    for task in sorted({p.task for p in points}):
        accuracy = higher_is_better.get(task.split(",")[0])
        unit = " pp" if accuracy else "%"
        lines += [f"\n**{task}**\n", f"| method | activations vs fp32 | runs (seeds) | vs fp32, each run | mean | within 1"
                  f"{unit} | largest gradient norm / fp32's |", "| --- | --- | --- | --- | --- | --- | --- |"]
        rows = _rows([p for p in points if p.task == task])
        for (method, ratio), runs in sorted(rows.items(), key=lambda item: (item[0][1], item[0][0])):
            runs = sorted(runs, key=lambda p: p.seed)
            shown = [round(p.delta, 2) for p in runs]  # counted as printed
            good = sum((d >= -1) if accuracy else (d <= 1) for d in shown)
            deltas = ", ".join(f"{p.delta:+.2f}" for p in runs) + unit
            norms = [p.norm_ratio for p in runs if p.norm_ratio is not None]
            largest = f"{max(norms):.1f}x" if norms else "-"
            seeds = ", ".join(str(p.seed) for p in runs)
            mean = statistics.fmean(p.delta for p in runs)
            lines.append(f"| {method} | {ratio:.1f}x smaller | {len(runs)} ({seeds}) | {deltas} | {mean:+.2f}{unit} | "
                         f"{good} of {len(runs)} | {largest} |")
    return "\n".join(lines) + "\n"


Curve = list[tuple[float, float, float, float]]  # (ratio, median, lowest, highest) per method of a format


def curves(points: list[RunPoint], higher_is_better: dict[str, bool]) -> dict[str, dict[str, Curve]]:
    """Per task, per format: (ratio, median, lowest, highest) of each of its methods, by
    ratio, of how much worse than fp32 each run ended: percent more loss, or points less
    accuracy."""
    result: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for task in {p.task for p in points}:
        sign = -1 if higher_is_better.get(task.split(",")[0]) else 1
        for (method, ratio), runs in _rows([p for p in points if p.task == task]).items():
            deltas = [sign * p.delta for p in runs]
            result[task][format_of(method)].append((ratio, statistics.median(deltas), min(deltas), max(deltas)))
    return {task: {name: sorted(values) for name, values in formats.items()} for task, formats in result.items()}
