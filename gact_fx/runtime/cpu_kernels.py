"""The CPU codec: quantize and dequantize in one pass over each group, in C++, on torch's threads.

The torch reference (``runtime.reference``) builds the blob out of dozens of tensor ops,
each a full pass over the activation with its own temporary (the noise hash alone is a
dozen int64 tensors): on the CPU that cost more than the training step it compresses,
and its temporaries raised the peak memory. This kernel does, per group of
``group_size`` elements held in the L1 cache: min, max, special values and NaN; the
scale; the noise (``runtime.noise``'s hash, one vector of hashes serving two vectors of
elements), the rounding and the packing, in GCC/Clang vector types: sixteen lanes at a
time where the machine has AVX-512 (Inductor compiles with ``-march=native``), the codes
of 64 elements saturated into one vector of bytes, gathered by multiply-adds and put in
order by one byte shuffle (at 1 bit, compare masks), and eight lanes elsewhere; decode
is one pass too. A dithered blob's call key (``runtime.format``) is written by the encoder
and read back by the decoder in C++ as well, so dithering adds no Python to either call.
For ``feature_groups`` a second pair of kernels takes a row-major [tokens, features]
matrix and writes the blob of its transpose (each group one feature's tokens, eight or
sixteen groups in as many lanes), and decodes back into the matrix: no transposed copy
either way. bool masks (ReLU's, dropout's) are packed eight to a byte here too. Groups
run in parallel under OpenMP, which follows ``torch.set_num_threads``. (Inductor compiles
with ``-fno-tree-loop-vectorize``: loops left to the auto-vectoriser ran 4x slower.)

It writes exactly the reference's blob, bit for bit (the same float operations, in the
same order; the one fused multiply-add, in the uniforms, is exact). The C++ source is
``cpu_codec.cpp`` beside this module (package data); ``SIGNATURES`` types its exports for
ctypes. It is compiled on first use by Inductor's C++ toolchain (the compiler Inductor
needs on the CPU anyway), one library per input dtype (each compiles faster than one for
all three would; then cached on disk): no build step at install. If that fails, a warning says so and the
reference serves instead.
float32, bfloat16 and float16 are read as they are (converted to float32 in registers, as
the reference's arithmetic is float32); decode writes each dtype directly, rounding to
nearest even as torch's conversion does.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.resources
import logging

import torch

from .. import _compat
from . import format as fmt
from .noise import noise_source
from .reference import HALF_MAX

log = logging.getLogger("gact_fx")
MAX_GROUP = 4096  # the kernel's buffers; larger groups take the reference
DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
NO_HALF_STORE = 3  # gact_decode's answer for float16 on a machine without F16C

_POINTER, _SIZE, _FLAG, _FLOAT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
# Each exported function of ``cpu_codec.cpp``: (argument types, return type), in the order of its C signature.
SIGNATURES = {
    "gact_encode": ([_POINTER, _SIZE, _SIZE, _POINTER, _SIZE, _POINTER, _FLAG, _FLAG, _FLOAT, _FLOAT, _FLAG, _FLAG],
                    _FLAG),
    "gact_decode": ([_POINTER, _SIZE, _SIZE, _POINTER, _FLAG, _FLOAT, _FLAG, _FLAG], _FLAG),
    "gact_noise": ([ctypes.c_uint64, _SIZE, _POINTER, _POINTER], None),
    "gact_encode_transposed": ([_POINTER, _SIZE, _SIZE, _SIZE, _POINTER, _SIZE, _POINTER, _FLAG, _FLAG, _FLOAT, _FLOAT,
                                _FLAG, _FLAG], _FLAG),
    "gact_decode_transposed": ([_POINTER, _SIZE, _SIZE, _SIZE, _POINTER, _FLAG, _FLOAT, _FLAG, _FLAG], _FLAG),
    "gact_pack_bool": ([_POINTER, _SIZE, _POINTER, _SIZE], None),
    "gact_unpack_bool": ([_POINTER, _SIZE, _POINTER], None),
    "gact_unpack_mask": ([_POINTER, _SIZE, _POINTER], None),
}


def source() -> str:
    """The codec's C++ source (``cpu_codec.cpp``, shipped with the package)."""
    return importlib.resources.files(__package__).joinpath("cpu_codec.cpp").read_text()


