"""The packed format written with plain aten ops, for Inductor to fuse into neighbouring kernels.

``encode`` / ``decode`` produce and read exactly the blob of ``runtime.format`` (they call
the reference's branch-free ``encode_groups`` / ``decode_groups``); ``passes.lower_aten``
traces them into the graphs in place of the opaque ``gact::`` ops, so Inductor can fuse
the min/max reduction into the kernel that produced the activation and the decode into
the kernel that consumes it. The rounding noise is ``prims.inductor_random`` keyed by a
per-call seed tensor (``gact::seeds``, in ``runtime.ops``): Philox inside Inductor's kernels, never torch's
global generator. Only meaningful under Inductor (eagerly, that prim ignores the seed),
and only for bit widths fixed at compile time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from .. import _compat
from . import format as fmt
from .ops import inverse_permutation
from .reference import decode_bool, decode_groups, decode_raw, encode_groups, quantize_reference

_compat.register_inductor_random()  # the aten path only: this module is imported by passes.lower_aten


def encode(x: torch.Tensor, perm: Sequence[int], bits: int, group_size: int, seed: torch.Tensor) -> torch.Tensor:
    flat = x.permute(list(perm)).reshape(-1)
    if x.dtype == torch.bool or bits == fmt.PASS_THROUGH_BITS:
        return quantize_reference(flat, bits, group_size, None)
    groups = fmt.num_groups(flat.numel(), group_size)
    noise = torch.ops.prims.inductor_random([groups, group_size], seed, "rand")
    return encode_groups(flat, bits, group_size, noise)


def decode(blob, shape: Sequence, dtype: torch.dtype, group_size: int, perm: Sequence[int], bits: int) -> torch.Tensor:
    numel = math.prod(shape)
    if dtype == torch.bool:
        flat = decode_bool(blob, numel)
    elif bits == fmt.PASS_THROUGH_BITS:
        flat = decode_raw(blob, numel, dtype)
    else:
        flat = decode_groups(blob, numel, dtype, group_size, bits)
    return flat.view([shape[dim] for dim in perm]).permute(inverse_permutation(perm))
