"""``gact-fx bench --gpu-suite --out DIR``: the GPU measurements, in one command, in under 9 minutes.

Made for the GPU machine this project is sometimes lent (an H100 or H200 with torch 2.11
+ CUDA, Triton, torchvision and transformers, and no network), with the project
installed by ``pip install --no-deps --no-build-isolation -e .``. Three parts, each with
its own share of the time, each recording what it could not finish:

1. the GPU tests (``pytest -m gpu`` on the repository's ``tests/``): compiled Triton
   kernels bit-identical to the reference, training through them, CUDA graphs;
2. the kernel table: quantize and dequantize GB/s per width and dtype, against a
   device copy, for both lowerings;
3. step time, peak memory and max batch of a BERT-large-like model, ResNet-50
   (torchvision) and a Llama-like model, against torch.compile: gact at 8, 4 and 2
   bits and at L2.2, torch's fp8 activation pass and the activation memory budget.
   Each transformer layer (ResNet block) is compiled on its own, with dynamic shapes,
   so that a method compiles once, in seconds, whatever the depth and the batch.

Writes ``gpu_suite.json`` (everything, with the device, torch and triton versions) and
``gpu_suite.md``; ``gact-fx bench --markdown`` folds the JSON into BENCHMARKS.md.
Without CUDA it stops at once with a message that says so.
"""

from __future__ import annotations

import copy
import gc
import json
import logging
import pathlib
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch
import torch.nn as nn

from .kernels import DTYPES, WIDTHS, kernel_markdown, kernel_table
from .measure import probing, time_training
from .metadata import metadata
from .methods import ALL, Method

log = logging.getLogger("gact_fx.bench")

TOTAL_SECONDS = 8 * 60 + 30  # under the 9 minutes the suite promises
TEST_SECONDS = 120
KERNEL_SECONDS = 100
METHODS = ("torch.compile", "gact 8 bit", "gact 4 bit", "gact 2 bit", "gact L2.2 (adaptive 2)",
           "fp8 activations (torch)", "budget 0.5")


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


class Clock:
    """The suite's time: a total budget and the deadline of each part."""

    def __init__(self, total: float) -> None:
        self.started = time.monotonic()
        self.total = total

    def left(self) -> float:
        return self.total - (time.monotonic() - self.started)

    def deadline(self, seconds: float) -> float:
        return time.monotonic() + min(seconds, self.left())


# -- part 1: the GPU tests ---------------------------------------------------------------


def tests_directory() -> pathlib.Path | None:
    """The repository's tests/ beside the package (an editable install from the repository)."""
    candidate = pathlib.Path(__file__).resolve().parents[2] / "tests"
    return candidate if (candidate / "conftest.py").exists() else None


def run_gpu_tests(out: pathlib.Path, seconds: float) -> dict:
    tests = tests_directory()
    if tests is None:
        return {"status": "not run: no tests/ beside the package (install the repository with -e)"}
    report = out / "gpu_tests.xml"
    command = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", f"--junitxml={report}", str(tests)]
    log.info("gpu suite: %s", " ".join(command))
    try:
        done = subprocess.run(command, cwd=tests.parent, capture_output=True, text=True, timeout=max(seconds, 1))
    except subprocess.TimeoutExpired:
        return {"status": f"stopped after {seconds:.0f} s (its share of the suite's time)"}
    summary = _junit_summary(report) if report.exists() else {}
    tail = (done.stdout + done.stderr).strip().splitlines()[-1:] or [""]
    return {"status": "passed" if done.returncode == 0 else f"pytest exit code {done.returncode}", "summary": tail[0], **summary}


def _junit_summary(path: pathlib.Path) -> dict:
    root = ElementTree.parse(path).getroot()
    cases = root.iter("testcase")
    failures = []
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    for case in cases:
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


# -- part 3: models ------------------------------------------------------------------------


@dataclass
class GpuWorkload:
    name: str
    build: Callable[[], nn.Module]
    regions: Callable[[nn.Module], list[nn.Module]]  # what is compiled, one module at a time
    batch: Callable[[int], tuple]
    loss: Callable[[object], torch.Tensor]
    default_batch: int