@functools.cache
def library(dtype: torch.dtype = torch.float32):
    """The codec compiled for inputs of ``dtype`` (float32 serves the dtype-free bool and noise
    kernels), or None (with a warning) when it cannot be built here."""
    try:
        lib = _compat.compile_cpp_library(f"#define GACT_DTYPE {DTYPE_CODES.get(dtype, 0)}\n" + source())
    except Exception as error:  # no compiler, or a broken toolchain: the reference still works
        log.warning("gact: the CPU codec could not be compiled (%s: %s); the slower torch reference serves instead",
                    type(error).__name__, str(error).splitlines()[0][:200])
        return None
    for name, (argtypes, restype) in SIGNATURES.items():
        function = getattr(lib, name)
        function.argtypes, function.restype = argtypes, restype
    return lib


def available(dtype: torch.dtype = torch.float32) -> bool:
    return library(dtype) is not None


def _new_blob(numel: int, bits: int, group_size: int, itemsize: int, dithered: bool) -> torch.Tensor:
    """An uninitialised blob of the format's length: the codec writes every byte, tail included."""
    return torch.empty(fmt.float_blob_nbytes(numel, bits, group_size, itemsize, dithered), dtype=torch.uint8)


def quantize(tensor: torch.Tensor, bits: int, group_size: int, *, state=None, key=None,
             dithered: bool = False) -> torch.Tensor:
    """Blob of a float CPU tensor's elements in row-major order at ``bits`` in {1, 2, 3, 4, 8}
    (the reference's, bit for bit; ``dithered``: with its key, ``runtime.format``)."""
    source, from_state = noise_source(state, key)
    values = tensor.contiguous()
    numel = values.numel()
    blob = _new_blob(numel, bits, group_size, values.element_size(), dithered)
    status = library(values.dtype).gact_encode(values.data_ptr(), numel, group_size, blob.data_ptr(), blob.numel(),
                                               source.data_ptr(), from_state, bits, float(torch.finfo(values.dtype).max),
                                               HALF_MAX, DTYPE_CODES[values.dtype], dithered)
    if status:
        raise ValueError(f"gact CPU codec: unsupported width {bits} or group size {group_size} (at most {MAX_GROUP})")
    return blob


def pack_bool(mask: torch.Tensor) -> torch.Tensor:
    """The blob of a bool CPU tensor's elements in row-major order: one bit an element, lossless
    (the reference's, bit for bit)."""
    mask = mask.contiguous()
    numel = mask.numel()
    blob = torch.empty(fmt.bool_blob_nbytes(numel), dtype=torch.uint8)
    library().gact_pack_bool(mask.data_ptr(), numel, blob.data_ptr(), blob.numel())
    return blob


def unpack_bool(blob: torch.Tensor, numel: int) -> torch.Tensor:
    """The ``numel`` bools a ``pack_bool`` blob holds."""
    blob = blob.contiguous()
    out = torch.empty(numel, dtype=torch.bool)
    library().gact_unpack_bool(blob.data_ptr(), numel, out.data_ptr())
    return out


def unpack_mask(blob: torch.Tensor, numel: int) -> torch.Tensor:
    """The ``numel`` bits of a ``pack_bool`` blob as float32 0 and 1."""
    blob = blob.contiguous()
    out = torch.empty(numel, dtype=torch.float32)
    library().gact_unpack_mask(blob.data_ptr(), numel, out.data_ptr())
    return out


def transposable(tokens: int, features: int, group_size: int, dtype: torch.dtype) -> bool:
    """Whether the feature-major kernels take a [tokens, features] matrix of ``dtype``: every
    group then holds ``group_size`` tokens of one feature, eight features at a time."""
    return (dtype in DTYPE_CODES and group_size % 16 == 0 and tokens > 0 and tokens % group_size == 0
            and features % 8 == 0 and features > 0)


