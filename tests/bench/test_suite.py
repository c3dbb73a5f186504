"""gact-fx bench: the quick run CI executes, and the pieces behind it."""

import csv
import json
import pathlib
import subprocess
import sys

import pytest
import torch

from gact_fx.bench import measure, methods, zoo
from gact_fx.bench.markdown import write_markdown


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    done = subprocess.run([sys.executable, "-m", "gact_fx.cli", "bench", "--quick", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.mark.slow
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


@pytest.mark.slow
def test_the_quick_run_trains_and_reports(quick_run):
    accuracy = json.loads((quick_run / "accuracy.json").read_text())
    assert accuracy["results"] and all(r["curve"] and 0 <= r["curve"][-1][1] <= 1 for r in accuracy["results"])
    by = {r["method"]: r for r in accuracy["results"]}  # bits and bytes only where gact ran
    assert by["torch.compile"]["activation_ratio"] is None and by["torch.compile"]["average_bits"] is None
    assert by["gact 8 bit"]["activation_ratio"] > 3 and by["gact 8 bit"]["average_bits"] == 8
    for figure in ("memory_vs_time.png", "accuracy_curves.png"):
        assert (quick_run / figure).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = (quick_run / "BENCHMARKS.md").read_text()
    assert "## Memory, speed and compile time" in report and "## Accuracy on short real training runs" in report
    assert "**cnn (tiny)**" in report and "**gpt2 (tiny)**" in report and "command: `" in report
    assert "15.1x" in report  # the physical limit beside the 2-bit rows: 32 / (2 + 32 / 256)


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


def test_a_sections_note_on_its_conditions_is_printed_under_its_metadata(tmp_path):
    meta = {"device": "CPU: x", "torch": "y", "date": "z", "command": "c", "note": "Taken while another job ran."}
    (tmp_path / "kernels.json").write_text(json.dumps({"meta": meta, "markdown": "| a |"}))
    (tmp_path / "suite.json").write_text(json.dumps({"meta": dict(meta, note=None), "rows": []}))
    text = write_markdown(tmp_path, tmp_path / "B.md", tables={"kernels.json": ("Kernels", "")}).read_text()
    assert "command: `c`*\n\nTaken while another job ran.\n" in text and text.count("Taken while") == 1


@pytest.mark.parametrize("device, says_no_gpu", [("CPU: some cpu, 2 cores", True), ("NVIDIA H100 80GB HBM3", False)])
def test_the_report_says_when_nothing_ran_on_a_gpu(tmp_path, device, says_no_gpu):
    (tmp_path / "suite.json").write_text(json.dumps({"meta": {"device": device, "torch": "y", "date": "z", "command": "c"}, "rows": []}))
    text = write_markdown(tmp_path, tmp_path / "B.md").read_text()
    assert ("No section below was measured on a GPU" in text) == says_no_gpu


@pytest.mark.parametrize("start, limit, threshold", [(8, 100, 10**9), (8, 100, 37), (200, 100, 10**9), (200, 100, 50),
                                                     (1, 1 << 16, 3000), (8, 8, 10**9), (8, 100, 0)])
def test_max_batch_never_tries_or_returns_more_than_the_limit(start, limit, threshold):
    tried = []

    def fits(batch):
        tried.append(batch)
        return batch <= threshold

    found = measure._max_batch(fits, start, limit)
    assert max(tried) <= limit and found <= limit
    best = min(threshold, limit)
    assert best - max(1, best // 32) <= found <= best  # bisection stops within 1/32


def _write(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


META = {"device": "x", "torch": "y", "date": "z", "command": "c"}


def _result(method, final, metric="top-1", **extra):
    return {"task": "t", "method": method, "metric": metric, "curve": [[10, final]], "average_bits": None, **extra}


def test_the_report_links_every_figure_relative_to_where_it_is_written(tmp_path):
    results = tmp_path / "results"
    _write(results / "suite.json", {"meta": META, "rows": []})
    _write(results / "accuracy.json", {"meta": META, "results": [_result("torch.compile", 0.5)]})
    for figure in ("memory_vs_time.png", "max_batch.png", "accuracy_curves.png"):
        (results / figure).write_bytes(b"png")
    text = write_markdown(results, tmp_path / "docs" / "report" / "B.md").read_text()
    for figure in ("memory_vs_time.png", "max_batch.png", "accuracy_curves.png"):
        assert f"(../../results/{figure})" in text
    assert "](benchmarks/" not in text
    (results / "max_batch.png").unlink()  # only figures that exist are linked
    assert "max_batch.png" not in write_markdown(results, results / "BENCHMARKS.md").read_text()


def test_the_report_of_a_shallow_results_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _write(tmp_path / "convergence_t.json", {"meta": META, "results": [_result("fp32", 0.5)]})
    (tmp_path / "convergence_t.png").write_bytes(b"png")
    text = write_markdown(pathlib.Path("."), pathlib.Path("B.md")).read_text()
    assert "## Convergence: t" in text and "![curves](convergence_t.png)" in text


def test_the_accuracy_table_takes_the_metric_direction_from_the_results_and_escapes_cells(tmp_path):
    _write(tmp_path / "accuracy.json", {"meta": META, "results": [
        _result("torch.compile", 0.5, higher_is_better=True), _result("gact | 2 bit", 0.25, higher_is_better=True),
        _result("fp8", 0.5, metric="loss", task="u", higher_is_better=False),
        _result("torch.compile", 2.0, metric="loss", task="u", higher_is_better=False),
        {"task": "u", "method": "broken", "metric": "loss", "curve": [], "error": "ValueError: a|b"},
    ]})
    text = write_markdown(tmp_path, tmp_path / "B.md").read_text()
    assert "**t** (top-1, higher is better)" in text and "| gact \\| 2 bit | 0.2500 | -25.00 pp |" in text
    assert "**u** (loss, lower is better)" in text and "| fp8 | 0.5000 | -75.00% |" in text
    assert "| broken | failed: ValueError: a\\|b | | |" in text


def test_the_convergence_files_metric_direction_comes_from_the_task(tmp_path):
    _write(tmp_path / "convergence_charlm.json", {"meta": META, "results": [
        _result("fp32", 2.0, metric="validation loss", task="char-lm"), _result("L1", 1.0, metric="validation loss", task="char-lm")]})
    text = write_markdown(tmp_path, tmp_path / "B.md").read_text()
    assert "(validation loss, lower is better)" in text and "| L1 | 1.0000 | -50.00% |" in text


def test_methods_choose_the_accuracy_runs_which_are_labelled_cpu(tmp_path, monkeypatch):
    from gact_fx import cli
    from gact_fx.bench import suite

    trained = []

    def run_accuracy(tasks, methods, **kwargs):
        trained.extend(m.name for m in methods)
        return [_result(m.name, 0.5) for m in methods]

    monkeypatch.setattr(suite, "metadata", lambda device="cpu", command=None: {"device": device})
    monkeypatch.setattr(suite, "run_suite", lambda *args, **kwargs: [])
    monkeypatch.setattr(suite, "run_accuracy", run_accuracy)
    for figure in ("memory_vs_time", "max_batch", "curves"):
        monkeypatch.setattr(suite.plots, figure, lambda *args: None)
    assert cli.main(["bench", "--device", "cuda", "--methods", "gact 4 bit", "budget 0.5", "--out", str(tmp_path),
                     "--markdown", str(tmp_path / "elsewhere" / "B.md")]) == 0
    assert trained == ["torch.compile", "gact 4 bit"]
    assert json.loads((tmp_path / "suite.json").read_text())["meta"]["device"] == "cuda"
    assert json.loads((tmp_path / "accuracy.json").read_text())["meta"]["device"] == "cpu"  # training runs on the CPU
    assert (tmp_path / "elsewhere" / "B.md").exists() and not (tmp_path / "BENCHMARKS.md").exists()
    assert suite.accuracy_methods(None, quick=True)[0].name == "torch.compile"


def test_without_out_the_bench_writes_to_a_new_temporary_directory_never_the_checkout(tmp_path, monkeypatch, capsys):
    from gact_fx import cli
    from gact_fx.bench import suite

    written = []
    monkeypatch.chdir(tmp_path)  # where a relative default would land
    monkeypatch.setattr(suite, "main", lambda args: written.append(args.out) or 0)
    monkeypatch.setattr(cli.tempfile, "tempdir", str(tmp_path / "temp"))
    (tmp_path / "temp").mkdir()
    assert cli.main(["bench", "--quick"]) == 0
    assert pathlib.Path(written[0]).parent == tmp_path / "temp" and pathlib.Path(written[0]).is_dir()
    assert cli.main(["bench", "--report-only"]) == 2
    assert "--report-only" in capsys.readouterr().err and len(written) == 1
