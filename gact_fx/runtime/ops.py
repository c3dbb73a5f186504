"""The ``gact::`` custom ops that the graph passes insert, and their graph contract.

``gact::quantize(Tensor x, int bits, int group_size, int[] perm, int slot) -> Tensor``
    Encodes ``x`` into one flat uint8 blob (format: ``runtime.format``). The elements are
    taken in the *logical* order of ``x.permute(perm)``, never in memory order, so the
    result does not depend on the strides the compiler picked for ``x``; ``perm`` is
    chosen by the pass so that this permute is a no-op for the layout seen at compile
    time, or, with feature groups, a transpose that the CPU codec reads in place.
    ``slot`` names the saved-tensor site (``runtime.registry``): its rounding noise is
    keyed by a counter that lives on the device and advances there, so CUDA graph
    replays draw fresh noise. bool tensors are packed losslessly at 1 bit
    whatever ``bits``, and so are uint8 tensors, which hold a mask as bytes 0 and 1 (the
    rewrite hands CPU masks so under Inductor, whose CPU kernels store bools slowly; see
    ``passes.rewrite``). ``bits == RUNTIME_BITS`` reads the site's width at run time; the
    blob's length is then a data-dependent (unbacked) size. On a probe's forward call
    (``probe.stashing``) the op also keeps an exact copy and marks the blob with a
    token.

``gact::unpack_mask(Tensor blob, SymInt[] shape, ScalarType dtype, int[] perm, int[]? layout=None) -> Tensor``
    Decodes a mask's blob to 0 and 1 of ``dtype``, arranged as ``dequantize`` arranges.
    The rewrite's CPU mask path tests the result (``!= 0``) where the backward used the
    bool mask: Inductor's CPU kernels load float32 about 10x faster than bools.

``gact::keys(int[] slots, Device device) -> Tensor``
    The next rounding key ``[k0, k1]`` of each site (int64, ``len(slots) x 2``), for the
    aten lowering (``runtime.aten_codec``), which draws the same noise in traced ops.

``gact::dequantize(Tensor blob, SymInt[] shape, ScalarType dtype, int group_size, int[] perm, int slot, int[]? layout=None) -> Tensor``
    Decodes a blob to a tensor of ``shape`` and ``dtype`` whose strides are compact in
    the dimension order ``layout``, or ``perm`` when it is None (the original strides
    whenever the original tensor was dense; ``runtime.layout``). With feature groups the
    two differ, and the CPU codec writes the source's layout directly. The bit width is
    read from the blob's length, so it needs no host sync.
    While a probe measures, the probed call's blob (and only it: its token says so) is
    replaced by the exact copy or a re-quantization of it.

``gact::redither(Tensor blob, SymInt[] shape, int group_size, int slot) -> Tensor``
    A copy of a dithered site's blob of a tensor of ``shape`` whose kept key is changed, so
    that ``dequantize`` returns the same codes under independent noise (``passes.debias``);
    other blobs are copied unchanged.

All five ops are functional as far as the graph can see (outputs never alias inputs; the
noise counter is state of the site, like a generator's) and have fake implementations,
so they trace under FakeTensor and dynamic shapes and pass ``torch.library.opcheck``
(with the site pinned). ``quantize`` carries ``needs_exact_strides`` so Inductor hands
it its input in the compile-time layout (and the permute stays free), and
``nondeterministic_seeded`` so no pass merges or recomputes it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from . import format as fmt
from .kernels import decode_mask, decode_permuted, encode_permuted
from .layout import arrange, inverse_permutation
from .probe import is_stashing
from .registry import DIRECTORY, next_keys
from .rotation import rotate, rotates, unrotate_

RUNTIME_BITS = fmt.RUNTIME_BITS


# The ops are defined on a ``torch.library.Library`` rather than with ``torch.library.custom_op``:
# a custom_op call passes through an autograd wrapper, a redispatch and Dynamo's disable
# guard, 10 us for an empty op on the CPU against 3.3 us here, and a training step on the
# CPU calls two ops per saved tensor. They need no autograd: they run inside compiled
# forward and backward graphs.
_LIBRARY = torch.library.Library("gact", "DEF")


def _op(name: str, schema: str, *, tags: tuple = ()):
    """Define ``gact::<name>`` by ``schema``, with the decorated function its kernel on every device."""

    def define(kernel):
        _LIBRARY.define(name + schema, tags=tags)
        _LIBRARY.impl(name, kernel, "CompositeExplicitAutograd")
        return kernel

    return define


MASK_DTYPES = (torch.bool, torch.uint8)  # packed at 1 bit, losslessly (uint8: a mask as bytes 0 and 1)


def blob_nbytes(numel, dtype: torch.dtype, bits: int, group_size: int, dithered: bool = False):
    """Blob length for a tensor of ``numel`` elements (int or SymInt), written by a site that
    dithers or not."""
    if dtype in MASK_DTYPES:
        return fmt.bool_blob_nbytes(numel)
    itemsize = torch.empty((), dtype=dtype).element_size()
    return fmt.float_blob_nbytes(numel, bits, group_size, itemsize, dithered=dithered)


@_op(
    "quantize",
    "(Tensor x, int bits, int group_size, int[] perm, int slot) -> Tensor",
    tags=(torch.Tag.needs_exact_strides, torch.Tag.nondeterministic_seeded),
)
def quantize(x: torch.Tensor, bits: int, group_size: int, perm: Sequence[int], slot: int) -> torch.Tensor:
    if x.dtype == torch.uint8:
        x = x.view(torch.bool)  # the mask it holds (bytes 0 and 1)
    site = DIRECTORY.site(slot)
    if bits == RUNTIME_BITS:
        bits = site.runtime_bits()
    if site.rotation and rotates(x.shape, x.dtype, bits, site.rotation):
        x = rotate(x, site.rotation)
    state = site.rng_state(x.device)
    count = None if site.pinned else (lambda: site.advance(state))
    blob = encode_permuted(x, perm, bits, group_size, state=state, count=count, dithered=site.dithered)
    if is_stashing(slot):
        blob = site.probe.keep(x, perm, blob, site.registry.new_token())
    return blob


@torch.library.register_fake("gact::quantize")
def _quantize_fake(x, bits, group_size, perm, slot):
    if bits == RUNTIME_BITS:
        nbytes = torch.library.get_ctx().new_dynamic_size()
    else:
        nbytes = blob_nbytes(x.numel(), x.dtype, bits, group_size, dithered=DIRECTORY.dithers(slot))
    return x.new_empty((nbytes,), dtype=torch.uint8)


@_op(
    "dequantize",
    "(Tensor blob, SymInt[] shape, ScalarType dtype, int group_size, int[] perm, int slot, int[]? layout=None) -> Tensor",
)
def dequantize(
    blob: torch.Tensor,
    shape: Sequence[int],
    dtype: torch.dtype,
    group_size: int,
    perm: Sequence[int],
    slot: int,
    layout: Sequence[int] | None = None,
) -> torch.Tensor:
    numel = math.prod(shape)
    site = DIRECTORY.site(slot)
    flat = site.probe.replacement(blob, numel, dtype, group_size, site.dithered)
    if flat is None:
        decoded = decode_permuted(blob, shape, dtype, group_size, perm, layout, dithered=site.dithered)
    else:
        decoded = arrange(flat, shape, perm, layout)
    if site.rotation and rotates(shape, dtype, fmt.bits_from_blob_nbytes(blob.numel()), site.rotation):
        unrotate_(decoded, site.rotation)
    return decoded


def _arranged_fake(blob, shape, dtype, perm, layout) -> torch.Tensor:
    """A decoded tensor's fake: compact in the order ``layout`` (or ``perm``), as ``arrange`` leaves it."""
    order = list(perm if layout is None else layout)
    compact = blob.new_empty([shape[dim] for dim in order], dtype=dtype)
    return compact.permute(inverse_permutation(order))


