"""Codec bandwidth: quantize and dequantize GB/s per width and dtype, against a plain copy.

For both lowerings: the opaque ``gact::`` ops (Triton kernels on CUDA, the CPU codec or
the torch reference on the CPU) and the aten lowering compiled by Inductor. Bytes
counted are what each must move: quantize reads the tensor and writes the blob,
dequantize the reverse; the copy reads and writes the tensor. The ceiling is the faster
of a copy into a new tensor and a copy into a buffer allocated once, each timed before and
after the dtype's codec rows (its faster time counts: on the CPU a copy's speed drifted by up
to a third between runs, and a slow one would flatter every share). The "feature
groups" rows encode a [tokens, 1024] tensor in groups of one feature's tokens and decode
it back to its own layout (on the CPU without a transposed copy). On a GPU each op is also
timed as a CUDA-graph replay (``graph_gbps``): the kernels' own time, without the Python
and launch time of an eager call.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable

import torch

from ..runtime import aten_codec
from ..runtime import format as fmt
from ..runtime import ops  # noqa: F401  (registers torch.ops.gact)
from ..runtime.program_sizes import elements_in_a_program, elements_per_program, role_flags
from ..runtime.registry import SlotRegistry

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
WIDTHS = (1, 2, 3, 4, 8)
FEATURES = 1024  # the feature-groups rows' innermost dimension: a power of two, the worst row stride for caches


def graph_seconds(fn: Callable[[], object], repeats: int, warmup: int = 3) -> float | None:
    """Median seconds of a CUDA-graph replay of ``fn()``: the device's work alone, without the
    Python and launch time around it (``None`` if ``fn`` cannot be captured)."""
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(warmup):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
    except Exception:  # a capture that fails leaves the eager time alone standing
        torch.cuda.synchronize()
        return None
    return median_seconds(graph.replay, "cuda", repeats, warmup)


def median_seconds(fn: Callable[[], object], device: str, repeats: int, warmup: int = 3) -> float:
    """Median seconds of ``fn()`` after warm-up (CUDA events on a GPU)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            started = time.perf_counter()
            fn()
            times.append(time.perf_counter() - started)
    return statistics.median(times)


def kernel_table(device: str, numel: int, repeats: int, *, dtypes=DTYPES, widths=WIDTHS,
                 lowerings=("op", "aten"), progress: Callable[[dict], None] = lambda row: None,
                 stop: Callable[[], bool] = lambda: False, program: tuple[int, int] | None = None) -> list[dict]:
    """One row per (dtype, width, lowering, op), and one copy row per dtype; ``stop()``
    ends the table early (what it measured so far is returned). ``program``: the Triton
    kernels' elements a program (16-bit inputs, the others) instead of their own, recorded
    in each row (``"program"``: ``"16384/8192"``; ``None`` for the kernels' own), with the
    elements a program each op's Triton kernel takes (``"elements"``; they ran on CUDA alone)."""
    label = None if program is None else "/".join(map(str, program))
    with at_program(program):
        return _kernel_table(device, numel, repeats, dtypes, widths, lowerings, progress, stop, label)


def at_program(program: tuple[int, int] | None):
    """A block inside which the Triton kernels take ``program`` elements a program (16-bit
    inputs, the others); None: their own."""
    if program is None:
        return contextlib.nullcontext()
    return elements_per_program(*program)


