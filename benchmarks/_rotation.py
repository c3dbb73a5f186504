"""A candidate format for measurement only: a random-sign Hadamard rotation before quantizing.

``rotated_blobs(block)`` wraps the runtime's permuted encode and decode so that each lossy
float tensor whose innermost dimension ``block`` divides is rotated blockwise along that
dimension (``x -> (x * signs) @ H / sqrt(block)``) before it is encoded, and rotated back
after it is decoded. ``H`` is orthogonal, so with unbiased rounding the decoded tensor stays
an unbiased estimate of ``x``; what changes is each group's range. Blobs keep the format;
the sign vector is fixed (one draw per run). Adaptive probes re-encode the unrotated values,
so only uniform widths measure the rotation alone.
"""

from __future__ import annotations

import contextlib
import math

import torch

from gact_fx.runtime import format as fmt
from gact_fx.runtime import ops


def hadamard(block: int) -> torch.Tensor:
    """The orthonormal Sylvester-Hadamard matrix of order ``block`` (a power of two)."""
    if block < 1 or block & (block - 1):
        raise ValueError(f"a Hadamard block must be a power of two, got {block}")
    matrix = torch.ones(1, 1)
    while matrix.shape[0] < block:
        matrix = torch.cat([torch.cat([matrix, matrix], 1), torch.cat([matrix, -matrix], 1)], 0)
    return matrix / math.sqrt(block)


class _Rotation:
    def __init__(self, block: int, only_bits: int | None, seed: int = 0):
        self.block, self.only_bits = block, only_bits
        self.matrix = hadamard(block)
        generator = torch.Generator().manual_seed(seed)
        self.signs = torch.randint(0, 2, (block,), generator=generator).float() * 2 - 1
        self.rotated_numel = 0
        self.lossy_numel = 0

    def applies(self, shape, dtype: torch.dtype, bits: int) -> bool:
        if dtype not in (torch.float32, torch.bfloat16, torch.float16) or bits == 32 or not len(shape):
            return False
        if self.only_bits is not None and bits != self.only_bits:
            return False
        return shape[-1] % self.block == 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        blocks = x.float().reshape(-1, x.shape[-1] // self.block, self.block)
        return ((blocks * self.signs) @ self.matrix).reshape(x.shape).to(x.dtype)

    def inverse(self, y: torch.Tensor) -> torch.Tensor:
        blocks = y.float().reshape(-1, y.shape[-1] // self.block, self.block)
        out = torch.empty_like(y)  # the decoded tensor's own strides
        out.copy_(((blocks @ self.matrix) * self.signs).reshape(y.shape))
        return out


@contextlib.contextmanager
def rotated_blobs(block: int, only_bits: int | None = None):
    """Within the block, lossy encodes are rotated first (see the module docstring)."""
    rotation = _Rotation(block, only_bits)
    encode, decode = ops.encode_permuted, ops.decode_permuted

    def encode_rotated(x, perm, bits, group_size, **kwargs):
        if x.dtype != torch.bool:
            rotation.lossy_numel += x.numel() if bits != 32 else 0
            if rotation.applies(x.shape, x.dtype, bits):
                rotation.rotated_numel += x.numel()
                x = rotation.forward(x)
        return encode(x, perm, bits, group_size, **kwargs)

    def decode_rotated(blob, shape, dtype, group_size, perm, layout=None):
        y = decode(blob, shape, dtype, group_size, perm, layout)
        if rotation.applies(shape, dtype, fmt.bits_from_blob_nbytes(blob.numel())):
            y = rotation.inverse(y)
        return y

    ops.encode_permuted, ops.decode_permuted = encode_rotated, decode_rotated
    try:
        yield rotation
    finally:
        ops.encode_permuted, ops.decode_permuted = encode, decode
