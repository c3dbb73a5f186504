"""Generate BENCHMARKS.md from the result files of ``gact-fx bench`` and ``benchmarks/``.

Every section comes from one JSON file with its ``meta`` (device, torch version, date,
command) printed above its table, so each number carries where and how it was made.
Sections whose file is absent are left out; figure links are relative to the report's
own directory, and only figures that exist are linked.
"""

from __future__ import annotations

import json
import os
import pathlib

from ..report import format_bytes
from ..runtime.format import ideal_ratio
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


def _load(path: pathlib.Path):
    data = json.loads(path.read_text())
    if isinstance(data, list):  # older files: a bare list of results
        return {"meta": {}, "results": data}
    return data


def _ratio(value, reference) -> str:
    if value is None or not reference:
        return "-"
    return f"{reference / max(value, 1):.1f}x smaller" if value <= reference else f"{value / reference:.2f}x larger"


def suite_section(data: dict) -> str:
    rows, meta = data["rows"], data["meta"]
    lines = ["## Memory, speed and compile time\n", _meta(meta),
             f"Compiler for every method: {meta.get('compiler')}. Saved activations: what autograd keeps after one forward "
             "when the caller keeps only the loss (saved outputs included; parameters and buffers left out), measured at "
             "run time, less the copies of weights the backward holds, which are shown apart. Peak: "
             + ("`max_memory_allocated` over a step." if "CPU" not in meta.get("device", "") else
                "the peak of a step's allocations above what it started with (CPU profiler).")
             + " Step time: median, as a ratio to torch.compile measured in the same run. Limit: the least a "
             "b-bit format can store, (b + 0.25)/32 of fp32.\n"]
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
            limit = f"{1 / ideal_ratio(r['bits']):.1f}x" if r.get("bits") else "-"
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


