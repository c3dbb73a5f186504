"""The plumbing of ``gact-fx bench --gpu-suite``, on the CPU: a clear refusal without CUDA,
and the same code run small (tiny models, eager compiler) writing its JSON and Markdown."""

import json
import pathlib

import pytest
import torch

from gact_fx.bench import gpu_suite
from gact_fx.cli import main as cli


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible: the suite would run")
def test_without_cuda_it_stops_with_a_clear_message(tmp_path, capsys):
    assert cli(["bench", "--gpu-suite", "--out", str(tmp_path)]) == 2
    message = capsys.readouterr().err
    assert "--gpu-suite measures a CUDA GPU" in message and "sees none" in message
    assert not (tmp_path / "gpu_suite.json").exists()


def test_the_suite_runs_small_on_the_cpu_and_writes_its_results(tmp_path):
    result = gpu_suite.run(tmp_path, device="cpu", scale="tiny", parts=("kernels", "models"),
                           methods=("torch.compile", "gact 2 bit"), compiler="eager", total_seconds=300)
    written = json.loads((tmp_path / "gpu_suite.json").read_text())
    assert written["meta"]["device"].startswith("CPU") and "triton" in written["meta"]
    kernels = written["kernels"]["rows"]
    assert {(r["lowering"], r["op"]) for r in kernels} >= {("op", "quantize"), ("aten", "dequantize"),
                                                            ("-", "copy, new tensor"), ("-", "copy, into a buffer")}
    assert all(r["gbps"] > 0 for r in kernels)
    rows = {(r["model"], r["method"]): r for r in written["models"]}
    assert set(rows) == {(m, method) for m in ("bert-large-like", "resnet50", "llama-like")
                         for method in ("torch.compile", "gact 2 bit")}
    for model in ("bert-large-like", "llama-like"):
        for method in ("torch.compile", "gact 2 bit"):
            row = rows[model, method]
            assert row["error"] is None and row["step_ms"] > 0 and row["compile_s"] > 0, row
    resnet = rows["resnet50", "gact 2 bit"]  # torchvision: on the GPU machine; here it may be absent
    assert resnet["error"] is None or "torchvision" in resnet["error"]
    text = (tmp_path / "gpu_suite.md").read_text()
    assert "| llama-like | gact 2 bit |" in text and result["markdown"] == text
    assert cli(["bench", "--report-only", "--out", str(tmp_path), "--markdown", str(tmp_path / "B.md")]) == 0
    report = (tmp_path / "B.md").read_text()
    assert "## GPU suite" in report and "| bert-large-like | torch.compile |" in report
    assert "No section below was measured on a GPU" in report  # this one ran on the CPU


def test_the_test_summary_reads_pytests_junit_report(tmp_path):
    path = pathlib.Path(tmp_path) / "report.xml"
    path.write_text(
        '<testsuites><testsuite>'
        '<testcase name="a"/><testcase name="b"><skipped/></testcase>'
        '<testcase name="c"><failure message="AssertionError: off by 1e6&#10;detail"/></testcase>'
        '</testsuite></testsuites>'
    )
    summary = gpu_suite._junit_summary(path)
    assert (summary["passed"], summary["skipped"], summary["failed"]) == (1, 1, 1)
    assert summary["failures"] == ["c: AssertionError: off by 1e6"]
