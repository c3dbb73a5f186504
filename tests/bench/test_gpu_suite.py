"""The plumbing of ``gact-fx bench --gpu-suite``, on the CPU: a clear refusal without CUDA,
and a dry run of the same code, small (tiny models, the eager compiler), in which a part
that outlives its limit is interrupted and the suite still reports everything else.
(The Triton kernels' own rehearsal on the CPU is ``tests/runtime/test_cuda_path.py``.)"""

import json

import pytest
import torch

from gact_fx.bench import gpu_suite, pytest_shards
from gact_fx.cli import main as cli
from gact_fx.runtime.program_sizes import own_sizes_text

SLOW_TESTS = """
import time

def test_quick():
    pass

def test_outlives_its_limit():
    time.sleep(120)
"""

QUICK_TESTS = """
import pytest

@pytest.mark.parametrize("n", range(5))
def test_quick(n):
    pass

def test_fails():
    assert False, "on purpose"
"""


@pytest.mark.slow
def test_the_tests_part_in_shards_runs_every_test_once_and_adds_up_their_reports(tmp_path):
    tests = tmp_path / "quick" / "test_quick.py"
    tests.parent.mkdir()
    tests.write_text(QUICK_TESTS)
    selection = [str(tests), "--rootdir", str(tests.parent)]
    sharded = gpu_suite.run_tests(tmp_path, 60, selection, shards=3)
    assert (sharded["passed"], sharded["failed"], sharded["shards"]) == (5, 1, 3)
    assert sharded["status"] == "pytest exit code 1"
    assert sharded["failures"] == ["test_fails: AssertionError: on purpose"]
    assert sorted(p.name for p in tmp_path.glob("gpu_tests*.xml")) == [f"gpu_tests.{i}.xml" for i in range(3)]
    whole = gpu_suite.run_tests(tmp_path, 60, [*selection, "-k", "not fails"])  # one process; earlier reports removed
    assert (whole["passed"], whole["failed"], whole["status"]) == (5, 0, "passed")
    assert [p.name for p in tmp_path.glob("gpu_tests*.xml")] == ["gpu_tests.xml"]
    spare = gpu_suite.run_tests(tmp_path, 60, [*selection, "-k", "not fails"], shards=6)  # a shard with no test is no failure
    assert (spare["passed"], spare["status"]) == (5, "passed")


def test_the_kernel_table_says_what_was_compiled_ahead_and_what_still_compiled_while_timing():
    kernels = {"rows": [], "precompile": {"launches": 95, "failed": 1, "failures": ["decode: boom"], "unfinished": 3,
                                          "workers": 15, "seconds": 31.5, "compiled_later": 2}}
    text = "\n".join(gpu_suite.kernels_markdown(kernels))
    assert ("Compiled ahead: 95 kernel variants in 31.5 s on 15 processes (1 failed, 3 unfinished at its limit); "
            "kernels Triton still compiled while timing, the triton_op probe's included: 2") in text
    assert "- failed: decode: boom" in text


def test_compiled_kernels_are_counted_in_tritons_cache_and_its_other_entries_are_not(tmp_path):
    for name, files in {"a": ["k.cubin", "k.json"], "b": ["k.cubin"], "launcher": ["__triton_launcher.so"]}.items():
        (tmp_path / name).mkdir()
        for file in files:
            (tmp_path / name / file).write_text("")
    assert gpu_suite._triton_kernels_cached(tmp_path) == 2
    assert gpu_suite._triton_kernels_cached(tmp_path / "absent") is None


def test_a_shard_is_named_i_of_k():
    assert pytest_shards.parse("2/6") == (2, 6)
    for wrong in ("6/6", "1", "a/b", "-1/2"):
        with pytest.raises(ValueError, match="GACT_TEST_SHARD"):
            pytest_shards.parse(wrong)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible: the suite would run")
