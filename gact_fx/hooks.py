"""Eager fallback: compress saved tensors through ``torch.autograd.graph.saved_tensors_hooks``.

For models torch.compile cannot trace at all, when the user asks for it
(``gact_fx.compress(model, fallback="hooks")``). GACT-style: every float tensor autograd
saves is packed into a blob at fixed ``bits`` when it is saved and decoded when the
backward needs it; bool tensors at 1 bit, losslessly. Parameters (and their views),
integer tensors and tensors under ``min_numel`` are kept as they are. Unlike the
compiler pass this cannot see the backward graph, so it cannot keep ReLU masks exact:
at low bits prefer the compiled path.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from .runtime import ops as _ops  # noqa: F401  (registers torch.ops.gact)
from .runtime.reference import FLOAT_DTYPES
from .runtime.slots import allocate_slot


@dataclass(frozen=True)
class _Packed:
    blob: torch.Tensor
    shape: tuple[int, ...]
    dtype: torch.dtype
    perm: tuple[int, ...]


class HookCompressor:
    """Packs saved tensors of a model's forward at ``bits`` (``with compressor: loss = model(x)``)."""

    def __init__(self, model: torch.nn.Module, *, bits: int, group_size: int, min_numel: int) -> None:
        self.bits, self.group_size, self.min_numel = bits, group_size, min_numel
        self._model = model
        self._slot = allocate_slot()
        self.packed_tensors = 0

    def _keep(self, tensor: torch.Tensor, parameters: set[int]) -> bool:
        if tensor.dtype != torch.bool and tensor.dtype not in FLOAT_DTYPES:
            return True
        if tensor.numel() < max(self.min_numel, 1):
            return True
        return tensor.untyped_storage().data_ptr() in parameters

    def _pack(self, tensor: torch.Tensor, parameters: set[int]):
        if self._keep(tensor, parameters):
            return tensor
        perm = tuple(sorted(range(tensor.dim()), key=lambda d: (-tensor.stride(d), d)))
        blob = torch.ops.gact.quantize(tensor.detach(), self.bits, self.group_size, list(perm), self._slot)
        self.packed_tensors += 1
        return _Packed(blob, tuple(tensor.shape), tensor.dtype, perm)

    def _unpack(self, packed):
        if not isinstance(packed, _Packed):
            return packed
        return torch.ops.gact.dequantize(
            packed.blob, list(packed.shape), packed.dtype, self.group_size, list(packed.perm), self._slot
        )

    @contextlib.contextmanager
    def active(self):
        parameters = {p.untyped_storage().data_ptr() for p in self._model.parameters()}
        parameters |= {b.untyped_storage().data_ptr() for b in self._model.buffers()}
        with torch.autograd.graph.saved_tensors_hooks(lambda t: self._pack(t, parameters), self._unpack):
            yield self