def quantize_transposed(matrix: torch.Tensor, bits: int, group_size: int, *, state=None, key=None,
                        dithered: bool = False) -> torch.Tensor:
    """The blob of ``matrix.t().reshape(-1)``, read from the row-major [tokens, features]
    ``matrix`` in place (no transposed copy); bit for bit the blob ``quantize`` writes."""
    source, from_state = noise_source(state, key)
    tokens, features = matrix.shape
    values = matrix.contiguous()
    blob = _new_blob(values.numel(), bits, group_size, values.element_size(), dithered)
    status = library(values.dtype).gact_encode_transposed(values.data_ptr(), tokens, features, group_size,
                                                          blob.data_ptr(), blob.numel(), source.data_ptr(), from_state,
                                                          bits, float(torch.finfo(values.dtype).max), HALF_MAX,
                                                          DTYPE_CODES[values.dtype], dithered)
    if status:
        raise ValueError(f"gact CPU codec: no feature-major encoding of {tokens} x {features} at {bits} bits in "
                         f"groups of {group_size}")
    return blob


def noise(key: torch.Tensor, first: int, count: int) -> torch.Tensor:
    """The kernel's rounding noise for elements ``first`` .. ``first + count - 1`` (both multiples of 16)."""
    out = torch.empty(count, dtype=torch.float32)
    library().gact_noise(first, count, key.contiguous().data_ptr(), out.data_ptr())
    return out


def dequantize(blob: torch.Tensor, numel: int, dtype: torch.dtype, group_size: int, shape=None,
               dithered: bool = False) -> torch.Tensor:
    """Decode a quantized CPU blob (``bits`` read from its length) into a tensor of ``dtype``:
    1-D, or contiguous of ``shape`` (of ``numel`` elements); written in ``dtype`` directly (as
    torch would convert the float32 values). ``dithered``: a blob that keeps its key."""
    bits = fmt.bits_from_blob_nbytes(blob.numel())
    blob = blob.contiguous()
    dmax = float(torch.finfo(dtype).max)
    out = torch.empty(numel if shape is None else shape, dtype=dtype)
    status = library(dtype).gact_decode(blob.data_ptr(), numel, group_size, out.data_ptr(), bits, dmax,
                                        DTYPE_CODES[dtype], dithered)
    if status == NO_HALF_STORE:
        wide = torch.empty(out.shape, dtype=torch.float32)
        status = library(torch.float32).gact_decode(blob.data_ptr(), numel, group_size, wide.data_ptr(), bits, dmax, 0,
                                                    dithered)
        out = wide.to(dtype)
    if status:
        raise ValueError(f"gact CPU codec: unsupported width {bits}")
    return out


def dequantize_transposed(blob: torch.Tensor, tokens: int, features: int, dtype: torch.dtype,
                          group_size: int, dithered: bool = False) -> torch.Tensor:
    """The row-major [tokens, features] matrix whose transpose ``blob`` encodes (the mirror of
    ``quantize_transposed``): ``dequantize(...).view(features, tokens).t()``, without the copy."""
    bits = fmt.bits_from_blob_nbytes(blob.numel())
    blob = blob.contiguous()
    dmax = float(torch.finfo(dtype).max)
    out = torch.empty(tokens, features, dtype=dtype)
    decode = library(dtype).gact_decode_transposed
    status = decode(blob.data_ptr(), tokens, features, group_size, out.data_ptr(), bits, dmax, DTYPE_CODES[dtype],
                    dithered)
    if status == NO_HALF_STORE:
        wide = torch.empty(tokens, features, dtype=torch.float32)
        status = library(torch.float32).gact_decode_transposed(blob.data_ptr(), tokens, features, group_size,
                                                               wide.data_ptr(), bits, dmax, 0, dithered)
        out = wide.to(dtype)
    if status:
        raise ValueError(f"gact CPU codec: no feature-major decoding of {tokens} x {features} at {bits} bits in "
                         f"groups of {group_size}")
    return out
