"""The GPU suite's models, and one measurement per (model, method).

A Llama-like transformer of about 0.4B parameters (transformers' ``LlamaModel`` from a
config: RoPE, SDPA, RMSNorm, SiLU; no KV cache) and ResNet-50 (torchvision), both trained
under bf16 autocast. Each decoder layer (bottleneck block) is compiled on its own, with dynamic shapes, as
torchtitan compiles regions, so that a method compiles one graph per distinct layer,
whatever the depth and the batch.

Per row: the first step's seconds (it compiles), the median step after warm-up, a step's
device and host time under the profiler (host above device: the GPU waits on the CPU), the
peak memory of a step (``torch.cuda.max_memory_allocated``, weights included), the
activation bytes held for the backward (saved-tensor hooks at the batch and at twice
it: the difference is what grows with the batch, which leaves out the bf16 copies of
weights that autocast saves), and the largest batch predicted from the step peaks at
the two batches (linear in the batch; a prediction, not a run). ``scale="tiny"`` builds
the same models small, to test the plumbing on a CPU.
"""

from __future__ import annotations

import copy
import gc
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn

from .._compat import failing_past_recompiles
from ..measure import SavedBytesMeter
from .measure import probing
from .methods import Method


# Compiles of one block's forward that a measurement allows: every block of a class shares one
# code object, and ResNet-50's 16 bottlenecks come in 8 shapes. On an H100 they reached Dynamo's
# default limit of 8, and the blocks past it ran eagerly, uncompressed, with only a logged
# warning; past this limit the row fails instead.
RECOMPILE_LIMIT = 64


@dataclass
class GpuWorkload:
    name: str
    build: Callable[[], nn.Module]
    regions: Callable[[nn.Module], list[nn.Module]]  # what is compiled, one module at a time
    batch: Callable[[int], tuple]
    default_batch: int


def _hidden(output) -> torch.Tensor:
    value = getattr(output, "last_hidden_state", None)
    return output if value is None else value


def training_loss(output) -> torch.Tensor:
    """A loss whose gradient reaches every activation: the mean square of the output, in fp32."""
    return _hidden(output).float().square().mean()


def workloads(device: str, scale: str) -> list[GpuWorkload]:
    """The Llama-like transformer and ResNet-50 (``scale="tiny"``: the same code, small),
    built on the CPU: each run copies one to ``device``, so a step's peak holds one model."""
    tiny = scale == "tiny"
    generator = torch.Generator().manual_seed(0)

    def llama():
        import transformers

        config = transformers.LlamaConfig(
            vocab_size=128 if tiny else 32000, hidden_size=64 if tiny else 2048,
            intermediate_size=128 if tiny else 5632, num_hidden_layers=2 if tiny else 8,
            num_attention_heads=4 if tiny else 16, num_key_value_heads=2 if tiny else 8,
            max_position_embeddings=2048, use_cache=False,
        )
        return transformers.LlamaModel(config)

    def resnet():
        import torchvision

        return torchvision.models.resnet18(num_classes=10) if tiny else torchvision.models.resnet50()

    sequence, image = (64, 32) if tiny else (1024, 224)
    vocab = 128 if tiny else 32000
    return [
        GpuWorkload("llama-like", llama, lambda m: list(m.layers),
                    lambda n: (torch.randint(0, vocab, (n, sequence), generator=generator).to(device),), 2 if tiny else 8),
        GpuWorkload("resnet50", resnet, lambda m: [b for stage in (m.layer1, m.layer2, m.layer3, m.layer4) for b in stage],
                    lambda n: (torch.randn(n, 3, image, image, generator=generator).to(device),), 2 if tiny else 64),
    ]


@dataclass
class Row:
    model: str
    method: str
    batch: int
    compile_s: float | None = None
    step_ms: float | None = None
    peak_mib: float | None = None  # max allocated during a step, weights included
    activation_mib: float | None = None  # held for the backward, growing with the batch
    predicted_max_batch: int | None = None  # linear in the batch, from the step peaks at two batches
    device_ms: float | None = None  # a step's kernels, added up (the profiler; CUDA only)
    host_ms: float | None = None  # a step's ops' own CPU time, added up (the profiler): above device_ms, the GPU waits
    error: str | None = None
    seconds: float | None = None  # the whole measurement's, compiles included: what the suite's budget pays


def short_error(error: BaseException) -> str:
    """The first line of what went wrong, from the backend itself where Dynamo wraps its error
    (whose own message starts with the backend's repr)."""
    error = getattr(error, "inner_exception", None) or error
    return f"{type(error).__name__}: {error}".splitlines()[0][:200]


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


