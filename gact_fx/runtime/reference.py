"""Torch reference implementation of the packed format: the CPU path and the test oracle.

Plain tensor code that runs on any device. It works on a 1-D tensor already taken in
logical order (``runtime.ops`` does the permuting); the rounding noise is an explicit
argument so that other implementations (the Triton kernels) can be checked code for
code against it. The format itself is described in ``runtime.format``.

``encode_groups`` / ``decode_groups`` hold the float codec with no Python branch on a
size, so they also trace into graphs under dynamic shapes (``runtime.aten_codec``).
"""

from __future__ import annotations

import torch

from . import format as fmt

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_FP32_MAX = torch.finfo(torch.float32).max


def rounding_noise(groups: int, group_size: int, seed: int, device) -> torch.Tensor:
    """Uniform [0, 1) noise for stochastic rounding, reproducible from ``seed``."""
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return torch.rand(groups, group_size, generator=generator, device=device)


def group_view(flat: torch.Tensor, group_size: int) -> torch.Tensor:
    """fp32 ``(G, group_size)`` view of ``flat``, the tail padded with its last element."""
    values = flat.float()
    padding = fmt.num_groups(flat.numel(), group_size) * group_size - flat.numel()
    values = torch.cat([values, values[-1:].expand(padding)])  # no branch: traceable
    return values.view(-1, group_size)


def group_scale_and_min(groups: torch.Tensor, bits: int):
    """Per-group scale and min; non-finite groups get a NaN scale so they decode to NaN."""
    levels = 2**bits - 1
    group_min = groups.amin(dim=1)
    group_max = groups.amax(dim=1)
    # Halving first keeps max - min finite for any finite inputs.
    half_range = group_max * 0.5 - group_min * 0.5
    scale = (half_range / (levels * 0.5)).clamp(max=_FP32_MAX)
    finite = torch.isfinite(group_min) & torch.isfinite(group_max)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    scale = torch.where(finite, scale, torch.full_like(scale, float("nan")))
    return scale, group_min


def quantize_codes(groups, scale, group_min, bits: int, noise) -> torch.Tensor:
    """Stochastically rounded integer codes, ``(G, group_size)`` uint8."""
    levels = 2**bits - 1
    normalized = (groups * 0.5 - group_min[:, None] * 0.5) / (scale[:, None] * 0.5)
    codes = torch.floor(normalized + noise).clamp(0, levels)  # functional: it is traced into graphs
    return torch.nan_to_num(codes, nan=0.0).to(torch.uint8)


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack ``(G, group_size)`` codes of ``bits`` each into a flat uint8 tensor."""
    if bits == 8:
        return codes.reshape(-1)
    per_byte = 8 // bits
    shifts = torch.arange(per_byte, device=codes.device, dtype=torch.int32) * bits
    lanes = codes.reshape(-1, per_byte).to(torch.int32) << shifts
    return lanes.sum(dim=1).to(torch.uint8)


def unpack_codes(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """Inverse of ``pack_codes``: flat uint8 bytes to a flat tensor of codes."""
    if bits == 8:
        return packed
    per_byte = 8 // bits
    shifts = torch.arange(per_byte, device=packed.device, dtype=torch.int32) * bits
    lanes = (packed.to(torch.int32)[:, None] >> shifts) & (2**bits - 1)
    return lanes.reshape(-1).to(torch.uint8)


def encode_groups(flat: torch.Tensor, bits: int, group_size: int, noise: torch.Tensor) -> torch.Tensor:
    """Blob of a non-empty 1-D float tensor at ``bits`` in {1, 2, 4, 8}; branch-free."""
    groups = group_view(flat, group_size)
    scale, group_min = group_scale_and_min(groups, bits)
    codes = quantize_codes(groups, scale, group_min, bits, noise)
    body = torch.cat([scale.view(torch.uint8), group_min.view(torch.uint8), pack_codes(codes, bits)])
    total = fmt.float_blob_nbytes(flat.numel(), bits, group_size, flat.element_size())
    return torch.cat([body, body.new_zeros(total - body.numel())])  # padding and tag


def decode_groups(blob: torch.Tensor, numel, dtype: torch.dtype, group_size: int, bits: int) -> torch.Tensor:
    """Inverse of ``encode_groups``; branch-free."""
    groups = fmt.num_groups(numel, group_size)
    scale = blob[: groups * 4].view(torch.float32)
    group_min = blob[groups * 4 : groups * fmt.METADATA_BYTES_PER_GROUP].view(torch.float32)
    start = groups * fmt.METADATA_BYTES_PER_GROUP
    codes = unpack_codes(blob[start : start + groups * (group_size * bits // 8)], bits).view(-1, group_size)
    values = codes.float() * scale[:, None] + group_min[:, None]
    return values.reshape(-1)[:numel].to(dtype)


def quantize_reference(
    flat: torch.Tensor, bits: int, group_size: int, noise: torch.Tensor | None
) -> torch.Tensor:
    """Encode a 1-D tensor into a blob. ``noise`` is ``(G, group_size)`` in [0, 1)."""
    numel = flat.numel()
    if flat.dtype == torch.bool:
        codes = torch.cat([flat.to(torch.uint8), flat.new_zeros((numel + 7) // 8 * 8 - numel, dtype=torch.uint8)])
        packed = pack_codes(codes, 1)
        return torch.cat([packed, packed.new_zeros(fmt.bool_blob_nbytes(numel) - packed.numel())])
    if flat.dtype not in FLOAT_DTYPES:
        raise TypeError(f"gact quantize takes {FLOAT_DTYPES} or bool, got {flat.dtype}")
    if bits == fmt.PASS_THROUGH_BITS or numel == 0:
        raw = flat.contiguous().view(torch.uint8).reshape(-1)
        total = fmt.float_blob_nbytes(numel, bits, group_size, flat.element_size())
        return torch.cat([raw, raw.new_zeros(total - raw.numel())])
    return encode_groups(flat, bits, group_size, noise)


def decode_bool(blob: torch.Tensor, numel) -> torch.Tensor:
    return unpack_codes(blob[: (numel + 7) // 8], 1)[:numel].to(torch.bool)


def decode_raw(blob: torch.Tensor, numel, dtype: torch.dtype) -> torch.Tensor:
    """The 32-bit pass-through: the tensor's own bytes."""
    return blob[: numel * dtype.itemsize].view(dtype).clone()


def dequantize_reference(
    blob: torch.Tensor, numel: int, dtype: torch.dtype, group_size: int
) -> torch.Tensor:
    """Decode a blob back to a 1-D tensor of ``numel`` elements of ``dtype``."""
    bits = fmt.bits_from_blob_nbytes(blob.numel())
    if dtype == torch.bool:
        return decode_bool(blob, numel)
    if bits == fmt.PASS_THROUGH_BITS or numel == 0:
        return decode_raw(blob, numel, dtype)
    return decode_groups(blob, numel, dtype, group_size, bits)
