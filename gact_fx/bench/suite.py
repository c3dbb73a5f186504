"""``gact-fx bench``: the zoo under every method, then short real training runs.

Writes ``suite.json`` / ``suite.csv`` (memory, speed, compile time, max batch),
``accuracy.json`` (final metrics and curves), the figures, and regenerates the
Markdown report from every result file in the output directory.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import logging
import pathlib
import sys

import torch

from . import plots
from .markdown import write_markdown
from .measure import Measurement, measure
from .metadata import metadata
from .methods import ALL, Method, select
from .tasks import TASKS
from .train import train
from .zoo import ZOO, build

log = logging.getLogger("gact_fx.bench")

ACCURACY_STEPS = {"mnist1d": 1000, "digits": 800, "karate": 200, "charlm": 300}
ACCURACY_METHODS = ("torch.compile", "gact 8 bit", "gact 4 bit", "gact 2 bit", "gact L2 (adaptive 4)",
                    "gact L2.2 (adaptive 2)", "fp8 activations (torch)")
QUICK_ACCURACY_METHODS = ("torch.compile", "gact 8 bit", "gact L2.2 (adaptive 2)")


def accuracy_methods(names: list[str] | None, quick: bool) -> list[Method]:
    """The methods trained for accuracy: those of ``--methods`` that are accuracy methods
    (and the baseline), or by default all of them (``--quick``: three)."""
    if names:
        return [method for method in select(names, quick) if method.name in ACCURACY_METHODS]
    return [ALL[name] for name in (QUICK_ACCURACY_METHODS if quick else ACCURACY_METHODS)]


def _progress(total: int, description: str):
    try:
        from tqdm import tqdm

        return tqdm(total=total, desc=description, file=sys.stderr, leave=False)
    except ImportError:  # progress as log lines instead
        class Lines:
            def __init__(self):
                self.count = 0

            def update(self, n=1):
                self.count += n
                log.info("%s: %d/%d", description, self.count, total)

            def set_postfix_str(self, text):
                pass

            def close(self):
                pass

        return Lines()


def run_suite(models, sizes, methods, *, device, compiler, steps, find_max_batch) -> list[Measurement]:
    rows = []
    bar = _progress(len(models) * len(sizes) * len(methods), "bench")
    for name in models:
        for size in sizes:
            try:
                workload = build(name, size, device)
            except Exception as error:
                message = f"{type(error).__name__}: {error}".splitlines()[0][:160]
                rows += [Measurement(name, size, m.name, 0, error=message) for m in methods]
                bar.update(len(methods))
                continue
            for method in methods:
                bar.set_postfix_str(f"{name}-{size}: {method.name}")
                torch._dynamo.reset()
                rows.append(measure(workload, method, model=name, size=size, compiler=compiler, device=device,
                                    steps=steps, find_max_batch=find_max_batch))
                bar.update()
    bar.close()
    return rows


def run_accuracy(tasks, methods, *, steps_scale: float, compiler: str) -> list[dict]:
    results = []
    bar = _progress(len(tasks) * len(methods), "accuracy")
    for task_name in tasks:
        task = TASKS[task_name]()
        steps = max(20, int(ACCURACY_STEPS[task_name] * steps_scale))
        for method in methods:
            bar.set_postfix_str(f"{task_name}: {method.name}")
            torch._dynamo.reset()
            try:
                result = train(task, method.name, method, steps=steps, eval_every=max(10, steps // 10), compiler=compiler)
                results.append(dataclasses.asdict(result) | {"higher_is_better": task.higher_is_better})
            except Exception as error:
                results.append({"task": task.name, "method": method.name, "metric": task.metric, "higher_is_better": task.higher_is_better,
                                "curve": [], "error": f"{type(error).__name__}: {error}"[:160]})
            bar.update()
    bar.close()
    return results


def main(args) -> int:
    if args.report_only:
        markdown = write_markdown(pathlib.Path(args.out), pathlib.Path(args.markdown) if args.markdown else pathlib.Path(args.out) / "BENCHMARKS.md")
        print(f"wrote {markdown} from the result files in {args.out}")
        return 0
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":
        torch.set_num_threads(1)  # step-time ratios on a quiet core
    compiler = "eager" if args.quick else "inductor"
    models = args.models or (["cnn", "gpt2"] if args.quick else list(ZOO))
    sizes = args.sizes or (["tiny"] if args.quick or device == "cpu" else ["small", "base"])
    methods = select(args.methods, args.quick)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = metadata(device) | {"compiler": compiler, "quick": args.quick}
    rows = run_suite(models, sizes, methods, device=device, compiler=compiler,
                     steps=args.steps or (2 if args.quick else 5), find_max_batch=device == "cuda" and not args.quick)
    (out / "suite.json").write_text(json.dumps({"meta": meta, "rows": [r.as_dict() for r in rows]}, indent=1))
    with open(out / "suite.csv", "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(Measurement.__dataclass_fields__))
        writer.writeheader()
        writer.writerows(r.as_dict() for r in rows)
    plots.memory_vs_time([r.as_dict() for r in rows], out / "memory_vs_time.png")
    plots.max_batch([r.as_dict() for r in rows], out / "max_batch.png")
    if not args.skip_accuracy:
        tasks = args.tasks or (["digits"] if args.quick else ["mnist1d", "digits", "karate", "charlm"])
        chosen = accuracy_methods(args.methods, args.quick)
        results = run_accuracy(tasks, chosen, steps_scale=0.1 if args.quick else 1.0, compiler="eager")
        # the training runs are on the CPU whatever --device is: label them so
        (out / "accuracy.json").write_text(json.dumps({"meta": metadata("cpu") | {"compiler": "eager"}, "results": results}, indent=1))
        plots.curves([r for r in results if r.get("curve")], out / "accuracy_curves.png")
    markdown = write_markdown(out, pathlib.Path(args.markdown) if args.markdown else out / "BENCHMARKS.md")
    print(f"wrote {out}/suite.json, suite.csv, figures and {markdown}")
    return 0