class _Runner:
    """A copy of the model, its regions compiled with the method's backend, and one step."""

    def __init__(self, workload: GpuWorkload, method: Method, base: nn.Module, device: str, compiler: str) -> None:
        self.workload, self.device = workload, device
        self.model = copy.deepcopy(base).to(device).train()
        self.backend = method.backend(compiler)
        for region in workload.regions(self.model):  # dynamic: the batch doubles for the memory rows
            region.compile(backend=self.backend, dynamic=True, mode=method.mode)

    def forward_loss(self, inputs) -> torch.Tensor:
        with torch.autocast(self.device, dtype=torch.bfloat16):
            return training_loss(self.model(*inputs))

    def step(self, inputs) -> None:
        self.model.zero_grad(set_to_none=True)
        self.forward_loss(inputs).backward()

    def held_bytes(self, batch: int) -> int:
        """Bytes the backward holds after one forward at ``batch``, parameters and buffers left out."""
        exclude = [*self.model.parameters(), *self.model.buffers()]
        with SavedBytesMeter(exclude=exclude) as meter:
            loss = self.forward_loss(self.workload.batch(batch))
        del loss
        return meter.nbytes

    def step_peak(self, batch: int) -> int:
        inputs = self.workload.batch(batch)
        _sync(self.device)
        if self.device != "cuda":
            self.step(inputs)
            return 0
        gc.collect()
        torch.cuda.reset_peak_memory_stats()
        self.step(inputs)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated()


def _timed_steps(runner: _Runner, inputs, steps: int, deadline: float) -> tuple[float, float]:
    """(seconds of the first step, which compiles; median ms of the timed steps after warm-up)."""
    started = time.perf_counter()
    runner.step(inputs)
    _sync(runner.device)
    compile_s = time.perf_counter() - started
    for _ in range(20):  # adaptive methods measure every tensor first
        runner.step(inputs)
        if not probing(runner.backend) or time.monotonic() > deadline:
            break
    return compile_s, median_step_ms(runner, inputs, steps, deadline)


def median_step_ms(runner: _Runner, inputs, steps: int, deadline: float = math.inf) -> float:
    """The median of ``steps`` timed steps (at least 3 once past ``deadline``), in ms."""
    times = []
    for _ in range(steps):
        _sync(runner.device)
        started = time.perf_counter()
        runner.step(inputs)
        _sync(runner.device)
        times.append(time.perf_counter() - started)
        if time.monotonic() > deadline and len(times) >= 3:
            break
    return 1e3 * statistics.median(times)


def device_time_key(events) -> str:
    """The profiler events' attribute for their own device time (older torch: ``self_cuda_time_total``)."""
    return "self_device_time_total" if hasattr(events[0], "self_device_time_total") else "self_cuda_time_total"


def profiled_step(step: Callable[[], None], device: str, steps: int = 3):
    """``(device ms, host ms, kernel launches)`` a step, from ``steps`` steps under
    ``torch.profiler``, and its averaged events (for tables). Host time is every op's own
    CPU time, added up, with the profiler's overhead in it; device time is None off CUDA."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device == "cuda"
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as profiler:
        for _ in range(steps):
            step()
        _sync(device)
    events = profiler.key_averages()
    key = device_time_key(events)
    kernels = [e for e in events if e.device_type.name == "CUDA" and getattr(e, key) > 0]
    device_ms = sum(getattr(e, key) for e in kernels) / (1e3 * steps) if cuda else None
    host_ms = sum(e.self_cpu_time_total for e in events) / (1e3 * steps)
    return device_ms, host_ms, sum(e.count for e in kernels) / steps, events


def measure(workload: GpuWorkload, method: Method, base: nn.Module, *, device: str, compiler: str, steps: int,
            deadline: float) -> Row:
    batch = workload.default_batch
    row = Row(workload.name, method.name, batch)
    started = time.monotonic()
    try:
        with method.patches(), failing_past_recompiles(RECOMPILE_LIMIT):
            runner = _Runner(workload, method, base, device, compiler)
            inputs = workload.batch(batch)
            row.compile_s, row.step_ms = _timed_steps(runner, inputs, steps, deadline)
            row.device_ms, row.host_ms, _, _ = profiled_step(lambda: runner.step(inputs), device)
            row.activation_mib = (runner.held_bytes(2 * batch) - runner.held_bytes(batch)) / 2**20
            if device == "cuda":
                peak, double_peak = runner.step_peak(batch), runner.step_peak(2 * batch)
                row.peak_mib = peak / 2**20
                per_sample = max(1.0, (double_peak - peak) / batch)
                capacity = torch.cuda.get_device_properties(0).total_memory
                row.predicted_max_batch = int(batch + (capacity - peak) / per_sample)
    except Exception as error:  # recorded, never raised: one broken method must not stop the suite
        row.error = short_error(error)
    finally:
        torch._dynamo.reset()
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
        row.seconds = round(time.monotonic() - started, 1)
    return row