TABLE_FILES = {
    "gradient_variance.json": ("Gradient variance: uniform against adaptive bits",
                               "Relative variance E||g - g_exact||^2 / ||g_exact||^2 over rounding seeds."),
    "adaptive_overhead.json": ("Cost of adaptive bits", "A probe step against a normal step, amortised over the interval."),
    "cpu_step_time.json": ("CPU step time of the gact backend", "Ratios against the same compile path with gact disabled."),
    "cpu_step_time_feature_groups.json": ("CPU step time with feature groups",
                                          "`feature_groups=True` against contiguous groups, in the same run. The "
                                          "CPU codec reads and writes the tensor's own layout (no transposed copy) "
                                          "where its tokens fill whole groups and its features come in eights."),
    "compile_time.json": ("Compile time on the CPU: gact against plain Inductor, cold and warm",
                          "`benchmarks/compile_time.py`: the first training step (forward and backward, both "
                          "compiled) in a fresh process per run, on an empty Inductor cache (cold: every kernel "
                          "built, gact's CPU codec too) and again on the cache the cold run filled (warm)."),
    "compile_time_adaptive.json": ("Compile time on the CPU: adaptive bits",
                                   "`benchmarks/compile_time.py --models bert llama-base --bits 2 --levels L2.2 "
                                   "--repeats 1 --steps 3 --name compile_time_adaptive`: as above, with an adaptive "
                                   "level, whose first two steps are sensitivity probes."),
    "cpu_peak_memory.json": ("Peak step memory on the CPU: transformers at base width",
                             "`benchmarks/cpu_peak_memory.py`: one training step per method, the caller keeping only the "
                             "loss; peak from the CPU profiler's allocation events, above what was live before the step."),
    "cpu_peak_memory_batch8.json": ("Peak step memory on the CPU: the same at twice the batch",
                                    "`benchmarks/cpu_peak_memory.py --batch 8`: as above, with twice the tokens per step."),
    "cpu_peak_memory_base.json": ("Peak step memory on the CPU: the zoo's base size",
                                  "`benchmarks/cpu_peak_memory.py --layers 12 --sequence 512 --batch 16`: the zoo's base "
                                  "size (12 layers, hidden 768, batch 16 x 512 tokens), otherwise as above."),
    "cpu_peak_memory_base_bert.json": ("Peak step memory on the CPU: every method on BERT at the zoo's base size",
                                       "`benchmarks/cpu_peak_memory.py --models bert --layers 12 --sequence 512 "
                                       "--batch 16 --steps 1 --name cpu_peak_memory_base_bert`."),
    "cpu_step_base_inductor.json": ("Step time on the CPU under Inductor: transformers at base width",
                                    "`benchmarks/cpu_peak_memory.py --methods torch.compile 'gact 2 bit' 'gact L2.2 "
                                    "(adaptive 2)' --compiler inductor --steps 5 --name cpu_step_base_inductor`: the table "
                                    "above, compiled by Inductor, with adaptive bits."),
    "kernels.json": ("Kernels: quantize / dequantize bandwidth and step time",
                     "Against the faster of two copies of the same tensor on the same device: into a new tensor, and "
                     "into a buffer allocated once."),
    "kernels_cpu_2threads.json": ("Kernels on two CPU threads",
                                  "`benchmarks/kernels.py --skip-steps --threads 2 --name kernels_cpu_2threads`: the "
                                  "codec's groups split over torch's threads, the copies likewise."),
    "kernels_cpu_large.json": ("Kernels on large CPU tensors", "`benchmarks/kernels.py --skip-steps --numel 33554432 "
                               "--name kernels_cpu_large`: 32M elements, larger than the caches, as saved activations of "
                               "base-size models are (BERT-base's attention probabilities at batch 16 x 512: 48M)."),
    "kernels_cpu_large_thp.json": ("Kernels on large CPU tensors, with huge pages",
                                   "`THP_MEM_ALLOC_ENABLE=1 benchmarks/kernels.py --skip-steps --numel 33554432 --name "
                                   "kernels_cpu_large_thp`: as above, with torch's CPU allocator asking for transparent "
                                   "huge pages, so that a fresh allocation faults once per 2 MB instead of once per 4 KB."),
    "warm_gradient_error_groups.json": ("Gradient error against bytes: widths and group sizes",
                                        "One draw's gradient error on the Llama after 300 fp32 steps, each width at each "
                                        "group size; the activation bytes include each group's 8 bytes of metadata and "
                                        "the attention floors (8 bits)."),
    "warm_gradient_error_floors.json": ("Gradient error against bytes: attention floors and adaptive levels",
                                        "As above: uniform widths with attention's floors at 4 bits instead of 8 "
                                        "(`nonlinear_bits=4`), beside the adaptive levels."),
    "warm_gradient_error_rotation.json": ("Gradient error against bytes: a random-sign Hadamard rotation (candidate format)",
                                          "As above, with each lossy tensor rotated blockwise (32 or 128 elements) along "
                                          "its innermost dimension before quantizing and rotated back after decoding "
                                          "(`benchmarks/_rotation.py`, a measurement wrapper; no codec writes it yet). "
                                          "Same bytes; the error is what changes."),
    "static_kernels.json": ("GPU kernels, static: instructions per element against the memory-speed budget",
                            "`python benchmarks/static_kernels.py`: every variant the CUDA path launches, compiled "
                            "for sm_90 and read back with cuobjdump on this CPU machine. A static model: the GPU "
                            "suite's measured kernel table (when a GPU ran it) is the test of it."),
    "gpu_suite.json": ("GPU suite", "`gact-fx bench --gpu-suite`: the GPU tests, the kernels against a device copy, and "
                       "three models against torch.compile."),
}


def write_markdown(results: pathlib.Path, target: pathlib.Path) -> pathlib.Path:
    """Write the report on the result files in ``results`` to ``target`` (any path)."""
    loaded: list[dict] = []

    def load(path: pathlib.Path) -> dict:
        loaded.append(_load(path))
        return loaded[-1]

    source = pathlib.Path(os.path.relpath(results.resolve(), target.resolve().parent)).as_posix()
    sections = ["# Benchmarks\n", f"Generated by `gact-fx bench` from `{source}/*.json`. Every section states the "
                "device, torch version, date and command its numbers came from; CPU numbers are CPU numbers.\n"]
    if (results / "suite.json").exists():
        sections.append(suite_section(load(results / "suite.json"))
                        + _figure("memory against step time", results / "memory_vs_time.png", target)
                        + _figure("largest batch that fits", results / "max_batch.png", target))
    if (results / "accuracy.json").exists():
        sections.append(accuracy_section(load(results / "accuracy.json"))
                        + _figure("training curves", results / "accuracy_curves.png", target))
    for path in sorted(p for p in results.glob("convergence_*.json") if "." not in p.stem):  # not the parts
        sections.append(convergence_section(path, load(path), target))
    for name, (title, note) in TABLE_FILES.items():
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
