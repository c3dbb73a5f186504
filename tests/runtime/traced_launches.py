"""Run graphs that trace gact's Triton launches (``lowering="triton"``) on a CPU, under the interpreter.

On a GPU, ``wrap_triton`` traces each launch into a node that names the ``@triton.jit``
kernel. Under ``TRITON_INTERPRET=1`` the kernels are interpreted functions, which torch
neither traces (it launches them on the spot) nor, on torch 2.9, takes at all. So
``jit_kernels_traced`` traces with JIT copies of the kernel modules (imported once with
the interpreter off: what a GPU machine traces), and runs each traced launch with the
interpreted kernel of the same name: the graph is the one a GPU would get, its launches
run as the interpreter runs the kernels.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import sys

KERNEL_MODULES = ("gact_fx.runtime.triton_common", "gact_fx.runtime.triton_encode", "gact_fx.runtime.triton_decode")


@functools.cache
def _jit_modules() -> dict:
    """Fresh imports of the kernel modules with the interpreter off (Triton reads it as it decorates)."""
    saved = {name: sys.modules.pop(name) for name in KERNEL_MODULES}
    interpret = os.environ.pop("TRITON_INTERPRET", None)
    try:
        return {name: importlib.import_module(name) for name in KERNEL_MODULES}
    finally:
        if interpret is not None:
            os.environ["TRITON_INTERPRET"] = interpret
        sys.modules.update(saved)


@contextlib.contextmanager
def jit_kernels_traced():
    from unittest import mock

    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table
    from triton.runtime.autotuner import Autotuner

    from gact_fx.runtime import triton_kernels

    jit = _jit_modules()
    traced = kernel_side_table.get_kernel

    def interpreted(index):
        kernel = traced(index)
        function = (kernel.fn if isinstance(kernel, Autotuner) else kernel).fn  # (num_warps makes an autotuner)
        return getattr(sys.modules[function.__module__], function.__name__)

    with contextlib.ExitStack() as patches:
        for name in dir(triton_kernels):
            kernel = getattr(triton_kernels, name)
            if name.endswith("_kernel") and hasattr(kernel, "fn"):
                patches.enter_context(mock.patch.object(triton_kernels, name, getattr(jit[kernel.fn.__module__], name)))
        patches.enter_context(mock.patch.object(kernel_side_table, "get_kernel", interpreted))
        yield