def _kernel_table(device, numel, repeats, dtypes, widths, lowerings, progress, stop, program) -> list[dict]:
    registry = SlotRegistry()
    site = registry.new_site()
    rows = []
    for dtype in dtypes:
        x = torch.randn(numel, device=device).to(dtype)
        raw = numel * x.element_size()
        # Two copies: into a new tensor (as the ops allocate their outputs; on the CPU a large
        # fresh allocation pays its page faults) and into one allocated once (the memory's
        # bandwidth). The ceiling is the faster of the two.
        target = torch.empty_like(x)
        copies = {"copy, new tensor": lambda: x.clone(), "copy, into a buffer": lambda: target.copy_(x)}
        copy_speed = lambda fn: 2 * raw / median_seconds(fn, device, repeats) / 1e9  # noqa: E731  (GB/s)
        speeds = {name: copy_speed(fn) for name, fn in copies.items()}
        copy_gbps = max(speeds.values())
        first_row = len(rows)
        for name, gbps in speeds.items():
            rows.append(dict(dtype=str(dtype)[6:], bits="copy", lowering="-", op=name, gbps=gbps, of_copy=gbps / copy_gbps,
                             program=program))
            progress(rows[-1])
        for bits in widths:
            if stop():
                return rows
            blob_bytes = fmt.float_blob_nbytes(numel, bits, 256, x.element_size())
            blob = torch.ops.gact.quantize(x, bits, 256, [0], site.slot)
            candidates = {}
            if "op" in lowerings:
                candidates[("op", "quantize")] = lambda: torch.ops.gact.quantize(x, bits, 256, [0], site.slot)
                candidates[("op", "dequantize")] = lambda: torch.ops.gact.dequantize(blob, [numel], dtype, 256, [0], site.slot)
                if numel % FEATURES == 0:  # feature groups: the tensor as [tokens, FEATURES], encoded transposed
                    matrix, shape = x.view(-1, FEATURES), [numel // FEATURES, FEATURES]
                    transposed = torch.ops.gact.quantize(matrix, bits, 256, [1, 0], site.slot)
                    candidates[("op", "quantize, feature groups")] = (
                        lambda: torch.ops.gact.quantize(matrix, bits, 256, [1, 0], site.slot))
                    candidates[("op", "dequantize, feature groups")] = (
                        lambda: torch.ops.gact.dequantize(transposed, shape, dtype, 256, [1, 0], site.slot, [0, 1]))
            if "aten" in lowerings:
                torch._dynamo.reset()  # one code object, recompiled for each width: stay under the limit
                key = torch.tensor([12345, 678], dtype=torch.int64, device=device)
                encode = torch.compile(lambda t: aten_codec.encode(t, [0], bits, 256, key), fullgraph=True)
                decode = torch.compile(lambda b: aten_codec.decode(b, [numel], dtype, 256, [0], bits), fullgraph=True)
                candidates[("aten", "quantize")] = lambda: encode(x)
                candidates[("aten", "dequantize")] = lambda: decode(blob)
            for (lowering, op), fn in candidates.items():
                gbps = (raw + blob_bytes) / median_seconds(fn, device, repeats) / 1e9
                replayed = graph_seconds(fn, repeats) if device == "cuda" else None
                graph_gbps = None if replayed is None else (raw + blob_bytes) / replayed / 1e9
                elements = elements_in_a_program(x.element_size(), bits, **role_flags(op)) if lowering == "op" else None
                rows.append(dict(dtype=str(dtype)[6:], bits=bits, lowering=lowering, op=op, gbps=gbps, of_copy=gbps / copy_gbps,
                                 program=program, elements=elements, graph_gbps=graph_gbps))
                progress(rows[-1])
        for name, fn in copies.items():  # the copies again: the faster time of each counts
            speeds[name] = max(speeds[name], copy_speed(fn))
        del target
        copy_gbps = max(speeds.values())
        for row in rows[first_row:]:
            if row["bits"] == "copy":
                row["gbps"] = speeds[row["op"]]
            row["of_copy"] = row["gbps"] / copy_gbps
            if row.get("graph_gbps") is not None:
                row["graph_of_copy"] = row["graph_gbps"] / copy_gbps
    return rows


def kernel_markdown(rows: list[dict], numel: int, repeats: int) -> str:
    lines = [
        f"{numel} elements per tensor, median of {repeats}. GB/s counts the bytes each must move.\n",
        "| dtype | bits | lowering | op | GB/s | of copy bandwidth |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(f"| {r['dtype']} | {r['bits']} | {r['lowering']} | {r['op']} | {r['gbps']:.2f} | {100 * r['of_copy']:.1f}% |")
    return "\n".join(lines)