@torch.library.register_fake("gact::dequantize")
def _dequantize_fake(blob, shape, dtype, group_size, perm, slot, layout=None):
    return _arranged_fake(blob, shape, dtype, perm, layout)


REDRAW_SALT = 0x5A  # XORed into each byte of a kept key's k1: another key, so other noise


@_op("redither", "(Tensor blob, SymInt[] shape, int group_size, int slot) -> Tensor")
def redither(blob: torch.Tensor, shape: Sequence[int], group_size: int, slot: int) -> torch.Tensor:
    out = blob.clone()
    bits = fmt.bits_from_blob_nbytes(blob.numel())
    if DIRECTORY.site(slot).dithered and bits != fmt.PASS_THROUGH_BITS:
        k1 = fmt.key_offset(math.prod(shape), bits, group_size) + fmt.KEY_BYTES // 2
        out[k1 : k1 + fmt.KEY_BYTES // 2].bitwise_xor_(REDRAW_SALT)
    return out


@torch.library.register_fake("gact::redither")
def _redither_fake(blob, shape, group_size, slot):
    return blob.new_empty(blob.shape)


@_op("unpack_mask", "(Tensor blob, SymInt[] shape, ScalarType dtype, int[] perm, int[]? layout=None) -> Tensor")
def unpack_mask(
    blob: torch.Tensor, shape: Sequence[int], dtype: torch.dtype, perm: Sequence[int], layout: Sequence[int] | None = None
) -> torch.Tensor:
    return arrange(decode_mask(blob, math.prod(shape), dtype), shape, perm, layout)


@torch.library.register_fake("gact::unpack_mask")
def _unpack_mask_fake(blob, shape, dtype, perm, layout=None):
    return _arranged_fake(blob, shape, dtype, perm, layout)


@_op("keys", "(int[] slots, Device device) -> Tensor", tags=(torch.Tag.nondeterministic_seeded,))
def keys(slots: Sequence[int], device: torch.device) -> torch.Tensor:
    if not slots:
        return torch.empty(0, 2, dtype=torch.int64, device=device)
    return next_keys([DIRECTORY.site(slot) for slot in slots], torch.device(device))


@torch.library.register_fake("gact::keys")
def _keys_fake(slots, device):
    return torch.empty(len(slots), 2, dtype=torch.int64, device=device)
