"""The sensitivity probe's protocol between the controller and the ``gact::`` ops.

To measure how much one saved tensor's rounding moves the gradient, the controller
(``controller.GactController``):

1. runs one forward call under ``stashing(slots)``: ``gact::quantize`` of those sites
   keeps an exact copy of its input and marks the blob with a token naming that call
   (``SiteProbe.keep``);
2. runs the backward again with a site answering ``exact()`` (``gact::dequantize``
   returns the exact copy), then ``requantized(bits, key)`` (the copy re-quantized under
   a key no forward call uses, ``fresh_key``);
3. ``release()``s the sites.

``gact::dequantize`` asks ``SiteProbe.replacement`` for every blob; only the probed
call's blob (its token says so) is replaced, so other calls of the same graph (a block
called N times a step) decode as usual. Each site owns its ``SiteProbe``; the one piece of
per-call state, which slots the current forward call stashes, is a ``ContextVar``.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from . import format as fmt
from .kernels import decode, encode
from .noise import fmix32, key_of

# The slots whose exact values this forward call keeps for a probe (set by the controller).
STASHING: contextvars.ContextVar[frozenset[int]] = contextvars.ContextVar("gact_stashing", default=frozenset())


@contextlib.contextmanager
def stashing(slots: frozenset[int]) -> Iterator[None]:
    """Within the block, the forward call's ``gact::quantize`` of these slots keeps exact copies."""
    token = STASHING.set(slots)
    try:
        yield
    finally:
        STASHING.reset(token)


def is_stashing(slot: int) -> bool:
    return slot in STASHING.get()


class _Exact:
    def __repr__(self) -> str:
        return "EXACT"


EXACT = _Exact()  # dequantize returns the stashed exact values


@dataclass(frozen=True)
class Requantize:
    """dequantize returns the stashed values quantized at ``bits`` under ``key``."""

    bits: int
    key: tuple[int, int]


@dataclass
class Stash:
    """What a probe's forward call kept of one site: the exact values, and the token its blob carries."""

    values: torch.Tensor
    token: int


class SiteProbe:
    """One site's part in a probe: what its probed call kept, and what replaces that call's blob."""

    __slots__ = ("stash", "substitute")

    def __init__(self) -> None:
        self.stash: Stash | None = None
        self.substitute: _Exact | Requantize | None = None

    @property
    def kept(self) -> bool:
        return self.stash is not None

    @property
    def idle(self) -> bool:
        return self.stash is None and self.substitute is None

    def keep(self, x: torch.Tensor, perm: Sequence[int], blob: torch.Tensor, token: int) -> torch.Tensor:
        """Keep ``x`` (in the blob's element order) and return ``blob`` marked with ``token``."""
        flat = x.permute(list(perm)).reshape(-1)
        self.stash = Stash(flat.clone(), token)  # a copy: the compiler may reuse x's buffer
        return attach_token(blob, token)

    def exact(self) -> None:
        self.substitute = EXACT

    def requantized(self, bits: int, key: tuple[int, int]) -> None:
        self.substitute = Requantize(bits, key)

    def release(self) -> None:
        self.stash = None
        self.substitute = None

    def replacement(self, blob: torch.Tensor, numel: int, dtype: torch.dtype, group_size: int,
                    dithered: bool = False) -> torch.Tensor | None:
        """The flat values ``dequantize`` returns instead of decoding ``blob``, or None if
        ``blob`` is not the probed call's (or no probe measures). A ``dithered`` site's
        requantization is dithered too."""
        if self.substitute is None or self.stash is None:
            return None
        bits = fmt.bits_from_blob_nbytes(blob.numel())
        expected = fmt.float_blob_nbytes(numel, bits, group_size, dtype.itemsize, dithered=dithered)
        if token_of(blob, expected) != self.stash.token:
            return None
        stashed = self.stash.values
        if self.substitute is EXACT:
            return stashed.clone()  # a copy: the backward may write into its inputs
        requantize = self.substitute
        blob = encode(stashed, requantize.bits, group_size, key=key_of(*requantize.key, device=stashed.device),
                      dithered=dithered)
        return decode(blob, stashed.numel(), dtype, group_size, dithered=dithered)


def fresh_key(token: int, index: int) -> tuple[int, int]:
    """A rounding key no forward call uses (those come from ``noise.slot_key``), from a
    fresh token of the site's registry and the site's index."""
    return fmix32(token ^ 0x5BD1E995), fmix32(index ^ fmix32(token))


def attach_token(blob: torch.Tensor, token: int) -> torch.Tensor:
    """``blob`` with a probe token before its tag (the length mod 8, so the bits, unchanged)."""
    tag = blob.numel() % 8
    token_bytes = torch.tensor([token], dtype=torch.int64).view(torch.uint8).to(blob.device)
    return torch.cat([blob[: blob.numel() - tag], token_bytes, blob[blob.numel() - tag :]])


def token_of(blob: torch.Tensor, expected_nbytes: int) -> int | None:
    """The token of a probe blob, or None for a plain one (reads 8 bytes to the host)."""
    if blob.numel() != expected_nbytes + fmt.TOKEN_BYTES:
        return None
    start = fmt.token_offset(blob.numel())
    return int(blob[start : start + fmt.TOKEN_BYTES].cpu().view(torch.int64).item())
