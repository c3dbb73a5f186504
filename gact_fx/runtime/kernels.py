"""Which implementation encodes and decodes blobs: Triton on CUDA, the torch reference elsewhere.

All write the same format (``runtime.format``) with the same noise (``runtime.noise``),
bit for bit. ``GACT_FX_KERNELS=triton`` forces the Triton kernels on any device (with
``TRITON_INTERPRET=1`` that is how they run on a CPU in tests), ``GACT_FX_KERNELS=reference``
forces the reference; unset, Triton serves CUDA tensors when it is installed. Triton is
imported on first use, never at import time. bool masks and 32-bit pass-through always
take the reference path (a copy or a bit-pack).

A call's noise comes from ``state`` (a site's ``[slot_key, count]`` on the device; the
caller advances it) or from an explicit ``key`` (``[k0, k1]``).
"""

from __future__ import annotations

import functools
import importlib.util
import os

import torch

from . import format as fmt
from .noise import call_key, rounding_noise
from .reference import dequantize_reference, quantize_reference

CHOICES = ("auto", "triton", "reference")


@functools.cache
def triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def _choice() -> str:
    choice = os.environ.get("GACT_FX_KERNELS", "auto")
    if choice not in CHOICES:
        raise ValueError(f"GACT_FX_KERNELS must be one of {CHOICES}, got {choice!r}")
    return choice


def uses_triton(tensor: torch.Tensor, bits: int) -> bool:
    if tensor.dtype == torch.bool or bits == fmt.PASS_THROUGH_BITS or tensor.numel() == 0:
        return False
    choice = _choice()
    if choice == "triton":
        if not triton_installed():
            raise RuntimeError("GACT_FX_KERNELS=triton but Triton is not installed (pip install 'gact-fx[triton]')")
        return True
    return choice == "auto" and tensor.device.type == "cuda" and triton_installed()


def encode(flat: torch.Tensor, bits: int, group_size: int, *, state=None, key=None) -> torch.Tensor:
    """Blob of a 1-D tensor, its noise keyed by a site's ``state`` or by ``key``."""
    if uses_triton(flat, bits):
        from . import triton_kernels

        return triton_kernels.quantize(flat.contiguous(), bits, group_size, state=state, key=key)
    noise = None
    if flat.dtype != torch.bool and bits != fmt.PASS_THROUGH_BITS and flat.numel():
        noise = rounding_noise(fmt.num_groups(flat.numel(), group_size), group_size, call_key(state) if key is None else key)
    return quantize_reference(flat, bits, group_size, noise)


def decode(blob: torch.Tensor, numel: int, dtype: torch.dtype, group_size: int) -> torch.Tensor:
    """1-D tensor of ``numel`` elements of ``dtype`` from a blob."""
    bits = fmt.bits_from_blob_nbytes(blob.numel())
    if dtype != torch.bool and uses_triton(blob, bits):
        from . import triton_kernels

        return triton_kernels.dequantize(blob, numel, dtype, group_size)
    return dequantize_reference(blob, numel, dtype, group_size)
