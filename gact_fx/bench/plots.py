"""Matplotlib figures of the suite: memory against step time, max batch, training curves."""

from __future__ import annotations

import pathlib


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def memory_vs_time(rows: list[dict], path: pathlib.Path) -> None:
    """Saved activations and step time relative to torch.compile, per model, per method."""
    plt = _pyplot()
    baseline = {(r["model"], r["size"]): r for r in rows if r["method"] == "torch.compile" and not r["error"]}
    figure, axis = plt.subplots(figsize=(7.5, 5))
    methods = sorted({r["method"] for r in rows if r["method"] != "torch.compile"})
    colours = plt.cm.tab10.colors
    for index, method in enumerate(methods):
        points = []
        for r in rows:
            base = baseline.get((r["model"], r["size"]))
            if r["method"] == method and base and not r["error"] and r["saved_bytes"] is not None and base["saved_bytes"]:
                points.append((r["step_ms"] / base["step_ms"], max(r["saved_bytes"], 1) / base["saved_bytes"]))
        if points:
            xs, ys = zip(*points)
            axis.scatter(xs, ys, label=method, color=colours[index % len(colours)], s=28, alpha=0.8)
    axis.axhline(1, color="#999", linewidth=0.8)
    axis.axvline(1, color="#999", linewidth=0.8)
    axis.set_yscale("log")
    axis.set_xlabel("step time / torch.compile")
    axis.set_ylabel("saved activations / torch.compile")
    axis.set_title("memory against speed, one point per model")
    axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def max_batch(rows: list[dict], path: pathlib.Path) -> None:
    plt = _pyplot()
    fitted = [r for r in rows if r.get("max_batch")]
    if not fitted:
        return
    labels = sorted({f"{r['model']}-{r['size']}" for r in fitted})
    methods = sorted({r["method"] for r in fitted})
    figure, axis = plt.subplots(figsize=(max(7, len(labels) * 1.5), 4.5))
    width = 0.8 / len(methods)
    for index, method in enumerate(methods):
        values = [next((r["max_batch"] for r in fitted if f"{r['model']}-{r['size']}" == label and r["method"] == method), 0) for label in labels]
        axis.bar([i + index * width for i in range(len(labels))], values, width=width, label=method)
    axis.set_xticks([i + 0.4 - width / 2 for i in range(len(labels))], labels)
    axis.set_ylabel("largest batch that fits")
    axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def curves(results: list[dict], path: pathlib.Path) -> None:
    plt = _pyplot()
    tasks = sorted({r["task"] for r in results})
    figure, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 4), squeeze=False)
    for axis, task in zip(axes[0], tasks):
        for r in (r for r in results if r["task"] == task):
            if r["curve"]:
                steps, values = zip(*r["curve"])
                axis.plot(steps, values, label=r["method"], linewidth=2 if r["method"] == "torch.compile" else 1.2)
        axis.set_title(task)
        axis.set_xlabel("step")
        axis.set_ylabel(next(r["metric"] for r in results if r["task"] == task))
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def loss_against_bytes(curves: dict[str, dict[str, list[tuple[float, float, float, float]]]], path: pathlib.Path) -> None:
    """One panel per task: each format a line through its methods, at the bytes they hold
    (``bench.tradeoff.curves``: ratio, median, lowest and highest shortfall against fp32;
    the bar spans the runs; the dashed line is 1% or 1 point). A format has one colour and
    marker in every panel, and one legend under them all."""
    plt = _pyplot()
    tasks = sorted(curves)
    if not tasks:
        return
    formats = sorted({name for task in tasks for name in curves[task]})
    colours = {name: plt.cm.tab20.colors[i % 20] for i, name in enumerate(formats)}
    markers = {name: "os^D"[i // 20 % 4] for i, name in enumerate(formats)}  # past 20, colours repeat
    columns = min(3, len(tasks))
    rows = -(-len(tasks) // columns)
    legend_rows = -(-len(formats) // 2)
    legend_height = 0.4 + 0.14 * legend_rows  # inches, under the panels
    height = 5.0 * rows + legend_height
    figure, axes = plt.subplots(rows, columns, figsize=(5.5 * columns, height), squeeze=False)
    for axis in axes.flat[len(tasks):]:
        axis.set_visible(False)
    for axis, task in zip(axes.flat, tasks):
        for name, points in sorted(curves[task].items()):
            ratios, medians, lows, highs = zip(*points)
            axis.plot(ratios, medians, marker=markers[name], markersize=4, linewidth=1.2 if len(points) > 1 else 0,
                      color=colours[name], label=name)
            axis.vlines(ratios, lows, highs, color=colours[name], linewidth=0.8, alpha=0.6)
        axis.axhline(0, color="#999", linewidth=0.8)
        axis.axhline(1, color="#c66", linewidth=0.8, linestyle="--")
        for target in (10, 12):
            axis.axvline(target, color="#999", linewidth=0.6, linestyle=":")
        axis.set_title(task)
        axis.set_xlabel("activation bytes, fp32's / the run's")
        axis.set_ylabel("worse than fp32 at the end\n(% more loss, or points less accuracy)")
        axis.grid(alpha=0.3)
    handles = [plt.Line2D([], [], color=colours[name], marker=markers[name], markersize=4) for name in formats]
    figure.legend(handles, formats, loc="lower center", ncol=2, fontsize=7, frameon=False)
    figure.tight_layout(rect=(0, legend_height / height, 1, 1))
    figure.savefig(path, dpi=110)
    plt.close(figure)
