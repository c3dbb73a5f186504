"""Which implementation encodes and decodes blobs: Triton on CUDA, the C++ codec on the CPU,
the torch reference elsewhere.

All write the same format (``runtime.format``) with the same noise (``runtime.noise``),
bit for bit, dithered blobs (``rounding="dithered"``) included. ``GACT_FX_KERNELS`` forces
one: ``triton`` on any device (with ``TRITON_INTERPRET=1`` that is how the Triton kernels
run on a CPU in tests), ``cpu`` (CPU tensors), or ``reference``; unset (``auto``), Triton
serves CUDA tensors when it is installed and the C++ codec (``runtime.cpu_kernels``) serves
CPU tensors when it could be compiled. Triton and the C++ codec are loaded on first use, never at import time.
bool masks take the C++ codec's bit-pack on the CPU, Triton's on CUDA, the reference's
elsewhere; 32-bit pass-through is a copy.

``encode_permuted`` and ``decode_permuted`` take a tensor in the order of a permutation;
for the feature-major order of ``feature_groups`` the C++ codec and the Triton kernels
read and write the source's own layout (when its tokens fill whole groups), where the
reference needs a transposed copy.

A call's noise comes from ``state`` (a site's ``[slot_key, count, ticket]`` on the device)
or from an explicit ``key`` (``[k0, k1]``). ``count`` counts the call in the state: the
Triton kernels do it on the device themselves; for the others it is called after encoding.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import os

import torch

from . import format as fmt
from .layout import arrange, feature_major, identity, inverse_permutation, natural_order
from .noise import call_key, rounding_noise
from .reference import dequantize_reference, quantize_reference

CHOICES = ("auto", "triton", "cpu", "reference")


@functools.cache
def triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def _choice() -> str:
    choice = os.environ.get("GACT_FX_KERNELS", "auto")
    if choice not in CHOICES:
        raise ValueError(f"GACT_FX_KERNELS must be one of {CHOICES}, got {choice!r}")
    return choice


def implementation(tensor: torch.Tensor, bits: int, dtype: torch.dtype | None = None) -> str:
    """'triton', 'cpu' or 'reference' for a tensor (or blob, with the ``dtype`` it decodes
    to) of this device and width."""
    if tensor.numel() == 0:
        return "reference"
    choice = _choice()
    on_cpu = tensor.is_cpu
    if (dtype or tensor.dtype) == torch.bool:  # a mask, at 1 bit whatever ``bits``
        if choice in ("auto", "cpu") and on_cpu and _codec_available():
            return "cpu"
        if (choice == "triton" or (choice == "auto" and tensor.device.type == "cuda")) and triton_installed():
            return "triton"
        return "reference"
    if bits == fmt.PASS_THROUGH_BITS:
        return "reference"
    if choice == "triton":
        if not triton_installed():
            raise RuntimeError("GACT_FX_KERNELS=triton but Triton is not installed (pip install 'gact-fx[triton]')")
        return "triton"
    if choice == "cpu":
        if not on_cpu or not _codec_available(dtype or tensor.dtype):
            raise RuntimeError("GACT_FX_KERNELS=cpu needs CPU tensors and a C++ compiler (see the warning above)")
        return "cpu"
    if choice == "auto":
        if on_cpu:
            return "cpu" if _codec_available(dtype or tensor.dtype) else "reference"
        if tensor.device.type == "cuda" and triton_installed():
            return "triton"
    return "reference"


@functools.cache
def _cpu_codec():
    """``runtime.cpu_kernels``, imported on first use (an import in each call cost a microsecond)."""
    from . import cpu_kernels

    return cpu_kernels


def _codec_available(dtype: torch.dtype = torch.float32) -> bool:
    """Whether the C++ CPU codec for ``dtype`` compiled here (imported on first use, never at import
    time; the bool kernels come with float32's)."""
    return _cpu_codec().available(dtype)


def uses_triton(tensor: torch.Tensor, bits: int) -> bool:
    return implementation(tensor, bits) == "triton"


@functools.cache
def _triton_codec():
    """``runtime.triton_kernels``, imported on first use (it imports Triton)."""
    from . import triton_kernels

    return triton_kernels


def dithers(dtype: torch.dtype, bits: int, dithered: bool) -> bool:
    """Whether a tensor of ``dtype`` stored at ``bits`` by a dithering site gets a dithered blob."""
    return dithered and dtype.is_floating_point and bits != fmt.PASS_THROUGH_BITS


def encode(tensor: torch.Tensor, bits: int, group_size: int, *, state=None, key=None, count=None,
           dithered: bool = False) -> torch.Tensor:
    """Blob of a tensor's elements in row-major order, its noise keyed by a site's ``state`` or by
    ``key``; ``count`` (a callable, or None: do not count) counts the call in the site's state.
    ``dithered``: a float tensor's blob keeps its key, for a dithered decode."""
    dithered = dithers(tensor.dtype, bits, dithered)
    chosen = implementation(tensor, bits)
    if chosen == "triton":
        triton_kernels = _triton_codec()
        if tensor.dtype == torch.bool:
            blob = triton_kernels.pack_mask(tensor.contiguous())
        else:
            # contiguous of any rank, not flattened: traced (``lowering="triton"``), a reshape is
            # a buffer of its own that Inductor would write beside the activation
            return triton_kernels.quantize(tensor.contiguous(), bits, group_size, state=state, key=key,
                                           count=count is not None, dithered=dithered)
    elif chosen == "cpu" and (tensor.dtype == torch.bool or (
            group_size <= _cpu_codec().MAX_GROUP and tensor.dtype in _cpu_codec().DTYPE_CODES)):
        # the C++ codec reads any contiguous tensor as the 1-D one it holds
        cpu_kernels = _cpu_codec()
        if tensor.dtype == torch.bool:
            blob = cpu_kernels.pack_bool(tensor)
        else:
            blob = cpu_kernels.quantize(tensor, bits, group_size, state=state, key=key, dithered=dithered)
    else:
        flat = tensor.reshape(-1)
        noise = None
        if flat.dtype != torch.bool and bits != fmt.PASS_THROUGH_BITS and flat.numel():
            key = call_key(state) if key is None else key
            noise = rounding_noise(fmt.num_groups(flat.numel(), group_size), group_size, key)
        blob = quantize_reference(flat, bits, group_size, noise, key if dithered else None)
    if count is not None:
        count()
    return blob


def decode(blob: torch.Tensor, numel: int, dtype: torch.dtype, group_size: int, shape=None,
           bits: int | None = None, dithered: bool = False) -> torch.Tensor:
    """The ``numel`` elements of ``dtype`` a blob holds: 1-D, or contiguous of ``shape``. ``bits``
    is read from the blob's length unless given (a traced blob's length may be symbolic);
    ``dithered``: as ``encode`` wrote it."""
    bits = bits or fmt.bits_from_blob_nbytes(blob.numel())
    dithered = dithers(dtype, bits, dithered)
    chosen = implementation(blob, bits, dtype=dtype)
    if chosen == "cpu" and dtype != torch.bool:  # written in its final shape (a view costs a microsecond)
        return _cpu_codec().dequantize(blob, numel, dtype, group_size, shape=shape, dithered=dithered)
    if chosen == "triton":
        triton_kernels = _triton_codec()
        if dtype == torch.bool:
            flat = triton_kernels.unpack_mask(blob, numel, torch.bool)
        else:
            flat = triton_kernels.dequantize(blob, numel, dtype, group_size, bits, dithered)
    elif chosen == "cpu":
        flat = _cpu_codec().unpack_bool(blob, numel)
    else:
        flat = dequantize_reference(blob, numel, dtype, group_size, dithered)
    return flat if shape is None else flat.view(shape)


def decode_mask(blob: torch.Tensor, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """The ``numel`` values 0 and 1 of ``dtype`` that a bool blob holds."""
    chosen = implementation(blob, 1, dtype=torch.bool)
    if dtype == torch.float32 and chosen == "cpu":
        return _cpu_codec().unpack_mask(blob, numel)
    if chosen == "triton":
        return _triton_codec().unpack_mask(blob, numel, dtype)
    return decode(blob, numel, torch.bool, 8).to(dtype)  # (a mask's blob has no groups)


def _transposable(tensor: torch.Tensor, bits: int, tokens: int, features: int, group_size: int,
                  dtype: torch.dtype) -> str | None:
    """Which implementation reads and writes this feature-major matrix in place, if one does."""
    chosen = implementation(tensor, bits, dtype=dtype)
    if chosen == "cpu" and _cpu_codec().transposable(tokens, features, group_size, dtype):
        return "cpu"
    if chosen == "triton" and _triton_codec().features_in_place(tokens, features, group_size):
        return "triton"
    return None


def encode_permuted(x: torch.Tensor, perm, bits: int, group_size: int, *, state=None, key=None,
                    count=None, dithered: bool = False) -> torch.Tensor:
    """Blob of ``x`` taken in the logical order of ``x.permute(perm)`` (``dithered``: see ``encode``)."""
    perm = list(perm)
    if identity(perm):  # the common case, without the torch calls below (a microsecond each)
        return encode(x, bits, group_size, state=state, key=key, count=count, dithered=dithered)
    dithered = dithers(x.dtype, bits, dithered)
    if len(perm) >= 2 and x.stride(perm[0]) == 1:  # (the dimension a feature-major perm takes first is innermost)
        layout = [*perm[1:], perm[0]]  # where perm is feature-major, the layout it is read from
        features = x.shape[perm[0]]
        tokens = x.numel() // max(features, 1)
        in_place = x.permute(layout).is_contiguous() and _transposable(x, bits, tokens, features, group_size, x.dtype)
        if in_place:
            if in_place == "triton":  # (as it lies, features innermost: see ``encode``)
                return _triton_codec().quantize_transposed(x.permute(layout), bits, group_size, state=state, key=key,
                                                           count=count is not None, dithered=dithered)
            matrix = x.permute(layout).reshape(tokens, features)  # a view
            blob = _cpu_codec().quantize_transposed(matrix, bits, group_size, state=state, key=key, dithered=dithered)
            if count is not None:
                count()
            return blob
    return encode(x.permute(perm), bits, group_size, state=state, key=key, count=count, dithered=dithered)


def decode_permuted(blob: torch.Tensor, shape, dtype: torch.dtype, group_size: int, perm, layout=None,
                    bits: int | None = None, dithered: bool = False) -> torch.Tensor:
    """The tensor of ``shape`` that ``blob`` holds in the order of ``perm``, compact in
    ``layout`` (``runtime.layout.arrange``); ``bits`` and ``dithered`` as ``decode`` takes them."""
    numel = math.prod(shape)
    bits = bits or fmt.bits_from_blob_nbytes(blob.numel())
    if natural_order(perm, layout):  # decoded straight into its shape (``arrange`` would view it)
        return decode(blob, numel, dtype, group_size, shape=shape, bits=bits, dithered=dithered)
    dithered = dithers(dtype, bits, dithered)
    if dtype != torch.bool and feature_major(perm, layout):
        features = shape[layout[-1]]
        tokens = numel // max(features, 1)
        in_place = _transposable(blob, bits, tokens, features, group_size, dtype)
        if in_place:
            if in_place == "triton":
                matrix = _triton_codec().dequantize_transposed(blob, tokens, features, dtype, group_size, bits,
                                                               dithered)
            else:
                matrix = _cpu_codec().dequantize_transposed(blob, tokens, features, dtype, group_size, dithered)
            return matrix.view([shape[dim] for dim in layout]).permute(inverse_permutation(layout))
    return arrange(decode(blob, numel, dtype, group_size, bits=bits, dithered=dithered), shape, perm, layout)
