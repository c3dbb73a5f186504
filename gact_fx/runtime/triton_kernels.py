"""The Triton path of the packed format: which kernel serves a call, its shape, its launch.

Imported only when used (``runtime.kernels``): importing it imports Triton. The kernels
(``triton_encode``, ``triton_decode``) write and read exactly the blob of the torch
reference (``runtime.reference``), bit for bit, with the same rounding noise
(``runtime.noise``), read on the device from a site's state or from an explicit key: a
CUDA graph replays a launch with the counter's new value. A quantize keyed by a site's
state also counts the call there (``count=True``), in the kernel: no extra launch.

Groups (a multiple of 16 elements) take the chunked kernels, designed for memory speed;
feature-major groups (``feature_groups``) whose tokens fill whole groups are read and
written in the source's own layout. Masks pack and unpack in Triton too.

Every launch goes through ``runtime.launches.launch``, so the compile check
(``runtime.compile_check``) compiles exactly what ran. Under ``TRITON_INTERPRET=1`` the
kernels run on CPU tensors (slowly): that is how their semantics are tested without a GPU.
"""

from __future__ import annotations

import contextlib
import functools
import os
from dataclasses import dataclass

import torch

from . import format as fmt
from .launches import launch
from .noise import noise_source
from .program_sizes import elements_in_a_program
from .triton_decode import decode_chunked_kernel, decode_features_kernel, pack_mask_kernel, unpack_mask_kernel
from .triton_encode import encode_chunked_kernel, encode_features_kernel, noise_kernel

MASK_WORDS = 128  # 4096 mask elements a program
WARPS = 4
_INT32_LIMIT = 2**31


# Host arithmetic in plain Python: Triton's helpers of the same names are constexpr
# functions in recent Triton, a few microseconds a call, and every launch makes several.
def _next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _capped_power_of_2(n: int, cap: int) -> int:
    """The least power of two at least ``n``, at most ``cap``. ``cap`` for a symbolic ``n`` (a
    launch traced with dynamic shapes, ``passes.lower``): a program's size is fixed
    when the kernel compiles."""
    return min(cap, _next_power_of_2(n)) if isinstance(n, int) else cap


# The dtype's largest finite value is a constant of each launch, not an argument: Inductor
# types a Python float argument fp64, which the kernels' fp32 arithmetic does not take.
_DTYPE_MAX = {dtype: float(torch.finfo(dtype).max) for dtype in (torch.float32, torch.bfloat16, torch.float16)}


def _dtype_max(dtype: torch.dtype) -> float:
    found = _DTYPE_MAX.get(dtype)
    return float(torch.finfo(dtype).max) if found is None else found


@dataclass(frozen=True)
class Shape:
    """How a kernel takes a group size: 16-element chunks per group, groups per program, warps."""

    chunks: int  # a power of two, padded past the group's own
    rows: int  # groups (feature-major: features) a program holds
    general_rows: int  # groups the general path takes at a time
    warps: int


def block_shape(group_size: int, rows_needed: int, itemsize: int, bits: int, *, feature_major: bool = False,
                decoding: bool = False) -> Shape:
    """The shape for ``rows_needed`` groups (feature-major: features) in all of ``itemsize``-byte
    elements at ``bits``: a program holds no more rows than that (rounded up to a power of
    two), so a small tensor is not padded to a program's worth."""
    size = elements_in_a_program(itemsize, bits, feature_major=feature_major, decoding=decoding)
    return _block_shape(group_size, _capped_power_of_2(rows_needed, size), size)


