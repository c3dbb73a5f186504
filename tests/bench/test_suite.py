"""gact-fx bench: the quick run CI executes, and the pieces behind it."""

import csv
import json
import subprocess
import sys

import pytest
import torch

from gact_fx.bench import methods, zoo
from gact_fx.bench.markdown import write_markdown


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    done = subprocess.run([sys.executable, "-m", "gact_fx.cli", "bench", "--quick", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def test_the_quick_run_measures_every_model_and_method(quick_run):
    data = json.loads((quick_run / "suite.json").read_text())
    assert {"device", "torch", "date", "command"} <= set(data["meta"]) and data["meta"]["quick"] is True
    rows = data["rows"]
    assert {(r["model"], r["method"]) for r in rows} == {(m, n) for m in ("cnn", "gpt2") for n in methods.QUICK}
    for row in rows:
        assert row["error"] is None, row
        assert row["saved_bytes"] > 0 and row["step_ms"] > 0 and row["compile_s"] > 0 and row["peak_bytes"] > 0
    by = {(r["model"], r["method"]): r for r in rows}
    for model in ("cnn", "gpt2"):  # compression saves bytes, and 2 bits more than 8
        assert by[(model, "gact 2 bit")]["saved_bytes"] < by[(model, "gact 8 bit")]["saved_bytes"] < by[(model, "torch.compile")]["saved_bytes"]
    with open(quick_run / "suite.csv") as file:
        assert len(list(csv.DictReader(file))) == len(rows)


def test_the_quick_run_trains_and_reports(quick_run):
    accuracy = json.loads((quick_run / "accuracy.json").read_text())
    assert accuracy["results"] and all(r["curve"] and 0 <= r["curve"][-1][1] <= 1 for r in accuracy["results"])
    for figure in ("memory_vs_time.png", "accuracy_curves.png"):
        assert (quick_run / figure).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = (quick_run / "BENCHMARKS.md").read_text()
    assert "## Memory, speed and compile time" in report and "## Accuracy on short real training runs" in report
    assert "**cnn (tiny)**" in report and "**gpt2 (tiny)**" in report and "command: `" in report
    assert "14.2x" in report  # the physical limit beside the 2-bit rows


@pytest.mark.parametrize("name", sorted(zoo.ZOO))
def test_every_zoo_model_builds_and_runs_tiny(name):
    workload = zoo.build(name, "tiny")
    output = workload.model(*workload.batch(2))
    assert torch.isfinite(workload.loss(output))


def test_method_selection():
    chosen = methods.select(["gact 2 bit"], quick=False)
    assert [m.name for m in chosen] == ["torch.compile", "gact 2 bit"]  # the baseline is always there
    with pytest.raises(ValueError, match="unknown method"):
        methods.select(["gact 3 bit"], quick=False)


def test_a_failed_measurement_is_a_table_row(tmp_path):
    (tmp_path / "suite.json").write_text(json.dumps({"meta": {"device": "x", "torch": "y", "date": "z", "command": "c"}, "rows": [
        {"model": "m", "size": "tiny", "method": "torch.compile", "batch": 1, "compile_s": 1.0, "step_ms": 2.0,
         "saved_bytes": 100, "peak_bytes": 200, "max_batch": None, "bits": None, "error": None},
        {"model": "m", "size": "tiny", "method": "checkpoint", "batch": 1, "compile_s": None, "step_ms": None,
         "saved_bytes": None, "peak_bytes": None, "max_batch": None, "bits": None, "error": "n/a: no checkpointing"},
    ]}))
    text = write_markdown(tmp_path, tmp_path / "B.md").read_text()
    assert "| checkpoint | failed: n/a: no checkpointing |" in text and "| torch.compile | 100 B | baseline |" in text
