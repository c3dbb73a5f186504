"""Compile recorded Triton launches ahead of time, in parallel, through the JIT's own path.

A kernel variant compiles at its first launch, on one core: seconds a variant, and a
measurement that meets many variants (the GPU suite's kernel table and its sweep of block
sizes) spends most of its time compiling. ``warm`` compiles a list of ``Launch``es
(``runtime.launches``) in a pool of processes, each with ``JITFunction.warmup`` on
stand-in arguments specialised as the launch was: the key Triton's launcher computes, so
the later launches load from Triton's on-disk cache. (``runtime.compile_check`` compiles
the same code, but its ``ASTSource`` is not the JIT's to the byte, so its cache entries
are not the launcher's.) Each worker needs the GPU's driver: the pool spawns fresh
processes, since CUDA does not survive a fork.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import time
from collections.abc import Sequence

import torch

from .launches import TRITON_TYPES, Launch

_TORCH_TYPES = {name: dtype for dtype, name in TRITON_TYPES.items()}


class _Pointer:
    """A stand-in tensor argument: Triton specialises a pointer on its element type and on
    whether its address is a multiple of 16."""

    def __init__(self, dtype: torch.dtype, aligned: bool) -> None:
        self.dtype = dtype
        self._address = 0 if aligned else 4

    def data_ptr(self) -> int:
        return self._address

    @staticmethod
    def ptr_range() -> int:
        return 0


def stand_in_arguments(launch: Launch) -> dict[str, object]:
    """Arguments by name that Triton specialises exactly as it did ``launch``'s: pointers of
    its element types and alignment, integers of its width and divisibility by 16, and its
    constants."""
    constants = dict(launch.constants)
    divisible = set(launch.divisible)
    arguments: dict[str, object] = {}
    for name, kind in launch.signature:
        aligned = name in divisible
        if kind == "constexpr":
            arguments[name] = constants[name]
        elif kind.startswith("*"):
            arguments[name] = _Pointer(_TORCH_TYPES[kind[1:]], aligned)
        elif kind == "i32":
            arguments[name] = 16 if aligned else 17
        elif kind == "i64":
            arguments[name] = 2**33 if aligned else 2**33 + 1
        elif kind == "i1":
            arguments[name] = True
        elif kind == "fp32":
            arguments[name] = 0.5
        else:
            raise TypeError(f"no stand-in for a Triton argument of type {kind} ({launch.describe()})")
    return arguments


def warm_one(launch: Launch) -> str | None:
    """Compile ``launch`` into Triton's cache; None, or what went wrong."""
    from .compile_check import kernel_function

    try:
        kernel_function(launch).warmup(**stand_in_arguments(launch), grid=(1,), num_warps=launch.num_warps,
                                       enable_fp_fusion=launch.fp_fusion)
    except Exception as error:  # reported per launch: one variant that fails costs only itself
        return f"{launch.describe()}: {type(error).__name__}: {error}"[:300]
    return None


def warm(launches: Sequence[Launch], workers: int, limit_s: float | None = None) -> dict:
    """Compile ``launches`` in ``workers`` spawned processes (one: in this one); returns how
    many, in how long, and the failures. After ``limit_s`` seconds it stops waiting: what
    has not started is dropped, what is compiling finishes in the background (into the
    cache all the same), and both count as unfinished."""
    started = time.monotonic()
    launches = list(dict.fromkeys(launches))
    unfinished = 0
    if workers <= 1:
        errors = []
        for launch in launches:
            if limit_s is not None and time.monotonic() - started > limit_s:
                unfinished = len(launches) - len(errors)
                break
            errors.append(warm_one(launch))
    else:
        pool = concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
        try:
            futures = [pool.submit(warm_one, launch) for launch in launches]
            done, pending = concurrent.futures.wait(futures, timeout=limit_s)
            errors = [future.result() for future in futures if future in done]
            unfinished = len(pending)
        finally:
            pool.shutdown(wait=not unfinished, cancel_futures=True)
    failures = [error for error in errors if error is not None]
    return {"launches": len(launches), "failed": len(failures), "failures": failures[:5], "unfinished": unfinished,
            "workers": max(1, workers), "seconds": round(time.monotonic() - started, 1)}
