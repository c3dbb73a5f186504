"""The JSON the viewer embeds: per compiled graph its rows, timelines, nodes and edges."""

from __future__ import annotations

from ..report import GraphRecord, Report
from .layout import layout


def _nodes(view, positions, side: str) -> list[dict]:
    return [
        {
            "id": f"{side}:{node.name}",
            "name": node.name,
            "side": side,
            "op": node.op,
            "target": node.target,
            "module": node.module,
            "shape": list(node.shape) if node.shape is not None else None,
            "dtype": node.dtype,
            "bytes": node.nbytes,
            "role": node.role,
            "inputs": [f"{side}:{name}" for name in node.inputs],
            "x": positions[node.name][0],
            "y": positions[node.name][1],
        }
        for node in view.nodes
    ]


def _saved_edges(record: GraphRecord) -> list[dict]:
    """Forward value -> backward placeholder: the edges gact rewrote (and those it kept)."""
    backward_placeholders = {n.name for n in record.backward_view.nodes if n.op == "placeholder"}
    output = next(n for n in record.forward_view.nodes if n.op == "output")
    return [
        {"from": f"forward:{name}", "to": f"backward:{name}"}
        for name in output.inputs
        if name in backward_placeholders
    ]


def graph_data(report: Report, record: GraphRecord, sensitivities: dict[int, float]) -> dict:
    positions = layout(record.forward_view, record.backward_view)
    rows = [
        {
            "name": row.name,
            "label": row.label or row.name,
            "source": row.source,
            "kind": row.kind,
            "producer": row.producer,
            "shape": list(row.shape),
            "dtype": row.dtype,
            "bits": row.bits,
            "stored": row.stored,
            "before": row.bytes_before,
            "after": row.bytes_after,
            "sensitivity": sensitivities.get(row.slot) if row.slot is not None else None,
            "use": row.use or None,
            "why": row.bits_reason or None,
            "groups": row.groups or None,
        }
        for row in sorted(report.rows_of(record), key=lambda r: -r.bytes_before)  # what holds the memory first
    ]
    return {
        "index": record.index,
        "compiler": record.compiler,
        "summary": report.summary_of(record),
        "passes": [run.describe() for run in record.passes],
        "before": record.baseline_activation_bytes,
        "after": report.activation_bytes_after_of(record),
        "rows": rows,
        "timeline": {
            "forwardNodes": len(record.forward_view.nodes),
            "baseline": list(record.baseline_timeline.forward + record.baseline_timeline.backward),
            "gact": list(record.timeline.forward + record.timeline.backward),
        },
        "nodes": _nodes(record.forward_view, positions["forward"], "forward")
        + _nodes(record.backward_view, positions["backward"], "backward"),
        "savedEdges": _saved_edges(record),
    }


def report_data(report: Report, title: str, sensitivities: dict[int, float]) -> dict:
    return {
        "title": title,
        "before": report.activation_bytes_before,
        "after": report.activation_bytes_after,
        "graphs": [graph_data(report, record, sensitivities) for record in report.records if record.forward_view is not None],
    }
