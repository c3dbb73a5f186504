"""The Markdown report of benchmark result files: ``gact-fx bench``'s, and ``benchmarks/``' through ``benchmarks/report.py``.

Every section comes from one JSON file with its ``meta`` (device, torch version, date,
command) printed above its table, so each number carries where and how it was made.
Sections whose file is absent are left out; figure links are relative to the report's
own directory, and only figures that exist are linked.
"""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Mapping

from ..report import format_bytes
from ..runtime.format import ideal_ratio
from . import tradeoff
from .tasks import TASKS
from .train import largest_norm_ratio

# Which way each task's metric improves, for result files that do not say (older ones,
# and benchmarks/convergence.py's, whose TrainResult has no such field).
HIGHER_IS_BETTER = {task.name: task.higher_is_better for task in TASKS.values()}


def _meta(meta: dict) -> str:
    """Where and how a section was measured, and the measurer's note on its conditions, if any."""
    note = f"\n{meta['note']}\n" if meta.get("note") else ""
    return (f"*{meta.get('device', '?')}; torch {meta.get('torch', '?')}; {meta.get('date', '?')}; "
            f"command: `{meta.get('command', '?')}`*\n{note}")


def _cell(value) -> str:
    """Text for a Markdown table cell: a ``|`` would end the cell."""
    return str(value).replace("|", "\\|")


def _figure(alt: str, figure: pathlib.Path, target: pathlib.Path) -> str:
    """A Markdown image link to ``figure`` from the report ``target``; empty if it does not exist."""
    if not figure.exists():
        return ""
    link = pathlib.Path(os.path.relpath(figure.resolve(), target.resolve().parent)).as_posix()
    return f"\n![{alt}]({link})\n"


def load_result(path: pathlib.Path) -> dict:
    """A result file as {"meta", "results"|"markdown"}."""
    data = json.loads(path.read_text())
    if isinstance(data, list):  # older files: a bare list of results
        return {"meta": {}, "results": data}
    return data


def _ratio(value, reference) -> str:
    if value is None or not reference:
        return "-"
    return f"{reference / max(value, 1):.1f}x smaller" if value <= reference else f"{value / reference:.2f}x larger"


def _metadata_bytes(meta: dict) -> int:
    """A group's metadata bytes in the run's format (8 before the bfloat16 words, whose runs
    do not record it)."""
    return meta.get("metadata_bytes_per_group", 8)


