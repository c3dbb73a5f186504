"""A random-sign Hadamard rotation of blocks along a tensor's innermost dimension.

With ``rotation=B`` a site rotates each block of ``B`` elements along the innermost
dimension, ``x -> x @ M`` with ``M = diag(signs) H / sqrt(B)`` orthogonal, before it
quantizes, and rotates the decoded values back (``y @ M^T``). Rounding stays unbiased
(``E[Q(xM)] M^T = x``); what changes is each group's range, which shrinks where a few
features carry outliers. The signs are fixed (one seed), so a blob stays reproducible;
the blob itself is an ordinary one of the rotated values. Tensors whose innermost
dimension ``B`` does not divide, masks and 32-bit pass-through are not rotated.
"""

from __future__ import annotations

import functools
import math

import torch

from . import format as fmt

BLOCKS = (16, 32, 64, 128, 256)
_SIGN_SEED = 0x5EED_4AD


def check_block(block: int, name: str = "rotation") -> None:
    if block != 0 and block not in BLOCKS:
        raise ValueError(f"{name} must be 0 (off) or one of {BLOCKS}, got {block!r}")


def rotates(shape, dtype: torch.dtype, bits: int, block: int) -> bool:
    """Whether a tensor of ``shape`` and ``dtype`` stored at ``bits`` is rotated by ``block`` (0: never)."""
    return (block > 0 and dtype.is_floating_point and bits != fmt.PASS_THROUGH_BITS and len(shape) > 0
            and shape[-1] % block == 0)


@functools.cache
def rotation_matrix(block: int, device: torch.device) -> torch.Tensor:
    """``diag(signs) H / sqrt(block)`` (fp32): rows of the Sylvester-Hadamard matrix, signs flipped."""
    hadamard = torch.ones(1, 1)
    while hadamard.shape[0] < block:
        hadamard = torch.cat([torch.cat([hadamard, hadamard], 1), torch.cat([hadamard, -hadamard], 1)], 0)
    generator = torch.Generator().manual_seed(_SIGN_SEED + block)
    signs = torch.randint(0, 2, (block, 1), generator=generator).float() * 2 - 1
    return (signs * hadamard / math.sqrt(block)).to(device)


def rotate(x: torch.Tensor, block: int) -> torch.Tensor:
    """``x`` rotated blockwise along its innermost dimension: a new contiguous tensor of its dtype."""
    blocks = x.reshape(-1, block).float()
    return (blocks @ rotation_matrix(block, x.device)).reshape(x.shape).to(x.dtype)


def unrotate_(y: torch.Tensor, block: int) -> torch.Tensor:
    """Rotate ``y`` back, in place (so that it keeps its strides); returns ``y``."""
    blocks = y.reshape(-1, block).float()
    y.copy_((blocks @ rotation_matrix(block, y.device).T).reshape(y.shape))
    return y
