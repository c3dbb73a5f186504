"""``gact-fx bench --gpu-suite --out DIR``: every GPU measurement in one command, in under 7 minutes.

Made for the GPU machine this project is sometimes lent for a few minutes (an H100 or H200
with torch 2.11 + CUDA, Triton, torchvision and transformers, no network), with the
project installed by ``pip install --no-deps --no-build-isolation -e .``. Three parts,
each a process of its own with a hard time limit (``BUDGET``); at its limit a part is
interrupted (SIGINT, so pytest still writes its report), then killed. Each part writes
its results as it goes, so a part that fails or runs out of time costs only itself:

1. tests: the GPU tests (``pytest -m gpu`` on ``tests/test_gpu.py`` of the checkout it is run from),
   as several pytest processes at once, each a shard of the tests (``bench.pytest_shards``):
   their time is mostly compiling, on one CPU core each;
2. kernels: every kernel variant the part launches compiled ahead, in parallel
   (``runtime.warm_cache``); then quantize and dequantize GB/s per width and dtype, against a
   device copy, eager and replayed in a CUDA graph, then whether the quantize works as a
   ``torch.library.triton_op`` (``bench.triton_op_probe``), then a sweep of the kernels'
   block sizes;
3. models: step time (and its device and host time under the profiler), peak memory,
   activation bytes and predicted max batch of a 0.4B Llama-like transformer and
   ResNet-50 under bf16 autocast: torch.compile against
   gact at 2 and 4 bits and at L2.2 (``bench.gpu_workloads``), at the kernels' own block
   sizes (``runtime.program_sizes``): what training runs. The kernels part names the sizes
   its sweep found fastest for each kernel (``fastest_elements``), and
   ``benchmarks/gpu_step_profile.py`` times the step at the sizes before the kernels' own.

It ends with one summary block (``gpu_suite.md``, printed) and ``gpu_suite.json``;
``gact-fx bench --report-only`` (or a checkout's ``benchmarks/report.py``) folds the JSON into a report. ``scale="tiny"``,
``device="cpu"`` run the same plumbing small on a CPU (the test suite's dry run). Without
CUDA the full suite stops at once with a message that says so.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import logging
import math
import os
import pathlib
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree

import torch

log = logging.getLogger("gact_fx.bench")

PARTS = ("tests", "kernels", "models")
BUDGET = {"tests": 80.0, "kernels": 90.0, "models": 210.0}  # seconds: 380 in all, under 7 minutes with start-up
INTERRUPT_GRACE = 15.0  # seconds a part has after SIGINT to write what it has
METHODS = ("torch.compile", "gact 4 bit", "gact 2 bit", "gact L2.2 (adaptive 2)")
# The models part's (model, method) runs in order of importance: a row takes 20-100 s on an
# H100 (its compiles; ResNet-50's most), so the last may not fit. Each model against gact at
# 2 bits first (issue 32's target: within 1.10x of torch.compile's step on a transformer),
# with less host work too (the step waits on the host otherwise): its kernels launched by
# Inductor, then CUDA graphs, then both; then 4 bits, and the default, 3 bits dithered with
# attention's value rebuilt (its decode's hash, the QKV projection again in the backward),
# with the ops and with its kernels launched by Inductor;
# then 3 bits dithered alone and with query and key at 4 bits debiased (two attention
# backwards more a layer); then ResNet-50 (its compile alone takes 80 s); L2.2.
PLAN = (("llama-like", "torch.compile"), ("llama-like", "gact 2 bit"), ("llama-like", "gact 2 bit, Triton lowering"),
        ("llama-like", "torch.compile, CUDA graphs"), ("llama-like", "gact 2 bit, CUDA graphs"),
        ("llama-like", "gact 2 bit, Triton lowering, CUDA graphs"),
        ("llama-like", "gact 4 bit"), ("llama-like", "gact 3 bit, dithered, projections rebuilt"),
        ("llama-like", "gact 3 bit, dithered, projections rebuilt, Triton lowering"),
        ("llama-like", "gact 3 bit, dithered"), ("llama-like", "gact 3 bit, dithered, q/k 4 debiased"),
        ("resnet50", "torch.compile"), ("resnet50", "gact 2 bit"), ("resnet50", "gact 4 bit"),
        ("llama-like", "gact L2.2 (adaptive 2)"), ("resnet50", "gact L2.2 (adaptive 2)"))
GPU_TESTS = ["-m", "gpu"]
TEST_SHARDS = 6  # pytest processes at once in the tests part, where the cores allow (two each)
NO_TESTS_COLLECTED = 5  # pytest's exit code, for a shard left with no test
GPU_TEST_FILE = "test_gpu.py"  # collecting the whole suite would import every integration first
# The kernels part's sweep of block sizes (elements a program: 16-bit inputs / the others), after
# the kernels' own: the sizes every kernel took before each took its own, and smaller ones.
PROGRAM_SWEEP = ((16384, 8192), (4096, 2048))


class NoGpu(SystemExit):
    """Raised, with the reason as its message, when the suite cannot run here."""


def require_cuda() -> None:
    if not torch.cuda.is_available():
        cuda = torch.version.cuda or "none (a CPU build)"
        raise NoGpu(
            f"gact-fx bench --gpu-suite measures a CUDA GPU, and torch {torch.__version__} sees none here "
            f"(torch.cuda.is_available() is False; CUDA in this build: {cuda}). Run it on the GPU machine; "
            "for CPU numbers use `gact-fx bench`."
        )


def _write_json(path: pathlib.Path, data) -> None:
    """Write whole or not at all: a part killed mid-write leaves the previous version."""
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(data, indent=1, default=str))
    os.replace(partial, path)


# -- running a part under a hard limit ------------------------------------------------------


def _hear_sigint() -> None:
    """In the child: take SIGINT's default action. A shell starts a background job with
    SIGINT ignored, its children inherit that, and a Python started so never raises
    KeyboardInterrupt: pytest would then be killed at its limit without its report."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_limited(command: list[str], seconds: float, *, cwd: pathlib.Path | None = None,
                env: dict[str, str] | None = None) -> dict:
    """Run ``command``; at ``seconds`` interrupt it (SIGINT), and kill it if it is still alive
    ``INTERRUPT_GRACE`` later. Returns how it ended and its output's last lines."""
    started = time.monotonic()
    process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               preexec_fn=_hear_sigint if os.name == "posix" else None)
    ended = "finished"
    try:
        output, _ = process.communicate(timeout=max(seconds, 1.0))
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGINT)
        ended = f"interrupted at its limit of {seconds:.0f} s"
        try:
            output, _ = process.communicate(timeout=INTERRUPT_GRACE)
        except subprocess.TimeoutExpired:
            process.kill()
            output, _ = process.communicate()
            ended = f"killed at its limit of {seconds:.0f} s"
    tail = [line for line in (output or "").splitlines() if line.strip()][-12:]
    return {"ended": ended, "returncode": process.returncode, "seconds": round(time.monotonic() - started, 1),
            "output_tail": tail}


