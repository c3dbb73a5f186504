"""Renderers: one self-contained HTML page (no CDN), a DOT file, and a terminal summary."""

from __future__ import annotations

import html
import json
import math
from importlib import resources

from ..report import Report, format_bytes
from .data import report_data

_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title><style>{css}</style></head>
<body>
<header><h1 id="title"></h1><div class="totals" id="totals"></div></header>
<nav id="tabs"></nav>
<main>
<section id="timeline"><h2>Activations held for backward, node by node</h2>
<div class="legend"><span><i class="swatch" style="background:#9aa4b5"></i>without gact</span>
<span><i class="swatch" style="background:#e0245e"></i>with gact</span><span id="peaks" class="muted"></span></div>
<svg></svg><div id="graph-summary" class="muted"></div><div id="graph-passes" class="muted"></div></section>
<section><h2>Saved tensors, by the bytes they hold</h2><button id="parameters-toggle"></button>
<div class="table-wrap"><table id="saved-table"></table></div></section>
<section><h2>Forward (top) and backward (bottom) graphs; saved-activation edges in red</h2>
<div class="toolbar"><input id="search" placeholder="search nodes (name, op, module); Enter: next">
<span id="match-count" class="muted"></span><button id="zoom-in">+</button><button id="zoom-out">&minus;</button>
<button id="zoom-fit">fit</button></div>
<div id="graph-area"><div id="modules"></div><div id="canvas"><svg></svg></div>
<div id="details"><p class="muted">Click a node or a table row.</p></div></div></section>
</main>
<script type="application/json" id="gact-data">{data}</script>
<script>{js}</script>
</body></html>
"""


def _asset(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def _finite(value):
    """``value`` with every non-finite float (inf, nan) replaced by None: JSON has no such
    numbers, and the viewer's ``JSON.parse`` rejects Python's ``Infinity`` / ``NaN``."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def render_html(report: Report, *, title: str = "gact-fx", sensitivities: dict[int, float] | None = None) -> str:
    data = _finite(report_data(report, title, sensitivities or {}))
    payload = json.dumps(data, separators=(",", ":"), allow_nan=False)
    payload = payload.replace("</", "<\\/")  # never end the script element early
    return _PAGE.format(title=html.escape(title), css=_asset("viewer.css"), js=_asset("viewer.js"), data=payload)


def _dot_id(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


_ROLE_COLOURS = {"quantize": "#ffe2c2", "mask_bytes": "#ffe2c2", "dequantize": "#d8f3dc", "blob": "#eadcfb", "hoisted_mask": "#fff4b8", "hoisted_exp": "#fff4b8", "hoisted_derivative": "#fff4b8", "replay": "#e2f0ff"}


def render_dot(report: Report) -> str:
    """Graphviz DOT: per compiled graph, forward and backward clusters, modules as sub-clusters."""
    lines = ["digraph gact {", "  rankdir=LR; node [shape=box, style=filled, fillcolor=\"#eef1f6\", fontsize=9];"]
    for record in report.records:
        if record.forward_view is None:
            continue
        for side, view in (("forward", record.forward_view), ("backward", record.backward_view)):
            prefix = f"g{record.index}/{side}/"
            lines.append(f"  subgraph cluster_g{record.index}_{side} {{ label={_dot_id(f'graph {record.index} {side}')};")
            by_module: dict[str, list] = {}
            for node in view.nodes:
                by_module.setdefault(node.module.split(".")[0] if node.module else "", []).append(node)
            for index, (module, nodes) in enumerate(by_module.items()):
                if module:
                    lines.append(f"    subgraph cluster_g{record.index}_{side}_{index} {{ label={_dot_id(module)};")
                for node in nodes:
                    label = node.name if node.op == "placeholder" else f"{node.name}\\n{node.target}"
                    colour = _ROLE_COLOURS.get(node.role or "", "#eef1f6")
                    lines.append(f"      {_dot_id(prefix + node.name)} [label={_dot_id(label)}, fillcolor={_dot_id(colour)}];")
                if module:
                    lines.append("    }")
            for node in view.nodes:
                for source in node.inputs:
                    lines.append(f"    {_dot_id(prefix + source)} -> {_dot_id(prefix + node.name)};")
            lines.append("  }")
        backward_inputs = {n.name for n in record.backward_view.nodes if n.op == "placeholder"}
        output = next(n for n in record.forward_view.nodes if n.op == "output")
        for name in output.inputs:
            if name in backward_inputs:
                lines.append(
                    f"  {_dot_id(f'g{record.index}/forward/{name}')} -> {_dot_id(f'g{record.index}/backward/{name}')}"
                    " [color=\"#e0245e\", penwidth=2, constraint=false];"
                )
    lines.append("}")
    return "\n".join(lines) + "\n"


def render_text(report: Report) -> str:
    """The report's table plus, per graph, the peak bytes held for backward."""
    lines = [report.table()]
    for record in report.records:
        if record.timeline is not None:
            lines.append(
                f"graph {record.index}: peak held for backward {format_bytes(record.baseline_timeline.peak)} without gact, "
                f"{format_bytes(record.timeline.peak)} with gact"
            )
        if record.passes:
            lines.append(f"graph {record.index} passes: " + "; ".join(run.describe() for run in record.passes))
    return "\n".join(lines) + "\n"