def suite_section(data: dict) -> str:
    rows, meta = data["rows"], data["meta"]
    metadata = _metadata_bytes(meta)
    lines = ["## Memory, speed and compile time\n", _meta(meta),
             f"Compiler for every method: {meta.get('compiler')}. Saved activations: what autograd keeps after one forward "
             "when the caller keeps only the loss (saved outputs included; parameters and buffers left out), measured at "
             "run time, less the copies of weights the backward holds, which are shown apart. Peak: "
             + ("`max_memory_allocated` over a step." if "CPU" not in meta.get("device", "") else
                "the peak of a step's allocations above what it started with (CPU profiler).")
             + " Step time: median, as a ratio to torch.compile measured in the same run. Limit: the least the "
             f"b-bit format of the run could store, (b + {8 * metadata / 256})/32 of fp32.\n"]
    for key in sorted({(r["model"], r["size"]) for r in rows}, key=lambda k: (k[0], k[1])):
        group = [r for r in rows if (r["model"], r["size"]) == key]
        base = next((r for r in group if r["method"] == "torch.compile" and not r["error"]), None)
        lines.append(f"\n**{key[0]} ({key[1]})**, batch {group[0]['batch']}\n")
        lines.append("| method | saved activations | vs torch.compile | limit | weight copies | peak step memory | "
                     "step time | compile s | max batch |")
        lines.append("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for r in group:
            if r["error"]:
                lines.append(f"| {r['method']} | failed: {r['error'].replace('|', '/')} | | | | | | | |")
                continue
            copies = "-" if r.get("weight_copy_bytes") is None else format_bytes(r["weight_copy_bytes"])
            limit = "-" if not r.get("bits") else f"{1 / ideal_ratio(r['bits'], metadata_bytes=metadata):.1f}x"
            time_ratio = f"{r['step_ms'] / base['step_ms']:.2f}x" if base else f"{r['step_ms']:.1f} ms"
            versus = "baseline" if r is base else _ratio(r["saved_bytes"], base and base["saved_bytes"])
            lines.append(
                f"| {r['method']} | {format_bytes(r['saved_bytes'])} | {versus} | {limit} | {copies} | "
                f"{format_bytes(r['peak_bytes'])} | {time_ratio} | {r['compile_s']:.1f} | {r['max_batch'] or '-'} |"
            )
    return "\n".join(lines) + "\n"


def accuracy_section(data: dict) -> str:
    results, meta = data["results"], data["meta"]
    lines = ["## Accuracy on short real training runs\n", _meta(meta),
             "Same data, order, initial weights and seeds for every method; only how saved activations are stored differs.\n"]
    for task in sorted({r["task"] for r in results}):
        group = [r for r in results if r["task"] == task]
        reference = next((r for r in group if r["method"] in ("torch.compile", "fp32") and r.get("curve")), None)
        metric = group[0]["metric"]
        higher_is_better = group[0].get("higher_is_better", HIGHER_IS_BETTER.get(task))
        direction = {True: ", higher is better", False: ", lower is better"}.get(higher_is_better, "")
        lines += [f"\n**{_cell(task)}** ({_cell(metric)}{direction})\n",
                  f"| method | final {_cell(metric)} | vs uncompressed | average bits | activations | "
                  "largest gradient norm / uncompressed's |", "| --- | --- | --- | --- | --- | --- |"]
        for r in group:
            if r.get("error") or not r.get("curve"):
                lines.append(f"| {_cell(r['method'])} | failed: {_cell(r.get('error', 'no result'))} | | | | |")
                continue
            final = r["curve"][-1][1]
            if r.get("diverged"):
                delta = "diverged"
            elif reference is None:
                delta = "-"
            elif higher_is_better:  # an accuracy: the difference in percentage points
                delta = f"{100 * (final - reference['curve'][-1][1]):+.2f} pp"
            else:
                delta = f"{100 * (final - reference['curve'][-1][1]) / reference['curve'][-1][1]:+.2f}%"
            bits = f"{r['average_bits']:.2f}" if r.get("average_bits") else "-"  # 0: nothing was adaptive
            saved = f"{r['activation_ratio']:.1f}x smaller" if r.get("activation_ratio") else "-"
            lines.append(f"| {_cell(r['method'])} | {final:.4f} | {delta} | {bits} | {saved} | "
                         f"{_norm_ratio(r, reference)} |")
    return "\n".join(lines) + "\n"


def _norm_ratio(result: dict, reference: dict | None) -> str:
    """The largest ratio of a run's gradient norm to the reference's at the same step."""
    if reference is None or result is reference:
        return "-"
    ratio = largest_norm_ratio(result.get("grad_norms") or [], reference.get("grad_norms") or [])
    return "-" if ratio is None else f"{ratio:.2f}x"


def convergence_section(path: pathlib.Path, data: dict, target: pathlib.Path) -> str:
    renamed = {"results": [dict(r, task=r.get("task", path.stem)) for r in data["results"]], "meta": data["meta"]}
    text = accuracy_section(renamed).replace("## Accuracy on short real training runs", f"## Convergence: {path.stem.removeprefix('convergence_')}")
    return text + _figure("curves", path.with_suffix(".png"), target)


def table_section(title: str, note: str, data: dict, figure: str = "") -> str:
    """A section whose file carries a ready Markdown table (``data["markdown"]``)."""
    return f"## {title}\n\n{_meta(data['meta'])}\n{note}\n{figure}\n{data['markdown']}\n"


# The result files ``gact-fx bench`` itself writes as a ready table; the repository's
# ``benchmarks/report.py`` passes its scripts' files too.
TABLES = {
    "gpu_suite.json": ("GPU suite", "`gact-fx bench --gpu-suite`: the GPU tests, the kernels against a device copy, and "
                       "three models against torch.compile."),
}


def write_markdown(results: pathlib.Path, target: pathlib.Path, *, tables: Mapping[str, tuple[str, str]] = TABLES,
                   generator: str = "gact-fx bench") -> pathlib.Path:
    """Write the report on the result files in ``results`` to ``target`` (any path): the
    suite's and accuracy runs', every ``convergence_*.json``, and each file of ``tables``
    (name: title and note) that carries a ready table."""
    loaded: list[dict] = []

    def load(path: pathlib.Path) -> dict:
        loaded.append(load_result(path))
        return loaded[-1]

    source = pathlib.Path(os.path.relpath(results.resolve(), target.resolve().parent)).as_posix()
    sections = ["# Benchmarks\n", f"Generated by `{generator}` from `{source}/*.json`. Every section states the "
                "device, torch version, date and command its numbers came from; CPU numbers are CPU numbers.\n"]
    if (results / "suite.json").exists():
        sections.append(suite_section(load(results / "suite.json"))
                        + _figure("memory against step time", results / "memory_vs_time.png", target)
                        + _figure("largest batch that fits", results / "max_batch.png", target))
    if (results / "accuracy.json").exists():
        sections.append(accuracy_section(load(results / "accuracy.json"))
                        + _figure("training curves", results / "accuracy_curves.png", target))
    convergences = []
    for path in sorted(p for p in results.glob("convergence_*.json") if "." not in p.stem):  # not the parts
        convergences.append(load(path))
        sections.append(convergence_section(path, convergences[-1], target))
    points = tradeoff.run_points(convergences, HIGHER_IS_BETTER)
    if points:
        figure = _figure("loss against bytes held", results / tradeoff.FIGURE, target)
        sections.append(tradeoff.section(points, HIGHER_IS_BETTER, figure))
    for name, (title, note) in tables.items():
        if (results / name).exists():
            data = load(results / name)
            if "markdown" in data:
                figure = _figure(title.split(":")[0].lower(), (results / name).with_suffix(".png"), target)
                sections.append(table_section(title, note, data, figure))
    if all(data.get("meta", {}).get("device", "CPU").startswith("CPU") for data in loaded):
        sections.insert(2, "**No section below was measured on a GPU**: there is no max-batch table and no GPU "
                        "kernel bandwidth table; GPU speed and memory are unmeasured.\n")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("\n".join(sections))
    return target
