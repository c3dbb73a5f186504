"""Does gact's quantize kernel work as a ``torch.library.triton_op``? A GPU probe for the suite.

gact's ``gact::`` ops are opaque to Inductor: it calls them between its own kernels.
Wrapped as a ``triton_op`` (each launch through ``wrap_triton``), a kernel is one Inductor
can see, launch from its own generated code and capture in CUDA graphs, with less Python
around each launch. Under the Triton interpreter this fails on every supported torch
(docs/gpu.md), so only a GPU can say. The probe wraps the contiguous quantize with an
explicit key and reports:

- whether the wrapped op, called eagerly and compiled by Inductor (``fullgraph``), writes
  the blob ``runtime.triton_kernels.quantize`` writes, bit for bit;
- the host time a call costs, for a tensor small enough that the host is what is timed:
  the plain Triton launch, ``gact::quantize`` (what training calls) and the compiled
  ``triton_op``.
"""

from __future__ import annotations

import functools
import time

import torch

NUMEL = 1 << 16  # 256 groups: the kernel's time is small against a call's host time
CALLS = 200


@functools.cache
def _wrapped_quantize():
    """``gact_probe::quantize(x, key, bits)``: the contiguous quantize (groups of 256) as a triton_op."""
    from ..runtime import triton_kernels
    from ..runtime.launches import through_wrap_triton

    @torch.library.triton_op("gact_probe::quantize", mutates_args=())
    def quantize(x: torch.Tensor, key: torch.Tensor, bits: int) -> torch.Tensor:
        with through_wrap_triton():
            return triton_kernels.quantize(x, bits, 256, key=key)

    return quantize


def _host_microseconds(call) -> float:
    call()
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(CALLS):
        call()
    torch.cuda.synchronize()
    return 1e6 * (time.perf_counter() - started) / CALLS


def _first_line(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}".splitlines()[0][:300]


def probe(device: str = "cuda", bits: int = 2) -> dict:
    """What the probe found (``{"status": ...}`` alone where it cannot run)."""
    if device != "cuda" or not torch.cuda.is_available():
        return {"status": "not run: needs a CUDA GPU"}
    from ..runtime import triton_kernels
    from ..runtime.registry import SlotRegistry

    x = torch.randn(NUMEL, device=device).to(torch.bfloat16)
    key = torch.tensor([12345, 678], dtype=torch.int64, device=device)
    expected = triton_kernels.quantize(x, bits, 256, key=key)
    result: dict = {"status": "ran", "numel": NUMEL, "bits": bits}
    try:
        wrapped = _wrapped_quantize()
        result["eager_same_blob"] = bool(torch.equal(wrapped(x, key, bits), expected))
    except Exception as error:  # what fails is the finding
        result["eager_error"] = _first_line(error)
        return result
    try:
        compiled = torch.compile(lambda t, k: wrapped(t, k, bits), fullgraph=True)
        result["inductor_same_blob"] = bool(torch.equal(compiled(x, key), expected))
    except Exception as error:
        result["inductor_error"] = _first_line(error)
        compiled = None
    registry = SlotRegistry()  # (a site lives as long as its registry)
    site = registry.new_site()
    result["host_us"] = {
        "Triton launch": _host_microseconds(lambda: triton_kernels.quantize(x, bits, 256, key=key)),
        "gact::quantize": _host_microseconds(lambda: torch.ops.gact.quantize(x, bits, 256, [0], site.slot)),
    }
    if compiled is not None:
        result["host_us"]["triton_op, compiled"] = _host_microseconds(lambda: compiled(x, key))
    return result


def probe_markdown(result: dict) -> list[str]:
    if result.get("status") != "ran":
        return [f"triton_op probe: {result.get('status', 'not run')}"]
    parts = [f"eager: {'same blob' if result.get('eager_same_blob') else result.get('eager_error', 'different blob')}"]
    if "eager_error" not in result:
        inductor = result.get("inductor_same_blob")
        parts.append(f"Inductor: {'same blob' if inductor else result.get('inductor_error', 'different blob')}")
    times = ", ".join(f"{name} {us:.1f} us" for name, us in result.get("host_us", {}).items())
    return [f"triton_op probe (quantize, {result['bits']} bits, {result['numel']} bf16 elements): "
            + "; ".join(parts) + (f". Host time a call: {times}." if times else "")]
