"""Rounding noise: a counter-based hash of (call key, element index), the same on every device.

Every implementation of the format (the torch reference, the Triton kernels, the CPU
kernel and the aten lowering) draws the uniform noise of element ``i`` of one quantize
call as ``uniform(k0, k1, i)``, so all of them write bit-identical blobs and test each
other directly. All arithmetic is on 32-bit unsigned words (here held in int64 tensors
or Python ints, products kept under 2**63 so that no backend ever overflows)::

    fmix32(h)    = murmur3's finaliser
    p            = (i >> 4) * 8 + (i & 7)     one hash serves two elements, i and i + 8
    h            = fmix32((p_lo * GOLDEN) XOR k1 XOR (k0 * M2) XOR (p_hi * M1))
    u16          = the low 16 bits of h for i & 8 == 0, the high 16 bits otherwise
    uniform      = (2 * u16 + 1) * 2**-17     in (0, 1), exact in float32

Sixteen bits of noise per element leave rounding biased by at most 2**-17 of a code step,
far below what any averaging can see, and halve the hashing, which was the largest cost
of the CPU kernel's quantize. Pairing i with i + 8 (not i + 1) lets eight-lane vector code
take two vectors of noise from one vector of hashes without shuffling lanes.

A call's key ``(k0, k1)`` comes from its site's *state*, an int64 tensor ``[slot_key,
count, ticket]`` that lives on the device: ``k0 = slot_key`` and ``k1 = fmix32(count *
GOLDEN XOR slot_key)``; the call then adds 1 to ``count`` (``ticket`` lets a Triton kernel's
last program do it, once all have read ``count``). The state is read and advanced on the
device, so a CUDA graph replay draws fresh noise, which a seed baked in at capture
would not. ``slot_key`` mixes the process's base seed (``manual_seed``; under
torch.distributed mixed with the rank) with the site's index in its backend.
"""

from __future__ import annotations

import torch

MASK32 = 0xFFFFFFFF
GOLDEN = 0x9E3779B1
_M1, _M2 = 0x85EBCA6B, 0xC2B2AE35
_MASK64 = (1 << 64) - 1


def mul32(h, constant: int):
    """``(h * constant) mod 2**32`` for ``h < 2**32``, every partial product under 2**49."""
    low, high = constant & 0xFFFF, constant >> 16
    return (h * low + (((h * high) & 0xFFFF) << 16)) & MASK32


def fmix32(h):
    """murmur3's 32-bit finaliser, on a Python int or an int64 tensor of uint32 values."""
    h = h ^ (h >> 16)
    h = mul32(h, _M1)
    h = h ^ (h >> 13)
    h = mul32(h, _M2)
    return h ^ (h >> 16)


def mix64(value: int) -> int:
    """splitmix64's finaliser: a user's seed to 64 well-mixed bits (host side)."""
    value = (value + 0x9E3779B97F4A7C15) & _MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


def slot_key(base: int, index: int) -> int:
    """The fixed half of a site's key: its index in its backend mixed with the base seed."""
    return fmix32(mul32(index & MASK32, GOLDEN) ^ (base & MASK32) ^ fmix32(base >> 32))


def call_key(state: torch.Tensor) -> torch.Tensor:
    """``[k0, k1]`` (int64, on ``state``'s device) for the next call of a site; no sync."""
    k0 = state[0:1]
    k1 = fmix32(mul32(state[1:2] & MASK32, GOLDEN) ^ k0)
    return torch.cat([k0, k1])


def call_keys(states: torch.Tensor) -> torch.Tensor:
    """``call_key`` of each row of stacked states (``N x 3``): ``N x 2``, in a few kernels."""
    k0 = states[:, 0]
    return torch.stack([k0, fmix32(mul32(states[:, 1] & MASK32, GOLDEN) ^ k0)], dim=1)


def noise_source(state: torch.Tensor | None, key: torch.Tensor | None) -> tuple[torch.Tensor, bool]:
    """What a codec's call draws its noise from, and whether that is a site's state (else a call key)."""
    if (state is None) == (key is None):
        raise ValueError("give the site's noise state or an explicit key, not both")
    return (state, True) if state is not None else (key, False)


def uniform(key: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Noise in (0, 1) for int64 element indices ``index`` under ``key`` (float32)."""
    k0, k1 = key[0], key[1]
    pair = (index >> 4) * 8 + (index & 7)
    h = fmix32(mul32(pair & MASK32, GOLDEN) ^ k1 ^ mul32(k0, _M2) ^ mul32(pair >> 32, _M1))
    half = (h >> ((index & 8) * 2)) & 0xFFFF
    return (half * 2 + 1).to(torch.float32) * (1.0 / (1 << 17))


def rounding_noise(groups, group_size: int, key: torch.Tensor) -> torch.Tensor:
    """The ``(groups, group_size)`` noise one call draws, elements in logical order."""
    index = torch.arange(groups * group_size, device=key.device, dtype=torch.int64)
    return uniform(key, index).view(-1, group_size)


def key_of(k0: int, k1: int, device=None) -> torch.Tensor:
    """A call key from two host integers (tests, and the probe's re-quantization)."""
    return torch.tensor([k0 & MASK32, k1 & MASK32], dtype=torch.int64, device=device)
