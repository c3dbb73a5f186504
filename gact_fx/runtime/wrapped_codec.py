"""The Triton kernels launched through ``torch.library.wrap_triton``, for tracing into graphs.

``passes.lower`` traces ``encode`` / ``decode`` in place of the opaque ``gact::`` ops with
``lowering="triton"``: each launch becomes a node Inductor sees (a user-defined Triton
kernel), so Inductor launches it from its own generated code, orders it among its
kernels and captures it in CUDA graphs, without a custom op's dispatch, our Python and
Triton's launcher around every call. The kernels, and so the blobs, are those of the ops
(``runtime.triton_kernels``); the noise is keyed by the forward's ``gact::keys``, as in the
aten lowering; a dithered blob keeps that key for its decode, as the op's does. Only for
bit widths fixed at compile time, and only where Triton serves the tensor (CUDA, or
``GACT_FX_KERNELS=triton`` under ``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from . import format as fmt
from .kernels import decode_permuted, encode_permuted, implementation
from .launches import through_wrap_triton


def _check_triton(tensor: torch.Tensor, bits: int, dtype: torch.dtype | None = None) -> None:
    served = implementation(tensor, bits, dtype=dtype)
    if served != "triton" and not (served == "reference" and bits == fmt.PASS_THROUGH_BITS):
        raise ValueError(
            f"lowering='triton' launches gact's Triton kernels, which do not serve this {tensor.device.type} "
            f"tensor (they serve CUDA tensors, or any with GACT_FX_KERNELS=triton and TRITON_INTERPRET=1); "
            "use lowering='op' or 'auto'"
        )


def encode(x: torch.Tensor, perm: Sequence[int], bits: int, group_size: int, key: torch.Tensor,
           dithered: bool = False) -> torch.Tensor:
    if x.dtype == torch.uint8:
        x = x.view(torch.bool)  # a mask as bytes, as the op takes it
    _check_triton(x, bits)
    with through_wrap_triton():
        return encode_permuted(x, perm, bits, group_size, key=key, dithered=dithered)


def decode(blob: torch.Tensor, shape: Sequence, dtype: torch.dtype, group_size: int, perm: Sequence[int], bits: int,
           layout: Sequence[int] | None = None, dithered: bool = False) -> torch.Tensor:
    _check_triton(blob, bits, dtype)
    with through_wrap_triton():
        return decode_permuted(blob, shape, dtype, group_size, perm, layout, bits=bits, dithered=dithered)