def test_without_cuda_it_stops_with_a_clear_message(tmp_path, capsys):
    assert cli(["bench", "--gpu-suite", "--out", str(tmp_path)]) == 2
    message = capsys.readouterr().err
    assert "--gpu-suite measures a CUDA GPU" in message and "sees none" in message
    assert not (tmp_path / "gpu_suite.json").exists()


@pytest.mark.slow
def test_a_dry_run_reports_every_part_even_when_one_outlives_its_limit(tmp_path):
    tests = tmp_path / "slow" / "test_slow.py"
    tests.parent.mkdir()
    tests.write_text(SLOW_TESTS)
    out = tmp_path / "out"
    result = gpu_suite.run(out, device="cpu", scale="tiny", compiler="eager",
                           budget={"tests": 10, "kernels": 120, "models": 240},  # tests: time to start pytest and run the quick test
                           test_selection=[str(tests), "--rootdir", str(tests.parent)])
    written = json.loads((out / "gpu_suite.json").read_text())
    assert written == json.loads(json.dumps(result, default=str))
    assert written["meta"]["device"].startswith("CPU") and "triton" in written["meta"] and "commit" in written["meta"]
    # the tests part: interrupted at its limit, and pytest's own report of what ran survives
    assert written["tests"]["status"].startswith("interrupted")
    assert (written["tests"]["passed"], written["tests"]["interrupted"]) == (1, 1)
    kernels = written["kernels"]
    assert kernels["ended"] == "finished" and kernels["complete"]
    assert {(r["dtype"], r["bits"], r["op"]) for r in kernels["rows"]} >= {
        ("float32", bits, op) for bits in (1, 2, 3, 4, 8) for op in ("quantize", "dequantize")}
    assert all(r["gbps"] > 0 for r in kernels["rows"])
    assert kernels["triton_op"] == {"status": "not run: needs a CUDA GPU"}
    assert "precompile" not in kernels  # the interpreter's kernels do not compile
    swept = "/".join(map(str, gpu_suite.PROGRAM_SWEEP[-1]))  # the sweep's rows, told apart from the kernels' own
    assert {r["program"] for r in kernels["rows"]} == {None, swept}
    models = written["models"]
    rows = {(r["model"], r["method"]): r for r in models["rows"]}
    assert set(rows) >= {(m, method) for m in ("llama-like", "resnet50") for method in gpu_suite.METHODS}
    assert list(rows) == list(gpu_suite.PLAN)  # in order of importance, as they ran
    for lowered in [method for _, method in gpu_suite.PLAN if "Triton lowering" in method]:
        assert "lowering='triton' launches gact's Triton kernels" in rows["llama-like", lowered]["error"]
    graphs = rows["llama-like", "gact 2 bit, CUDA graphs"]  # (on the CPU torch skips the graphs)
    assert graphs["error"] is None and graphs["activation_mib"] < 0.5 * rows["llama-like", "torch.compile"]["activation_mib"]
    for method in gpu_suite.METHODS:
        row = rows["llama-like", method]
        assert row["error"] is None and row["step_ms"] > 0 and row["compile_s"] > 0 and row["activation_mib"] > 0, row
        assert row["host_ms"] > 0 and row["device_ms"] is None  # the profiler's step: no kernels off CUDA
    assert rows["llama-like", "gact 2 bit"]["activation_mib"] < 0.5 * rows["llama-like", "torch.compile"]["activation_mib"]
    resnet = rows["resnet50", "gact 2 bit"]  # torchvision: on the GPU machine; here it may be absent
    assert resnet["error"] is None or "torchvision" in resnet["error"]
    text = (out / "gpu_suite.md").read_text()
    assert text == written["markdown"]
    assert "**GPU tests**" in text and "interrupted" in text and "| llama-like | gact 2 bit |" in text
    # CUDA-graph rows compare with torch.compile under CUDA graphs
    graphs_line = next(line for line in text.splitlines() if line.startswith("| llama-like | gact 2 bit, CUDA graphs |"))
    ratio = graphs["step_ms"] / rows["llama-like", "torch.compile, CUDA graphs"]["step_ms"]
    assert f"| {ratio:.2f}x |" in graphs_line
    assert f"| float32 | 2 | {swept} |" in text and "| float32 | 2 | own |" in text
    assert "triton_op probe: not run: needs a CUDA GPU" in text
    assert all(row["seconds"] > 0 for row in models["rows"] if row["error"] is None)
    assert models["program"] is None  # the models run at the kernels' own sizes, as training does
    assert all(r["elements"] for r in kernels["rows"] if r["bits"] != "copy")  # each row names its kernel's size
    assert kernels["own_elements"] == own_sizes_text()
    fastest = gpu_suite.fastest_elements_text(kernels["rows"])
    assert f"(16-bit inputs below 8 bits or feature-major / the rest): {fastest}; the kernels' own: {own_sizes_text()}" in text
    assert cli(["bench", "--report-only", "--out", str(out), "--markdown", str(tmp_path / "B.md")]) == 0
    report = (tmp_path / "B.md").read_text()
    assert "## GPU suite" in report and "| llama-like | torch.compile |" in report
    assert "No section below was measured on a GPU" in report  # this one ran on the CPU


