"""Records of the Triton launches the CUDA path makes, in the terms a GPU compile takes.

Every Triton kernel of gact-fx is launched through ``launch``. While a ``LaunchRecorder``
is active (``with LaunchRecorder() as recorder:``), each launch also leaves a ``Launch``:
the kernel's name, each argument's Triton type as the launcher would specialise it on a
GPU (pointer element types, 32- or 64-bit integers, integers equal to 1 folded into
constants, 16-byte divisibility), the compile-time constants and the warps. That is
what ``runtime.compile_check`` compiles for real GPU targets on a machine without one:
the list comes from real runs of the CUDA path (under ``TRITON_INTERPRET=1`` on the
CPU), never from a list kept by hand.

Recording changes nothing about the launch itself (unless asked not to launch at all).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Mapping
from dataclasses import dataclass

import torch

# Triton's names for the element types our kernels take pointers to.
TRITON_TYPES = {
    torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.uint8: "u8",
    torch.int8: "i8", torch.int32: "i32", torch.int64: "i64", torch.bool: "i1",
}
_INT32 = range(-(2**31), 2**31)


@dataclass(frozen=True)
class Launch:
    """One kernel variant as a GPU compile sees it (plain data: it travels as JSON)."""

    kernel: str  # the ``@triton.jit`` function, as ``module.name``
    signature: tuple[tuple[str, str], ...]  # (argument, Triton type or "constexpr"), in order
    constants: tuple[tuple[str, object], ...]  # constexpr arguments, specialised integers included
    divisible: tuple[str, ...]  # arguments Triton would mark 16-byte divisible (pointers) or divisible by 16
    num_warps: int
    fp_fusion: bool = False  # whether a * b + c may become one fused multiply-add (gact's kernels: never)

    def as_json(self) -> dict:
        return {"kernel": self.kernel, "signature": list(map(list, self.signature)),
                "constants": list(map(list, self.constants)), "divisible": list(self.divisible),
                "num_warps": self.num_warps, "fp_fusion": self.fp_fusion}

    @classmethod
    def from_json(cls, data: Mapping) -> Launch:
        return cls(data["kernel"], tuple(map(tuple, data["signature"])), tuple(map(tuple, data["constants"])),
                   tuple(data["divisible"]), int(data["num_warps"]), bool(data.get("fp_fusion", False)))

    def describe(self) -> str:
        """A short name: the kernel and its constants."""
        constants = ", ".join(f"{name}={value}" for name, value in self.constants  # (a dtype's limit: its pointers say)
                              if name.isupper() and not isinstance(value, float))
        types = ",".join(kind for _, kind in self.signature if kind.startswith("*"))
        return f"{self.kernel.rpartition('.')[2]}[{constants}; {types}; warps={self.num_warps}]"


def _specialise(value) -> tuple[str, bool]:
    """(Triton type, divisible by 16) of a runtime argument, as Triton's launcher sees it."""
    if isinstance(value, torch.Tensor):
        if value.dtype not in TRITON_TYPES:
            raise TypeError(f"no Triton pointer type for {value.dtype}")
        return "*" + TRITON_TYPES[value.dtype], value.data_ptr() % 16 == 0
    if isinstance(value, bool):
        return "i1", False
    if isinstance(value, int):
        return ("i32" if value in _INT32 else "i64"), value % 16 == 0
    if isinstance(value, float):
        return "fp32", False
    raise TypeError(f"cannot record a Triton argument of type {type(value).__name__}")


# Constants whose value a GPU launch always takes, whatever the recording machine ran: the
# kernels' ``INTERPRETED`` picks the interpreter's equivalent of an operation it runs slowly
# or rounds differently.
GPU_CONSTANTS = {"INTERPRETED": False}


def describe_launch(kernel_name: str, arguments: Mapping[str, object], constants: Mapping[str, object],
                    num_warps: int) -> Launch:
    """The ``Launch`` of ``kernel_name`` called with ``arguments`` (in the kernel's order) and
    ``constants``, as a GPU would launch it (``GPU_CONSTANTS``)."""
    constants = {name: GPU_CONSTANTS.get(name, value) for name, value in constants.items()}
    signature, folded, divisible = [], dict(constants), []
    for name, value in arguments.items():
        if isinstance(value, int) and not isinstance(value, bool) and value == 1:
            folded[name] = 1  # Triton compiles integers equal to 1 as constants
            signature.append((name, "constexpr"))
            continue
        kind, aligned = _specialise(value)
        signature.append((name, kind))
        if aligned:
            divisible.append(name)
    signature += [(name, "constexpr") for name in constants]
    return Launch(kernel_name, tuple(signature), tuple(folded.items()), tuple(divisible), num_warps)


class LaunchRecorder:
    """Collects the distinct launches made while it is active (nested recorders each see them).

    ``run=False`` records without launching (the outputs are left unwritten): how the
    static report lists the variants a GPU would launch, on a machine without one."""

    def __init__(self, *, run: bool = True) -> None:
        self.launches: dict[Launch, int] = {}  # launch -> times seen
        self.run = run
        self._token: contextvars.Token | None = None

    def add(self, launch: Launch) -> None:
        self.launches[launch] = self.launches.get(launch, 0) + 1

    def __enter__(self) -> LaunchRecorder:
        self._token = _ACTIVE.set(_ACTIVE.get() + (self,))
        return self

    def __exit__(self, *exc) -> None:
        _ACTIVE.reset(self._token)
        self._token = None


_ACTIVE: contextvars.ContextVar[tuple[LaunchRecorder, ...]] = contextvars.ContextVar("gact_launch_recorders", default=())


_WRAPPED: contextvars.ContextVar[bool] = contextvars.ContextVar("gact_launch_wrapped", default=False)


@contextlib.contextmanager
def through_wrap_triton():
    """Launch through ``torch.library.wrap_triton`` inside the block, as the body of a
    ``torch.library.triton_op`` must, so that Inductor sees the kernel (the GPU suite's probe)."""
    token = _WRAPPED.set(True)
    try:
        yield
    finally:
        _WRAPPED.reset(token)


def launch(kernel, grid: tuple[int, ...], arguments: Mapping[str, object], constants: Mapping[str, object],
           *, num_warps: int) -> None:
    """Launch a ``@triton.jit`` kernel with keyword arguments, recording it for active recorders.

    Without fused multiply-adds: the format rounds ``a * b + c`` twice wherever it writes
    it (Triton contracts by default; the interpreter never does). The kernels do not depend
    on it (``triton_common.mul``), so a launch through ``wrap_triton``, which takes Triton's
    default, writes the same blob."""
    recorders = _ACTIVE.get()
    if recorders and not _WRAPPED.get():  # (a traced launch is recorded where the same call runs as an op)
        record = describe_launch(f"{kernel.fn.__module__}.{kernel.fn.__name__}", arguments, constants, num_warps)
        for recorder in recorders:
            recorder.add(record)
        if not all(recorder.run for recorder in recorders):
            return
    if _WRAPPED.get():
        from torch.library import wrap_triton

        wrap_triton(kernel)[grid](**arguments, **constants, num_warps=num_warps)
        return
    kernel[grid](**arguments, **constants, num_warps=num_warps, enable_fp_fusion=False)