def tests_directory() -> pathlib.Path | None:
    """``tests/`` of the checkout the suite is run from (the working directory), if it has one."""
    candidate = pathlib.Path.cwd() / "tests"
    return candidate if (candidate / "conftest.py").exists() else None


def default_test_shards() -> int:
    """How many pytest processes the tests part runs at once here: two cores each, at most ``TEST_SHARDS``."""
    return max(1, min(TEST_SHARDS, (os.cpu_count() or 1) // 2))


def run_tests(out: pathlib.Path, seconds: float, selection: list[str] | None = None, shards: int = 1) -> dict:
    """pytest on the GPU tests (or ``selection``) in ``shards`` processes at once, each under
    the same limit; their junit reports read back and added up, even if interrupted."""
    for stale in out.glob("gpu_tests*.xml"):
        stale.unlink()
    if selection is None:
        tests = tests_directory()
        if tests is None:
            return {"status": "not run: no tests/ in the working directory (run the suite from a checkout)"}
        selection = [*GPU_TESTS, str(tests / GPU_TEST_FILE)]
    from .pytest_shards import VARIABLE

    reports = [out / ("gpu_tests.xml" if shards == 1 else f"gpu_tests.{index}.xml") for index in range(shards)]
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "gact_fx.bench.pytest_shards"]
    jobs = [([*command, f"--junitxml={report}", *selection],
             {**os.environ, VARIABLE: f"{index}/{shards}"} if shards > 1 else None)
            for index, report in enumerate(reports)]
    log.info("gpu suite: %s (%d shards)", " ".join(jobs[0][0]), shards)
    with concurrent.futures.ThreadPoolExecutor(shards) as pool:
        runs = list(pool.map(lambda job: run_limited(job[0], seconds, env=job[1]), jobs))
    summary = _added([junit_summary(report) for report in reports if report.exists()])
    codes = [ran["returncode"] for ran in runs]
    unfinished = [ran["ended"] for ran in runs if ran["ended"] != "finished"]
    failing = [code for code in codes if code not in (0, NO_TESTS_COLLECTED)]
    if unfinished:
        status = unfinished[0]
    elif failing or 0 not in codes:
        status = f"pytest exit code {(failing or codes)[0]}"
    else:
        status = "passed"
    shown = next((ran for ran in runs if ran["returncode"] not in (0, NO_TESTS_COLLECTED)), runs[0])
    return {"status": status, "seconds": max(ran["seconds"] for ran in runs), "shards": shards, **summary,
            "output_tail": shown["output_tail"][-3:]}


def _added(summaries: list[dict]) -> dict:
    """Shards' junit summaries as one: counts added, failures and report errors listed."""
    if not summaries:
        return {}
    total: dict = {key: sum(s.get(key, 0) for s in summaries) for key in ("passed", "failed", "skipped", "interrupted")}
    total["failures"] = [failure for s in summaries for failure in s.get("failures", [])]
    errors = [s["report_error"] for s in summaries if "report_error" in s]
    return total | ({"report_error": "; ".join(errors)} if errors else {})


def junit_summary(path: pathlib.Path) -> dict:
    try:
        root = ElementTree.parse(path).getroot()
    except ElementTree.ParseError as error:
        return {"report_error": str(error)}
    failures = []
    counts = {"passed": 0, "failed": 0, "skipped": 0, "interrupted": 0}
    for case in root.iter("testcase"):
        if case.get("name") is None:  # the test running when pytest was interrupted
            counts["interrupted"] += 1
            continue
        problem = case.find("failure") if case.find("failure") is not None else case.find("error")
        if problem is not None:
            counts["failed"] += 1
            message = (problem.get("message") or "").splitlines()[:1]
            failures.append(f"{case.get('name')}: {message[0] if message else ''}"[:300])
        elif case.find("skipped") is not None:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    return {**counts, "failures": failures}


def run_part(part: str, out: pathlib.Path, seconds: float, *, device: str, scale: str, compiler: str,
             program: tuple[int, int] | None = None) -> dict:
    """A measuring part in a process of its own; what it wrote (``part_<name>.json``), and how it ended.
    ``program``: the Triton kernels' elements a program (16-bit inputs, the others) for its launches."""
    command = [sys.executable, "-m", "gact_fx.bench.gpu_suite", "--part", part, "--out", str(out),
               "--seconds", f"{seconds:.1f}", "--device", device, "--scale", scale, "--compiler", compiler]
    if program is not None:
        command += ["--program", "/".join(map(str, program))]
    path = out / f"part_{part}.json"
    path.unlink(missing_ok=True)
    ran = run_limited(command, seconds + INTERRUPT_GRACE)  # the part keeps its own deadline; this is the backstop
    result = json.loads(path.read_text()) if path.exists() else {}
    failed = ran["ended"] == "finished" and ran["returncode"] != 0
    result["ended"] = f"exit code {ran['returncode']}" if failed else ran["ended"]
    result["seconds"] = ran["seconds"]
    if ran["returncode"] != 0:
        result["output_tail"] = ran["output_tail"]
    return result


def _row_kernel(row: dict) -> tuple[str, str]:
    """A kernel-table row's kernel as ``OWN_ELEMENTS_PER_PROGRAM`` keys it: (op, ``program_kind``)."""
    from ..runtime.program_sizes import program_kind, role_flags

    return row["op"], program_kind(4 if row["dtype"] == "float32" else 2, row["bits"], **role_flags(row["op"]))


def _row_elements(row: dict) -> int | None:
    """The elements a program a kernel-table row's op ran at: recorded in the row, or (rows
    made before it was) its sweep's size for the kernel's kind (None: the kernels' own then)."""
    if row.get("elements"):
        return row["elements"]
    if not row.get("program"):
        return None
    narrow, wide = (int(n) for n in row["program"].split("/"))
    return narrow if _row_kernel(row)[1] == "narrow" else wide


def fastest_elements(rows: list[dict]) -> dict[tuple[str, str], int]:
    """For each kernel (its op and ``program_kind``), the elements a program at which the
    kernels part's ``rows`` ran it fastest: by the geometric mean of their speed (a
    CUDA-graph replay's where there is one) over the cells (dtype, bits) every size
    measured. A kernel measured at one size, or at sizes with no cell in common, is left out."""
    speeds: dict[tuple[str, str], dict[int, dict[tuple, float]]] = {}
    for row in rows:
        if row["bits"] == "copy" or row.get("lowering", "op") != "op":
            continue
        elements = _row_elements(row)
        speed = row.get("graph_gbps") or row["gbps"]
        if elements and speed and speed > 0:
            speeds.setdefault(_row_kernel(row), {}).setdefault(elements, {})[(row["dtype"], row["bits"])] = speed
    fastest = {}
    for kernel, measured in speeds.items():
        common = set.intersection(*(set(cells) for cells in measured.values()))
        if len(measured) < 2 or not common:
            continue

        def score(elements: int) -> float:
            return sum(math.log(measured[elements][cell]) for cell in common) / len(common)

        fastest[kernel] = max(measured, key=score)
    return fastest


def fastest_elements_text(rows: list[dict]) -> str:
    """``fastest_elements`` in the order and shape of ``program_sizes.own_sizes_text`` ("-"
    where nothing compared)."""
    from ..runtime.program_sizes import sizes_text

    return sizes_text(fastest_elements(rows))


# -- the parts, each in its own process -------------------------------------------------------


def _kernels_part(out: pathlib.Path, deadline: float, device: str, scale: str) -> None:
    """The kernels' own block sizes at every width (bf16 and fp32 first), then the
    ``triton_op`` probe, then the sweep of ``PROGRAM_SWEEP`` at 4 and 2 bits, then fp16: the
    most telling first (most of the part's time is Triton compiling each new variant)."""
    from .kernels import kernel_table
    from .triton_op_probe import probe

    full = scale == "full"
    numel, repeats = (1 << 26, 20) if full else (1 << 12, 2)
    first = (torch.bfloat16, torch.float32) if full else (torch.float32,)
    tables = [dict(dtypes=first, widths=(2, 4, 8, 3, 1))]
    tables += [dict(dtypes=first, widths=(4, 2) if full else (2,), program=program)
               for program in (PROGRAM_SWEEP if full else PROGRAM_SWEEP[-1:])]
    tables.append(dict(dtypes=(torch.float16,) if full else (torch.bfloat16,), widths=(2, 4, 8, 3, 1)))
    from ..runtime.program_sizes import own_sizes_text

    result = {"numel": numel, "repeats": repeats, "own_elements": own_sizes_text(), "rows": []}
    if device == "cuda":  # at most half the part: the rest compiles at first launch, as before
        result["precompile"] = _precompile(tables, limit_s=(deadline - time.monotonic()) / 2)
        _write_json(out / "part_kernels.json", result)

    def progress(row: dict) -> None:
        result["rows"].append(row)
        _write_json(out / "part_kernels.json", result)

    cached = _triton_kernels_cached()
    for index, table in enumerate(tables):
        if time.monotonic() > deadline:
            break
        if index == 1:
            result["triton_op"] = probe(device)
            _write_json(out / "part_kernels.json", result)
        kernel_table(device, numel, repeats, lowerings=("op",), progress=progress,
                     stop=lambda: time.monotonic() > deadline, **table)
    if "precompile" in result and cached is not None:  # compiled while timing: what the cache did not hold
        result["precompile"]["compiled_later"] = _triton_kernels_cached() - cached
    result["complete"] = time.monotonic() <= deadline
    _write_json(out / "part_kernels.json", result)


def _precompile(tables: list[dict], limit_s: float) -> dict:
    """Compile every variant the kernel tables launch (at their block sizes), in parallel
    through the launcher's own path (``runtime.warm_cache``)."""
    from ..runtime.warm_cache import warm
    from .kernels import at_program
    from .static_kernels import record_launches

    launches: dict = {}
    for table in tables:
        with at_program(table.get("program")):
            launches.update(record_launches(table["dtypes"], table["widths"]))
    workers = max(1, (os.cpu_count() or 2) - 1)
    log.info("gpu suite: compiling %d kernel variants on %d processes", len(launches), workers)
    return warm(list(launches), workers, limit_s)


def _triton_kernels_cached(directory: pathlib.Path | None = None) -> int | None:
    """Compiled kernels in Triton's on-disk cache (its entries holding a ``.cubin``: the cache
    also keeps launcher stubs and other files), or None where it cannot be read."""
    if directory is None:
        try:
            from triton import knobs

            directory = pathlib.Path(knobs.cache.dir)
        except (ImportError, AttributeError):
            directory = pathlib.Path(os.environ.get("TRITON_CACHE_DIR", pathlib.Path.home() / ".triton" / "cache"))
    if not directory.is_dir():
        return None
    return sum(1 for entry in directory.iterdir() if entry.is_dir() and any(entry.glob("*.cubin")))


def _models_part(out: pathlib.Path, deadline: float, device: str, scale: str, compiler: str,
                 program: tuple[int, int] | None, plan=PLAN) -> dict:
    """The (model, method) rows of ``plan``, in order, each written out as it ends; returns them."""
    from dataclasses import asdict

    from .gpu_workloads import Row, measure, short_error, workloads
    from .methods import GPU_METHODS

    rows: list[Row] = []
    result = {"rows": [], "program": None if program is None else "/".join(map(str, program))}
    models = {workload.name: workload for workload in workloads(device, scale)}
    runs = [(models[model], GPU_METHODS[method]) for model, method in plan]
    built: dict[str, object] = {}  # each model's weights, on the CPU: a run copies them to the device
    for index, (workload, method) in enumerate(runs):
        left = deadline - time.monotonic()
        if left <= 5:
            rows.append(Row(workload.name, method.name, workload.default_batch, error="not run: the part's time ran out"))
        else:
            if workload.name not in built:
                try:
                    torch.manual_seed(0)
                    built[workload.name] = workload.build()
                except Exception as error:
                    built[workload.name] = error
            base = built[workload.name]
            if isinstance(base, Exception):
                rows.append(Row(workload.name, method.name, workload.default_batch, error=short_error(base)))
            else:
                share = time.monotonic() + left / (len(runs) - index)  # an even share of what is left
                log.info("gpu suite: %s, %s (%.0f s left)", workload.name, method.name, left)
                rows.append(measure(workload, method, base, device=device, compiler=compiler,
                                    steps=10 if scale == "full" else 2, deadline=share))
        result["rows"] = [asdict(r) for r in rows]
        _write_json(out / "part_models.json", result)
    result["complete"] = True
    _write_json(out / "part_models.json", result)
    return result


def part_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m gact_fx.bench.gpu_suite")
    parser.add_argument("--part", choices=("kernels", "models"), required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--scale", default="full")
    parser.add_argument("--compiler", default="inductor")
    parser.add_argument("--program", help="the Triton kernels' elements a program, 16-bit inputs/the others")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    deadline = time.monotonic() + args.seconds
    if args.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True  # how these models train on a GPU
        torch.backends.cudnn.allow_tf32 = True
    if args.part == "kernels":
        _kernels_part(pathlib.Path(args.out), deadline, args.device, args.scale)
    else:
        from .kernels import at_program

        program = None if args.program is None else tuple(int(n) for n in args.program.split("/"))
        with at_program(program):
            _models_part(pathlib.Path(args.out), deadline, args.device, args.scale, args.compiler, program)
    return 0


# -- the whole suite ---------------------------------------------------------------------------


def run(out: pathlib.Path, *, device: str = "cuda", scale: str = "full", parts=PARTS, compiler: str = "inductor",
        budget: dict[str, float] | None = None, test_selection: list[str] | None = None,
        test_shards: int | None = None) -> dict:
    """Run the parts one after another; returns what it wrote to ``out/gpu_suite.json``.
    ``test_shards``: pytest processes at once in the tests part (default: ``default_test_shards``
    on CUDA, one on the CPU)."""
    from .metadata import metadata

    if device == "cuda":
        require_cuda()
    budget = {**BUDGET, **(budget or {})}
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    meta = metadata(device)
    try:
        import triton

        meta["triton"] = triton.__version__
    except ImportError:
        meta["triton"] = None
    result: dict = {"meta": meta, "budget": {part: budget[part] for part in parts}}
    for part in parts:
        log.info("gpu suite: %s (limit %.0f s)", part, budget[part])
        if part == "tests":
            shards = test_shards or (default_test_shards() if device == "cuda" else 1)
            result["tests"] = run_tests(out, budget[part], test_selection, shards)
        else:
            result[part] = run_part(part, out, budget[part], device=device, scale=scale, compiler=compiler)
        result["seconds"] = round(time.monotonic() - started, 1)
        result["markdown"] = summary_markdown(result)
        _write_json(out / "gpu_suite.json", result)
        (out / "gpu_suite.md").write_text(result["markdown"])
    return result


# -- the summary --------------------------------------------------------------------------------


def _number(value, digits: int = 1) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}" if abs(value) >= 10 ** -digits else f"{value:.2g}"


def kernels_markdown(kernels: dict) -> list[str]:
    rows = kernels.get("rows", [])
    copies = {r["dtype"]: r["gbps"] for r in rows if r["bits"] == "copy" and r.get("program") is None}
    cells: dict[tuple, dict] = {}
    for r in rows:
        if r["bits"] != "copy":
            cells.setdefault((r["dtype"], r["bits"], r.get("program")), {})[r["op"]] = r
    lines = [f"{kernels.get('numel')} elements, median of {kernels.get('repeats')}; GB/s counts the bytes each must "
             f"move; %: of a device copy of the same tensor (measured with the row); graph %: the same op replayed "
             f"in a CUDA graph, the kernels' time without the Python and launch time of an eager call. Elements a "
             f"program: the kernels' own (\"own\"), or the sweep's (16-bit inputs / the others). Part "
             f"{kernels.get('ended', '?')} ({kernels.get('seconds', '?')} s).\n",
             "| dtype | bits | elements a program | quantize GB/s | % | graph % | dequantize GB/s | % | graph % "
             "| feature groups: quantize % | graph % | dequantize % | graph % |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for (dtype, bits, program), ops in cells.items():
        def cell(op):
            row = ops.get(op)
            if row is None:
                return "-", "-", "-"
            graph = row.get("graph_of_copy")
            return (_number(row["gbps"], 0), f"{_number(100 * row['of_copy'], 0)}%",
                    "-" if graph is None else f"{_number(100 * graph, 0)}%")
        q, dq = cell("quantize"), cell("dequantize")
        fq, fdq = cell("quantize, feature groups"), cell("dequantize, feature groups")
        lines.append(f"| {dtype} | {bits} | {program or 'own'} | {q[0]} | {q[1]} | {q[2]} | {dq[0]} | {dq[1]} | {dq[2]} "
                     f"| {fq[1]} | {fq[2]} | {fdq[1]} | {fdq[2]} |")
    lines.append("Device copy: " + ", ".join(f"{dtype} {gbps:.0f} GB/s" for dtype, gbps in copies.items()))
    if any(r.get("program") for r in rows):
        own = kernels.get("own_elements", "-")
        lines.append("Fastest elements a program on these tensors, each kernel's narrow/wide (16-bit inputs "
                     "below 8 bits or feature-major / the rest): "
                     + fastest_elements_text(rows) + f"; the kernels' own: {own}")
    ahead = kernels.get("precompile")
    if ahead:
        later = ahead.get("compiled_later")
        lines.append(f"Compiled ahead: {ahead['launches']} kernel variants in {ahead['seconds']} s on "
                     f"{ahead['workers']} processes ({ahead['failed']} failed, {ahead.get('unfinished', 0)} "
                     "unfinished at its limit)"
                     + ("" if later is None else f"; kernels Triton still compiled while timing, the triton_op "
                                                 f"probe's included: {later}"))
        lines += [f"- failed: {failure}" for failure in ahead.get("failures", [])]
    if "triton_op" in kernels:
        from .triton_op_probe import probe_markdown

        lines += ["", *probe_markdown(kernels["triton_op"])]
    return lines


def models_markdown(models: dict) -> list[str]:
    from .methods import GPU_METHODS

    rows = models.get("rows", [])
    measured = {(r["model"], r["method"]): r for r in rows if r["error"] is None}
    program = models.get("program")
    blocks = f" The kernels ran at {program} elements a program (16-bit inputs/the others)." if program else ""
    lines = [f"bf16 autocast, each layer or block compiled on its own.{blocks} Device and host ms: a step's kernels "
             "and its ops' own CPU time under the profiler (host above device: the GPU waits on the CPU). Part "
             f"{models.get('ended', '?')} ({models.get('seconds', '?')} s).\n",
             "Each ratio is against torch.compile in the same mode (CUDA graphs or not).\n",
             "| model | method | batch | compile s | step ms | vs torch.compile | device ms | host ms | peak MiB "
             "| activations MiB | vs torch.compile | predicted max batch |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if r["error"] is not None:
            lines.append(f"| {r['model']} | {r['method']} | {r['batch']} | {r['error']} | | | | | | | | |")
            continue
        method = GPU_METHODS.get(r["method"])
        b = measured.get((r["model"], method.baseline if method else "torch.compile"))
        step = f"{r['step_ms'] / b['step_ms']:.2f}x" if b and b["step_ms"] else "-"
        held = "-"
        if b and r["activation_mib"] and r is not b:
            held = f"{b['activation_mib'] / r['activation_mib']:.1f}x less"
        lines.append(f"| {r['model']} | {r['method']} | {r['batch']} | {_number(r['compile_s'])} | "
                     f"{_number(r['step_ms'])} | {step} | {_number(r.get('device_ms'))} | {_number(r.get('host_ms'))} | "
                     f"{_number(r['peak_mib'], 0)} | {_number(r['activation_mib'])} | "
                     f"{held} | {r['predicted_max_batch'] or '-'} |")
    return lines


def summary_markdown(result: dict) -> str:
    meta = result["meta"]
    lines = [f"Device: {meta.get('device')}; torch {meta.get('torch')}; triton {meta.get('triton')}; commit "
             f"{meta.get('commit') or '?'}; {meta.get('date')}; {result.get('seconds', '?')} s in all.\n"]
    tests = result.get("tests")
    if tests is not None:
        counts = ", ".join(f"{tests[k]} {k}" for k in ("passed", "failed", "skipped", "interrupted") if tests.get(k))
        processes = f", {tests['shards']} processes at once" if tests.get("shards", 1) > 1 else ""
        lines.append(f"**GPU tests** (`pytest -m gpu`): {tests.get('status')}; {counts or 'no report'} "
                     f"({tests.get('seconds', '?')} s{processes})")
        lines += [f"- failed: {failure}" for failure in tests.get("failures", [])]
        lines.append("")
    if "kernels" in result:
        lines += ["**Kernels**\n", *kernels_markdown(result["kernels"]), ""]
    if "models" in result:
        lines += ["**Models**\n", *models_markdown(result["models"]), ""]
    return "\n".join(lines)


def main(args) -> int:
    log.setLevel(logging.INFO)  # progress: each part, model and method as it starts
    try:
        result = run(pathlib.Path(args.out))
    except NoGpu as error:
        print(f"gact-fx: {error}", file=sys.stderr)
        return 2
    print(result["markdown"])
    print(f"\nwrote {args.out}/gpu_suite.json and gpu_suite.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(part_main(sys.argv[1:]))
