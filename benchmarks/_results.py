"""Where the benchmark scripts keep their results (read by ``gact-fx bench``'s report)."""

from __future__ import annotations

import json
import pathlib

RESULTS = pathlib.Path(__file__).resolve().parent / "results"

def save_table(name: str, markdown: str, device: str = "cpu", **extra) -> pathlib.Path:
    """Write ``benchmarks/results/<name>.json``: the table and where it was measured."""
    from gact_fx.bench.metadata import metadata

    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"meta": metadata(device), "markdown": markdown, **extra}, indent=1))
    return path