def _hidden(output) -> torch.Tensor:
    value = getattr(output, "last_hidden_state", None)
    if value is None:
        value = output.pooler_output if hasattr(output, "pooler_output") else output
    return value


def _square_mean(output) -> torch.Tensor:
    return _hidden(output).float().square().mean()


def workloads(device: str, scale: str) -> list[GpuWorkload]:
    """BERT-large-like, ResNet-50 and Llama-like (``scale="tiny"``: the same code, small, for tests)."""
    import transformers as T

    tiny = scale == "tiny"
    generator = torch.Generator().manual_seed(0)

    def tokens(vocab, sequence):
        return lambda n: (torch.randint(0, vocab, (n, sequence), generator=generator).to(device),)

    bert_config = T.BertConfig(
        vocab_size=30522 if not tiny else 128, hidden_size=64 if tiny else 1024, num_hidden_layers=2 if tiny else 24,
        num_attention_heads=4 if tiny else 16, intermediate_size=256 if tiny else 4096,
        max_position_embeddings=512, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )
    llama_config = T.LlamaConfig(
        vocab_size=32000 if not tiny else 128, hidden_size=64 if tiny else 2048, intermediate_size=128 if tiny else 5632,
        num_hidden_layers=2 if tiny else 8, num_attention_heads=4 if tiny else 16, num_key_value_heads=2 if tiny else 8,
        max_position_embeddings=1024,
    )

    def resnet50():
        import torchvision

        return torchvision.models.resnet50() if not tiny else torchvision.models.resnet18(num_classes=10)

    image = 64 if tiny else 224
    return [
        GpuWorkload("bert-large-like", lambda: T.BertModel(bert_config).to(device), lambda m: list(m.encoder.layer),
                    tokens(bert_config.vocab_size, 32 if tiny else 512), _square_mean, 2 if tiny else 16),
        GpuWorkload("resnet50", lambda: resnet50().to(device),
                    lambda m: [block for stage in (m.layer1, m.layer2, m.layer3, m.layer4) for block in stage],
                    lambda n: (torch.randn(n, 3, image, image, generator=generator).to(device),), _square_mean,
                    2 if tiny else 64),
        GpuWorkload("llama-like", lambda: T.LlamaModel(llama_config).to(device), lambda m: list(m.layers),
                    tokens(llama_config.vocab_size, 32 if tiny else 1024), _square_mean, 2 if tiny else 4),
    ]


@dataclass
class Row:
    model: str
    method: str
    batch: int
    compile_s: float | None = None
    step_ms: float | None = None
    peak_mib: float | None = None  # max allocated during a step, weights included
    step_peak_mib: float | None = None  # above what was allocated before the step
    max_batch: int | None = None
    max_batch_note: str = ""
    error: str | None = None
    notes: list[str] = field(default_factory=list)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


class _Runner:
    def __init__(self, workload: GpuWorkload, method: Method, base: nn.Module, device: str, compiler: str) -> None:
        self.workload, self.device = workload, device
        self.model = copy.deepcopy(base).train()
        self.backend = method.backend(compiler)
        for region in workload.regions(self.model):
            region.compile(backend=self.backend, dynamic=True)

    def step(self, inputs) -> None:
        self.model.zero_grad(set_to_none=True)
        self.workload.loss(self.model(*inputs)).backward()

    def probing(self) -> bool:
        return probing(self.backend)

    def peak(self, batch: int) -> tuple[int, int]:
        """(max allocated during a step, the same above the memory held before it), in bytes."""
        inputs = self.workload.batch(batch)
        _sync(self.device)
        if self.device != "cuda":
            return 0, 0
        gc.collect()
        torch.cuda.reset_peak_memory_stats()
        rest = torch.cuda.memory_allocated()
        self.step(inputs)
        _sync(self.device)
        peak = torch.cuda.max_memory_allocated()
        return peak, peak - rest


def _short(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}".splitlines()[0][:200]