@functools.lru_cache(maxsize=1024)
def _block_shape(group_size: int, rows_needed: int, per_program: int) -> Shape:
    fmt.check_group_size(group_size)
    chunks = _next_power_of_2(group_size // 16)
    rows = min(rows_needed, max(1, per_program // (16 * chunks)))
    return Shape(chunks, rows, max(1, min(rows, 512 // (16 * chunks))), WARPS)


_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # as Triton reads it: once, at import


def interpreted() -> bool:
    """Whether the kernels run under Triton's interpreter (``TRITON_INTERPRET=1``, read at import)."""
    return _INTERPRETED


def _on_device(tensor: torch.Tensor):
    """Launch on ``tensor``'s GPU, which need not be the current one (Triton launches on the current)."""
    if tensor.is_cuda and tensor.device.index != torch.cuda.current_device():
        return torch.cuda.device(tensor.device)
    return contextlib.nullcontext()


def _grid(items: int, per_program: int) -> tuple[int]:
    programs = _cdiv(items, per_program)
    return (max(1, programs) if isinstance(programs, int) else programs,)


def rounding_noise(groups: int, group_size: int, *, state=None, key=None) -> torch.Tensor:
    """The ``(G, group_size)`` noise ``quantize`` draws for a state or key (for tests)."""
    fmt.check_group_size(group_size)
    source, from_state = noise_source(state, key)
    out = torch.empty(groups, group_size, device=source.device, dtype=torch.float32)
    lanes = _next_power_of_2(group_size)
    rows = max(1, 1024 // lanes)
    with _on_device(out):
        launch(noise_kernel, _grid(groups, rows), {"out_ptr": out, "num_groups": groups, "key_ptr": source},
               {"FROM_STATE": from_state, "GROUP": group_size, "LANES": lanes, "BLOCK": rows}, num_warps=WARPS)
    return out


def _new_blob(numel: int, bits: int, group_size: int, itemsize: int, device, dithered: bool) -> torch.Tensor:
    return torch.empty(fmt.float_blob_nbytes(numel, bits, group_size, itemsize, dithered), dtype=torch.uint8,
                       device=device)


def quantize(flat: torch.Tensor, bits: int, group_size: int, *, state=None, key=None, count: bool = False,
             dithered: bool = False) -> torch.Tensor:
    """Blob of a contiguous float tensor (of any rank, read as 1-D) at ``bits`` in {1, 2, 3, 4,
    8}; ``count``: advance the site's counter (``state``) in the kernel; ``dithered``: a blob
    that keeps its key (``runtime.format``)."""
    source, from_state = noise_source(state, key)
    numel = flat.numel()
    groups = fmt.num_groups(numel, group_size)
    blob = _new_blob(numel, bits, group_size, flat.element_size(), flat.device, dithered)
    shape = block_shape(group_size, groups, flat.element_size(), bits)
    with _on_device(flat):
        launch(encode_chunked_kernel, _grid(groups, shape.rows),
               {"x_ptr": flat, "blob_ptr": blob, "numel": numel, "num_groups": groups, "nbytes": blob.numel(),
                "key_ptr": source},
               {"DTYPE_MAX": _dtype_max(flat.dtype),
                "FROM_STATE": from_state, "ADVANCE": from_state and count, "BITS": bits, "GROUP": group_size,
                "CHUNKS": shape.chunks, "BLOCK": shape.rows, "PARTIAL": bool(numel % group_size != 0),
                "WIDE": bool(numel >= _INT32_LIMIT), "GENERAL_ROWS": shape.general_rows,
                "INTERPRETED": interpreted(), "GENERAL": True, "KEYED": dithered},
               num_warps=shape.warps)
    return blob


def features_in_place(tokens: int, features: int, group_size: int) -> bool:
    """Whether a [tokens, features] matrix's feature-major groups are read and written in place:
    its tokens fill whole groups."""
    return tokens % group_size == 0 and tokens > 0 and features > 0


def quantize_transposed(matrix: torch.Tensor, bits: int, group_size: int, *, state=None, key=None,
                        count: bool = False, dithered: bool = False) -> torch.Tensor:
    """The blob of ``matrix.t()`` (feature-major groups) from a row-major [tokens, features]
    matrix (or a contiguous tensor of any rank, its innermost dimension the features), read
    in place (``features_in_place`` must hold)."""
    source, from_state = noise_source(state, key)
    numel = matrix.numel()
    features = matrix.shape[-1]
    tokens = numel // features
    token_blocks = tokens // group_size
    blob = _new_blob(numel, bits, group_size, matrix.element_size(), matrix.device, dithered)
    shape = block_shape(group_size, features, matrix.element_size(), bits, feature_major=True)
    with _on_device(matrix):
        launch(encode_features_kernel, (token_blocks * _cdiv(features, shape.rows),),
               {"x_ptr": matrix, "blob_ptr": blob, "numel": numel, "num_groups": token_blocks * features,
                "nbytes": blob.numel(), "key_ptr": source, "token_blocks": token_blocks, "row_stride": features},
               {"DTYPE_MAX": _dtype_max(matrix.dtype),
                "FROM_STATE": from_state, "ADVANCE": from_state and count, "BITS": bits, "GROUP": group_size,
                "CHUNKS": shape.chunks, "BLOCK": shape.rows, "WIDE": bool(numel >= _INT32_LIMIT),
                "GENERAL_ROWS": shape.general_rows, "INTERPRETED": interpreted(), "GENERAL": True, "KEYED": dithered},
               num_warps=shape.warps)
    return blob


def dequantize(blob: torch.Tensor, numel: int, dtype: torch.dtype, group_size: int,
               bits: int | None = None, dithered: bool = False) -> torch.Tensor:
    """Decode a quantized blob into a 1-D tensor (``bits``: read from its length unless given;
    ``dithered``: a blob that keeps its key)."""
    bits = bits or fmt.bits_from_blob_nbytes(blob.numel())
    groups = fmt.num_groups(numel, group_size)
    out = torch.empty(numel, dtype=dtype, device=blob.device)
    shape = block_shape(group_size, groups, out.element_size(), bits, decoding=True)
    with _on_device(blob):
        launch(decode_chunked_kernel, _grid(groups, shape.rows),
               {"blob_ptr": blob, "out_ptr": out, "numel": numel, "num_groups": groups},
               {"DTYPE_MAX": _dtype_max(dtype), "BITS": bits,
                "GROUP": group_size, "CHUNKS": shape.chunks, "BLOCK": shape.rows,
                "PARTIAL": bool(numel % group_size != 0), "WIDE": bool(numel >= _INT32_LIMIT), "DITHER": dithered,
                "INTERPRETED": interpreted(), "GENERAL": True},
               num_warps=shape.warps)
    return out


def dequantize_transposed(blob: torch.Tensor, tokens: int, features: int, dtype: torch.dtype,
                          group_size: int, bits: int | None = None, dithered: bool = False) -> torch.Tensor:
    """The row-major [tokens, features] matrix whose feature-major blob ``blob`` is."""
    bits = bits or fmt.bits_from_blob_nbytes(blob.numel())
    token_blocks = tokens // group_size
    out = torch.empty(tokens, features, dtype=dtype, device=blob.device)
    shape = block_shape(group_size, features, out.element_size(), bits, feature_major=True)
    with _on_device(blob):
        launch(decode_features_kernel, (token_blocks * _cdiv(features, shape.rows),),
               {"blob_ptr": blob, "out_ptr": out, "num_groups": token_blocks * features,
                "token_blocks": token_blocks, "row_stride": features},
               {"DTYPE_MAX": _dtype_max(dtype), "BITS": bits,
                "GROUP": group_size, "CHUNKS": shape.chunks, "BLOCK": shape.rows,
                "WIDE": bool(tokens * features >= _INT32_LIMIT), "DITHER": dithered,
                "INTERPRETED": interpreted(), "GENERAL": True},
               num_warps=shape.warps)
    return out


def pack_mask(mask: torch.Tensor) -> torch.Tensor:
    """The 1-bit blob of a bool (or 0/1 uint8) tensor, contiguous."""
    numel = mask.numel()
    blob = torch.empty(fmt.bool_blob_nbytes(numel), dtype=torch.uint8, device=mask.device)
    words = _cdiv(numel, 32)
    per_program = _capped_power_of_2(words, MASK_WORDS)
    with _on_device(mask):
        launch(pack_mask_kernel, _grid(words, per_program),
               {"mask_ptr": mask, "blob_ptr": blob, "numel": numel, "nbytes": blob.numel()},
               {"WORDS": per_program}, num_warps=WARPS)
    return blob


def unpack_mask(blob: torch.Tensor, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """The ``numel`` 0s and 1s of ``dtype`` (bool included) a mask's blob holds."""
    out = torch.empty(numel, dtype=dtype, device=blob.device)
    words = _cdiv(numel, 32)
    per_program = _capped_power_of_2(words, MASK_WORDS)
    with _on_device(blob):
        launch(unpack_mask_kernel, _grid(words, per_program),
               {"blob_ptr": blob, "out_ptr": out, "numel": numel}, {"WORDS": per_program}, num_warps=WARPS)
    return out
