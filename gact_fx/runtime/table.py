"""Per-slot run-time state that the ``gact::`` ops read: bits, and the probe's hooks.

* ``bits``: the bit width of each slot compiled with run-time bits (``bits=RUNTIME_BITS``
  in ``gact::quantize``); the controller rewrites it after every adaptation, and the
  next quantize call uses it. No recompile: the blob's size is data-dependent.
* ``stash_slots`` / ``stash``: on a probe step, ``quantize`` also keeps an exact copy of
  the listed slots' inputs and notes which blob each belongs to (``stash_owner``, a
  fingerprint of the blob).
* ``decode``: while the probe (and then the probe step's own backward) runs,
  ``dequantize`` of a listed slot's stashed blob returns the stashed values instead,
  exactly (``EXACT``) or re-quantized at a given width and seed (``Requantize``).

One process-wide table; slots are unique per process (``runtime.slots``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

RUNTIME_BITS = 0  # ``gact::quantize(..., bits=RUNTIME_BITS, ...)``: read the slot's bits here


class _Exact:
    def __repr__(self) -> str:
        return "EXACT"


EXACT = _Exact()


@dataclass(frozen=True)
class Requantize:
    bits: int
    seed: int


@dataclass
class SlotTable:
    bits: dict[int, int] = field(default_factory=dict)
    stash_slots: frozenset[int] = frozenset()
    stash: dict[int, torch.Tensor] = field(default_factory=dict)
    stash_owner: dict[int, int] = field(default_factory=dict)
    decode: dict[int, object] = field(default_factory=dict)  # slot -> EXACT | Requantize

    def bits_for(self, slot: int) -> int:
        try:
            return self.bits[slot]
        except KeyError:
            raise RuntimeError(f"gact: no bits registered for slot {slot} (was the graph compiled by gact?)") from None

    def release(self, slots) -> None:
        """Forget the stash and decode overrides of ``slots`` (end of a probe step)."""
        for slot in slots:
            self.stash.pop(slot, None)
            self.stash_owner.pop(slot, None)
            self.decode.pop(slot, None)


TABLE = SlotTable()