def _fits(runner: _Runner, batch: int) -> tuple[bool, int]:
    try:
        return True, runner.peak(batch)[1]
    except torch.cuda.OutOfMemoryError:
        return False, 0
    finally:
        runner.model.zero_grad(set_to_none=True)
        gc.collect()
        torch.cuda.empty_cache()


def max_batch(runner: _Runner, batch: int, step_peak: int, deadline: float) -> tuple[int | None, str]:
    """The largest batch that trains: a prediction from the step peaks at two batches
    (memory is linear in the batch), then a few tries around it, until ``deadline``."""
    capacity = torch.cuda.get_device_properties(0).total_memory - torch.cuda.memory_allocated()
    fits, double_peak = _fits(runner, 2 * batch)
    if not fits:
        return batch, "2x the default batch does not fit"
    per_sample = max(1, (double_peak - step_peak) / batch)
    fixed = max(0, step_peak - per_sample * batch)
    low, high = 2 * batch, None
    guess = int(0.97 * (capacity - fixed) / per_sample)
    while time.monotonic() < deadline and (high is None or high - low > max(1, low // 32)):
        guess = max(low + 1, guess if high is None else (low + high) // 2)
        if high is not None:
            guess = min(guess, high - 1)
        ok, _ = _fits(runner, guess)
        if ok:
            low = guess
            guess = int(guess * 1.1) + 1
        else:
            high = guess
    note = "" if high is not None and high - low <= max(1, low // 32) else "a lower bound: the time ran out"
    return low, note


def measure_model(workload: GpuWorkload, method: Method, base: nn.Module, *, device: str, compiler: str,
                  steps: int, deadline: float, find_max_batch: bool) -> Row:
    row = Row(workload.name, method.name, workload.default_batch)
    try:
        with method.patches():
            runner = _Runner(workload, method, base, device, compiler)
            inputs = workload.batch(workload.default_batch)
            row.compile_s, row.step_ms = time_training(
                lambda: runner.step(inputs), device=device, steps=steps, warming=runner.probing, deadline=deadline
            )
            peak, step_peak = runner.peak(workload.default_batch)
            row.peak_mib, row.step_peak_mib = peak / 2**20, step_peak / 2**20
            if find_max_batch and device == "cuda":
                if time.monotonic() < deadline:
                    row.max_batch, row.max_batch_note = max_batch(runner, workload.default_batch, step_peak, deadline)
                else:
                    row.max_batch_note = "not measured: the time ran out"
    except Exception as error:  # recorded, never raised: one broken method must not stop the suite
        row.error = _short(error)
    finally:
        torch._dynamo.reset()
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
    return row


def run_models(clock: Clock, *, device: str, scale: str, compiler: str, methods: tuple[str, ...], steps: int,
               find_max_batch: bool) -> list[Row]:
    rows: list[Row] = []
    chosen = [ALL[name] for name in methods]
    for index, workload in enumerate(workloads(device, scale)):
        try:
            torch.manual_seed(0)
            base = workload.build()
        except Exception as error:
            rows += [Row(workload.name, m.name, workload.default_batch, error=_short(error)) for m in chosen]
            continue
        for position, method in enumerate(chosen):
            remaining = (len(chosen) - position) + len(chosen) * (2 - index)
            if clock.left() <= 5:
                rows.append(Row(workload.name, method.name, workload.default_batch, error="not run: the suite's time ran out"))
                continue
            deadline = clock.deadline(clock.left() / max(1, remaining))
            log.info("gpu suite: %s, %s (%.0f s left)", workload.name, method.name, clock.left())
            rows.append(measure_model(workload, method, base, device=device, compiler=compiler, steps=steps,
                                      deadline=deadline, find_max_batch=find_max_batch))
        del base
    return rows


def _number(value, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def models_markdown(rows: list[Row]) -> str:
    lines = ["| model | method | batch | compile s | step ms | vs torch.compile | peak MiB | step peak MiB | max batch |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    baselines = {r.model: r for r in rows if r.method == "torch.compile" and r.error is None}
    for r in rows:
        if r.error is not None:
            lines.append(f"| {r.model} | {r.method} | {r.batch} | {r.error} | | | | | |")
            continue
        base = baselines.get(r.model)
        ratio = f"{r.step_ms / base.step_ms:.2f}x" if base and base.step_ms else "-"
        batch = "-" if r.max_batch is None else f"{r.max_batch}{' (' + r.max_batch_note + ')' if r.max_batch_note else ''}"
        lines.append(f"| {r.model} | {r.method} | {r.batch} | {_number(r.compile_s)} | {_number(r.step_ms)} | {ratio} | "
                     f"{_number(r.peak_mib, 0)} | {_number(r.step_peak_mib, 0)} | {batch} |")
    return "\n".join(lines)


def run(out: pathlib.Path, *, device: str = "cuda", scale: str = "full", parts=("tests", "kernels", "models"),
        methods: tuple[str, ...] = METHODS, compiler: str = "inductor", total_seconds: float = TOTAL_SECONDS) -> dict:
    """Run the suite; returns what it wrote to ``out/gpu_suite.json``.

    ``device="cpu"``, ``scale="tiny"`` and ``compiler="eager"`` run the same code small and
    on the CPU: that is how its plumbing is tested without a GPU.
    """
    if device == "cuda":
        require_cuda()
        torch.backends.cuda.matmul.allow_tf32 = True  # how these models train on a GPU
        torch.backends.cudnn.allow_tf32 = True
    out.mkdir(parents=True, exist_ok=True)
    clock = Clock(total_seconds)
    meta = metadata(device)
    try:
        import triton

        meta["triton"] = triton.__version__
    except ImportError:
        meta["triton"] = None
    result: dict = {"meta": meta}
    if "tests" in parts:
        result["tests"] = run_gpu_tests(out, min(TEST_SECONDS, clock.left()))
        log.info("gpu suite: tests %s", result["tests"].get("status"))
    if "kernels" in parts:
        full = scale == "full"
        numel, repeats = (1 << 26, 20) if full else (1 << 12, 2)
        deadline = clock.deadline(KERNEL_SECONDS)
        rows = kernel_table(device, numel, repeats, dtypes=DTYPES if full else (torch.float32,), widths=WIDTHS if full else (2,),
                            progress=lambda row: log.info("gpu suite: kernels %s", row), stop=lambda: time.monotonic() > deadline)
        result["kernels"] = {"numel": numel, "rows": rows, "markdown": kernel_markdown(rows, numel, repeats)}
    if "models" in parts:
        rows = run_models(clock, device=device, scale=scale, compiler=compiler, methods=methods,
                          steps=10 if scale == "full" else 2, find_max_batch=device == "cuda")
        result["models"] = [asdict(r) for r in rows]
    result["seconds"] = round(total_seconds - clock.left(), 1)
    result["markdown"] = suite_markdown(result)
    (out / "gpu_suite.json").write_text(json.dumps(result, indent=1, default=str))
    (out / "gpu_suite.md").write_text(result["markdown"])
    return result


def suite_markdown(result: dict) -> str:
    meta = result["meta"]
    lines = [f"Device: {meta.get('device')}; torch {meta.get('torch')}; triton {meta.get('triton')}; "
             f"{result.get('seconds', '?')} s in all.\n"]
    tests = result.get("tests")
    if tests is not None:
        lines.append(f"**GPU tests** (`pytest -m gpu`): {tests.get('status')}; {tests.get('summary', '')}")
        lines += [f"- failed: {failure}" for failure in tests.get("failures", [])]
        lines.append("")
    if "kernels" in result:
        lines += ["**Kernels**\n", result["kernels"]["markdown"], ""]
    if "models" in result:
        lines += ["**Models** (each layer or block compiled on its own, dynamic shapes; peak: `max_memory_allocated` "
                  "during a step)\n", models_markdown([Row(**{**r, "notes": r.get("notes", [])}) for r in result["models"]])]
    return "\n".join(lines)


def main(args) -> int:
    try:
        result = run(pathlib.Path(args.out))
    except NoGpu as error:
        print(f"gact-fx: {error}", file=sys.stderr)
        return 2
    print(result["markdown"])
    print(f"\nwrote {args.out}/gpu_suite.json and gpu_suite.md")
    return 0