def _row(dtype, bits, op, gbps, elements, graph_gbps=None, program="swept"):
    return dict(dtype=dtype, bits=bits, lowering="op", op=op, gbps=gbps, program=program, elements=elements,
                graph_gbps=graph_gbps)


def test_the_fastest_block_sizes_from_the_kernel_rows():
    rows = [dict(dtype="bfloat16", bits="copy", lowering="-", op="copy, new tensor", gbps=3000.0, program=None)]
    speeds = {8192: (500.0, 500.0, 1500.0), 4096: (900.0, 500.0, 1400.0), 2048: (800.0, 2000.0, 1300.0)}
    for elements, (bf16_quantize, bf16_dequantize, fp32) in speeds.items():
        for bits in (4, 2):
            rows += [_row("bfloat16", bits, "quantize", bf16_quantize, elements),
                     _row("bfloat16", bits, "dequantize", bf16_dequantize, elements),
                     _row("float32", bits, "quantize", fp32, elements)]
    rows.append(_row("bfloat16", 8, "quantize", 1e6, 8192))  # a cell only one size measured: not compared
    rows.append(_row("float32", 2, "dequantize", 1e6, 2048))  # a kernel measured at one size: left out
    # each kernel by its kind: a 16-bit quantize below 8 bits narrow, fp32 wide; a contiguous
    # decode wide whatever it writes (it holds fp32 values), so both dtypes' rows count for it
    fastest = gpu_suite.fastest_elements(rows)
    assert fastest == {("quantize", "narrow"): 4096, ("dequantize", "wide"): 2048, ("quantize", "wide"): 8192}
    # a CUDA-graph replay's speed, where there is one, decides over the eager call's
    rows.append(_row("float32", 2, "quantize", 1.0, 2048, graph_gbps=1e6))
    assert gpu_suite.fastest_elements(rows)[("quantize", "wide")] == 2048
    assert gpu_suite.fastest_elements_text(rows).startswith("quantize 4096/2048, dequantize 2048, quantize, feature groups -/-")
    # a row made before rows named their size: its sweep's size for that kernel
    older = _row("bfloat16", 2, "quantize", 1.0, None, program="4096/2048")
    assert gpu_suite._row_elements(older) == 4096
    assert gpu_suite._row_elements(dict(older, op="dequantize")) == 2048  # the decode holds fp32 values
    assert gpu_suite._row_elements(dict(older, program=None)) is None  # the kernels' own then: not known now


