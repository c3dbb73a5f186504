"""The packed format written with plain aten ops, for Inductor to fuse into neighbouring kernels.

``encode`` / ``decode`` produce and read exactly the blob of ``runtime.format`` (they call
the reference's branch-free ``encode_groups`` / ``decode_groups``); ``passes.lower``
traces them into the graphs in place of the opaque ``gact::`` ops, so Inductor can fuse
the min/max reduction into the kernel that produced the activation and the decode into
the kernel that consumes it. The rounding noise is ``runtime.noise``'s hash, traced too,
keyed by the call's key tensor (``gact::keys``, read on the device): the same noise as
the ops' kernels, so both lowerings write the same blob. Only for bit widths fixed at
compile time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from . import format as fmt
from .noise import rounding_noise
from .layout import arrange
from .reference import decode_bool, decode_groups, decode_raw, encode_groups, quantize_reference


def _refuse_dither(dithered: bool) -> None:
    if dithered:  # GactConfig refuses it first
        raise ValueError("lowering='aten' writes plain blobs; rounding='dithered' needs lowering='op', 'auto' or 'triton'")


def encode(x: torch.Tensor, perm: Sequence[int], bits: int, group_size: int, key: torch.Tensor,
           dithered: bool = False) -> torch.Tensor:
    _refuse_dither(dithered)
    flat = x.permute(list(perm)).reshape(-1)
    if x.dtype == torch.bool or bits == fmt.PASS_THROUGH_BITS:
        return quantize_reference(flat, bits, group_size, None)
    noise = rounding_noise(fmt.num_groups(flat.numel(), group_size), group_size, key)
    return encode_groups(flat, bits, group_size, noise)


def decode(blob, shape: Sequence, dtype: torch.dtype, group_size: int, perm: Sequence[int], bits: int,
           layout: Sequence[int] | None = None, dithered: bool = False) -> torch.Tensor:
    _refuse_dither(dithered)
    numel = math.prod(shape)
    if dtype == torch.bool:
        flat = decode_bool(blob, numel)
    elif bits == fmt.PASS_THROUGH_BITS:
        flat = decode_raw(blob, numel, dtype)
    else:
        flat = decode_groups(blob, numel, dtype, group_size, bits)
    return arrange(flat, shape, perm, layout)
