"""The ``gact::`` custom ops that the graph passes insert, and their graph contract.

``gact::quantize(Tensor x, int bits, int group_size, int[] perm, int slot) -> Tensor``
    Encodes ``x`` into one flat uint8 blob (format: ``runtime.format``). The elements are
    taken in the *logical* order of ``x.permute(perm)``, never in memory order, so the
    result does not depend on the strides the compiler picked for ``x``; ``perm`` is
    chosen by the pass so that this permute is a no-op for the layout seen at compile
    time. ``slot`` names the saved-tensor site; it picks the rounding seed
    (``runtime.seeds``). bool tensors are packed losslessly at 1 bit whatever ``bits``.
    ``bits == 0`` (``runtime.table.RUNTIME_BITS``) reads the width from the slot table at
    run time; the blob's length is then a data-dependent (unbacked) size.

``gact::seeds(int[] slots, Device device) -> Tensor``
    One fresh rounding seed per slot (int64), for the aten lowering
    (``runtime.aten_codec``), whose noise comes from Inductor's Philox keyed by them.

``gact::dequantize(Tensor blob, SymInt[] shape, ScalarType dtype, int group_size, int[] perm, int slot) -> Tensor``
    Decodes a blob to a tensor of ``shape`` and ``dtype`` whose strides are compact in
    the dimension order ``perm`` (the original strides whenever the original tensor was
    dense). The bit width is read from the blob's length, so it needs no host sync.
    During a sensitivity probe the slot table may substitute the slot's exact values.

Both ops are functional (no mutation, outputs never alias inputs) and have fake
implementations, so they trace under FakeTensor and dynamic shapes and pass
``torch.library.opcheck``. ``quantize`` carries ``needs_exact_strides`` so Inductor
hands it its input in the compile-time layout (and the permute stays free).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from . import format as fmt
from .kernels import decode, encode
from .seeds import DEFAULT_SEEDS
from .table import EXACT, RUNTIME_BITS, TABLE


def inverse_permutation(perm: Sequence[int]) -> list[int]:
    inverse = [0] * len(perm)
    for position, dim in enumerate(perm):
        inverse[dim] = position
    return inverse


def blob_nbytes(numel, dtype: torch.dtype, bits: int, group_size: int):
    """Blob length for a tensor of ``numel`` elements (int or SymInt)."""
    if dtype == torch.bool:
        return fmt.bool_blob_nbytes(numel)
    itemsize = torch.empty((), dtype=dtype).element_size()
    return fmt.float_blob_nbytes(numel, bits, group_size, itemsize)


@torch.library.custom_op(
    "gact::quantize",
    mutates_args=(),
    schema="(Tensor x, int bits, int group_size, int[] perm, int slot) -> Tensor",
    tags=(torch.Tag.needs_exact_strides,),
)
def quantize(
    x: torch.Tensor, bits: int, group_size: int, perm: Sequence[int], slot: int
) -> torch.Tensor:
    flat = x.permute(list(perm)).reshape(-1)
    if bits == RUNTIME_BITS:
        bits = TABLE.bits_for(slot)
    blob = encode(flat, bits, group_size, DEFAULT_SEEDS.next_seed(slot))
    if slot in TABLE.stash_slots:
        TABLE.stash[slot] = flat.clone()  # a copy: the compiler may reuse x's buffer
        TABLE.stash_owner[slot] = _fingerprint(blob)
    return blob


def _fingerprint(blob: torch.Tensor) -> tuple:
    """Which call made ``blob``: its length and leading bytes (the first groups' min and
    scale). Not its address: offloading copies blobs to the CPU and back."""
    return blob.numel(), tuple(blob[:32].tolist())


@quantize.register_fake
def _quantize_fake(x, bits, group_size, perm, slot):
    if bits == RUNTIME_BITS:
        nbytes = torch.library.get_ctx().new_dynamic_size()
    else:
        nbytes = blob_nbytes(x.numel(), x.dtype, bits, group_size)
    return x.new_empty((nbytes,), dtype=torch.uint8)


@torch.library.custom_op(
    "gact::dequantize",
    mutates_args=(),
    schema="(Tensor blob, SymInt[] shape, ScalarType dtype, int group_size, int[] perm, int slot) -> Tensor",
)
def dequantize(
    blob: torch.Tensor,
    shape: Sequence[int],
    dtype: torch.dtype,
    group_size: int,
    perm: Sequence[int],
    slot: int,
) -> torch.Tensor:
    # Only the probed call's blob is overridden: a graph called twice per step shares slots.
    override = TABLE.decode.get(slot)
    if override is not None and TABLE.stash_owner.get(slot) != _fingerprint(blob):
        override = None
    if override is None:
        flat = decode(blob, math.prod(shape), dtype, group_size)
    elif override is EXACT:
        flat = TABLE.stash[slot].clone()  # a copy: the backward may write into its inputs
    else:
        stashed = TABLE.stash[slot]
        flat = decode(encode(stashed, override.bits, group_size, override.seed), stashed.numel(), dtype, group_size)
    return flat.view([shape[dim] for dim in perm]).permute(inverse_permutation(perm))


@dequantize.register_fake
def _dequantize_fake(blob, shape, dtype, group_size, perm, slot):
    permuted = blob.new_empty([shape[dim] for dim in perm], dtype=dtype)
    return permuted.permute(inverse_permutation(perm))


@torch.library.custom_op("gact::seeds", mutates_args=(), schema="(int[] slots, Device device) -> Tensor")
def seeds(slots: Sequence[int], device: torch.device) -> torch.Tensor:
    return torch.tensor([DEFAULT_SEEDS.next_seed(s) for s in slots], dtype=torch.int64, device=device)


@seeds.register_fake
def _seeds_fake(slots, device):
    return torch.empty(len(slots), dtype=torch.int64, device=device)