def test_the_triton_op_probe_reports_what_it_found():
    from gact_fx.bench.triton_op_probe import probe_markdown

    found = {"status": "ran", "numel": 65536, "bits": 2, "eager_same_blob": True,
             "inductor_error": "TorchRuntimeError: fake tensor", "host_us": {"Triton launch": 12.0, "gact::quantize": 20.5}}
    line = probe_markdown(found)[0]
    assert "eager: same blob" in line and "Inductor: TorchRuntimeError: fake tensor" in line
    assert "Triton launch 12.0 us, gact::quantize 20.5 us" in line


def test_a_part_that_dies_is_reported_with_its_output(tmp_path):
    ran = gpu_suite.run_limited(["python3", "-c", "import sys; print('boom'); sys.exit(3)"], 10)
    assert ran["ended"] == "finished" and ran["returncode"] == 3 and ran["output_tail"] == ["boom"]


def test_the_test_summary_reads_pytests_junit_report(tmp_path):
    path = tmp_path / "report.xml"
    path.write_text(
        '<testsuites><testsuite>'
        '<testcase name="a"/><testcase name="b"><skipped/></testcase>'
        '<testcase name="c"><failure message="AssertionError: off by 1e6&#10;detail"/></testcase>'
        '</testsuite></testsuites>'
    )
    summary = gpu_suite.junit_summary(path)
    assert (summary["passed"], summary["skipped"], summary["failed"]) == (1, 1, 1)
    assert summary["failures"] == ["c: AssertionError: off by 1e6"]


def test_the_tests_part_runs_the_tests_of_the_working_directory(tmp_path, monkeypatch):
    repository = gpu_suite.tests_directory()
    assert repository is not None and (repository / "conftest.py").exists()  # the suite runs from the checkout's root
    monkeypatch.chdir(tmp_path)
    assert gpu_suite.tests_directory() is None
    assert gpu_suite.run_tests(tmp_path, 10)["status"].startswith("not run: no tests/ in the working directory")


class _Widening(torch.nn.Module):
    """A block whose shape differs from instance to instance, as ResNet's bottlenecks do."""

    def __init__(self, width: int):
        super().__init__()
        self.linear = torch.nn.Linear(width, width + 1)

    def forward(self, x):
        return torch.relu(self.linear(x))


def test_a_model_with_more_block_shapes_than_dynamos_default_limit_compiles_every_block():
    from torch._dynamo.utils import counters

    from gact_fx.bench.gpu_workloads import GpuWorkload, measure
    from gact_fx.bench.methods import ALL

    widths = range(4, 14)  # 10 shapes, past Dynamo's default of 8 compiles a code object
    workload = GpuWorkload("widening", lambda: torch.nn.Sequential(*(_Widening(w) for w in widths)),
                           lambda model: list(model), lambda batch: (torch.randn(batch, widths[0]),), 2)
    counters.clear()
    row = measure(workload, ALL["gact 2 bit"], workload.build(), device="cpu", compiler="eager", steps=1,
                  deadline=float("inf"))
    assert row.error is None and row.step_ms > 0
    assert counters["stats"]["unique_graphs"] >= len(widths)  # none fell back to eager


def test_a_cuda_graph_method_compiles_its_regions_in_reduce_overhead_mode(caplog):
    from gact_fx.bench.gpu_workloads import GpuWorkload, _Runner
    from gact_fx.bench.methods import GPU_METHODS

    workload = GpuWorkload("widening", lambda: torch.nn.Sequential(_Widening(4)), lambda model: list(model),
                           lambda batch: (torch.randn(batch, 4),), 2)
    runner = _Runner(workload, GPU_METHODS["gact 2 bit, CUDA graphs"], workload.build(), "cpu", "eager")
    with caplog.at_level("WARNING", logger="gact_fx"):
        runner.step(workload.batch(2))
    assert "mode='reduce-overhead' has no effect with compiler='eager'" in caplog.text  # the mode reached gact
    assert GPU_METHODS["gact 2 bit, CUDA graphs"].baseline == "torch.compile, CUDA graphs"
