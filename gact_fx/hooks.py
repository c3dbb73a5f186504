"""Eager fallback: compress saved tensors through ``torch.autograd.graph.saved_tensors_hooks``.

For models torch.compile cannot trace at all, when the user asks for it
(``gact_fx.compress(model, fallback="hooks")``). GACT-style: every float tensor autograd
saves is packed into a blob at fixed ``bits`` when it is saved and decoded when the
backward needs it; bool tensors at 1 bit, losslessly. Parameters (and their views),
integer tensors and tensors under ``min_numel`` are kept as they are. Unlike the
compiler pass this cannot see the backward graph, so it cannot keep ReLU masks exact:
at low bits prefer the compiled path.

Some ops' backward exponentiates what they save, where rounding noise does not average
out (``passes.uses``): a log-softmax (cross-entropy's too), a logsumexp, and a fused
attention, whose backward rebuilds its softmax from the saved query, key and logsumexp
(the compiled path recomputes them consistently, ``passes.attention``; hooks cannot). A
``TorchFunctionMode`` watches for these ops, and what they save is packed at
``EXPONENTIAL_FLOOR`` bits or more (``nonlinear_bits``, if higher); attention's
logsumexp and mask, anything not shaped like its query, key, value or output, are kept
as they are.

GELU's, SiLU's, tanh's and sigmoid's backward recompute a curved derivative from what
they save, biased once that is rounded: the same mode runs them through
``local_derivatives.SavedDerivative``, which saves the derivative instead (GELU and SiLU
always, at no extra bytes; tanh and sigmoid, whose output the next op usually saves too,
at ``COARSE_BITS`` or fewer, where the bias is worth a tensor; not with
``save_derivatives=False``).
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass

import torch
from torch.overrides import TorchFunctionMode

from ._compat import version_counter
from .local_derivatives import Curve, SavedDerivative, curve_call
from .measure import note_saved, saved_as_is
from .passes.derivatives import COARSE_BITS
from .passes.plan import encoding_order, layout_of
from .report import HookStep
from .runtime import ops as _ops  # noqa: F401  (registers torch.ops.gact)
from .runtime.reference import FLOAT_DTYPES
from .runtime.registry import SlotRegistry


# The fewest bits for what an exponentiating op saves: below 8, attention's query and
# key, rounded against a logsumexp they no longer match, made sharp attention's gradient
# overflow, and a 2-bit log-softmax made a language model's gradient 4x off, not averaging out.
EXPONENTIAL_FLOOR = 8

F = torch.nn.functional
_ATTENTION = frozenset({F.scaled_dot_product_attention})
# their backward exponentiates the output they save (softmax = exp(log_softmax))
_LOG_SOFTMAX = frozenset({F.log_softmax, F.cross_entropy, torch.log_softmax, torch.Tensor.log_softmax,
                          torch.special.log_softmax, torch.logsumexp, torch.Tensor.logsumexp})


@dataclass(frozen=True)
class _Watched:
    """An exponentiating op being called: what it saves goes at the floor, or (``shapes``
    given) only what has one of those shapes, and the rest (a logsumexp, a mask) exact."""
    shapes: frozenset[tuple[int, ...]] | None = None


class _NonlinearWatch(TorchFunctionMode):
    """Tells the compressor when an op whose backward exponentiates what it saves runs, and
    runs a curved elementwise op through ``SavedDerivative`` where the compressor asks for it."""

    def __init__(self, compressor: HookCompressor) -> None:
        super().__init__()
        self._compressor = compressor

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _ATTENTION:
            bound = dict(zip(("query", "key", "value"), args)) | kwargs
            query, key, value = bound["query"], bound["key"], bound["value"]
            output = (*query.shape[:-1], value.shape[-1])
            watched = _Watched(frozenset({tuple(query.shape), tuple(key.shape), tuple(value.shape), output}))
        elif func in _LOG_SOFTMAX:
            watched = _Watched()
        else:
            call = curve_call(func, args, kwargs)
            if call is not None:
                curve, x, options = call
                if self._compressor.saves_derivative(curve, x):
                    self._compressor.last_step.derivatives += 1
                    return SavedDerivative.apply(x, curve, options)
            return func(*args, **kwargs)
        self._compressor.watched = watched
        try:
            return func(*args, **kwargs)
        finally:
            self._compressor.watched = None


@dataclass(frozen=True)
class _Packed:
    blob: torch.Tensor
    shape: tuple[int, ...]
    dtype: torch.dtype
    perm: tuple[int, ...]  # the order the blob holds the elements in
    dense_perm: tuple[int, ...] | None  # the tensor's own order, where ``perm`` differs from it


class HookCompressor:
    """Packs saved tensors of a model's forward at ``bits`` (``with compressor.active(): loss = model(x)``)."""

    def __init__(
        self, model: torch.nn.Module, *, registry: SlotRegistry, bits: int, group_size: int, min_numel: int,
        feature_groups: bool = True, rotation: int = 0, dithered: bool = False, nonlinear_bits: int = EXPONENTIAL_FLOOR,
        save_derivatives: bool = True,
    ) -> None:
        self.bits, self.group_size, self.min_numel = bits, group_size, min_numel
        self.feature_groups = feature_groups
        self.exponential_bits = max(bits, nonlinear_bits, EXPONENTIAL_FLOOR)
        self.save_derivatives = save_derivatives
        self.watched: _Watched | None = None  # while an exponentiating op runs
        self._parameters: set[int] = set()  # the storages of the model's parameters and buffers, while active
        self._model = model
        site = registry.new_site()
        site.rotation = rotation  # the ops rotate the tensors whose innermost dimension it divides
        site.dithered = dithered
        self._slot = site.slot
        self.last_step = HookStep(bits)  # what the hooks did in the latest forward (the report's)

    def saves_derivative(self, curve: Curve, x: torch.Tensor) -> bool:
        """Whether ``curve`` applied to ``x`` should save its derivative instead of what it saves."""
        if not (self.save_derivatives and torch.is_grad_enabled() and x.requires_grad):
            return False
        if self.bits >= 32 or self.watched is not None:
            return False
        if curve.saves_output and self.bits > COARSE_BITS:
            return False  # a tensor more, for a bias that shrinks 4x with each bit
        return not self._keep(x)

    def _keep(self, tensor: torch.Tensor) -> bool:
        if tensor.dtype != torch.bool and tensor.dtype not in FLOAT_DTYPES:
            return True
        if tensor.numel() < max(self.min_numel, 1):
            return True
        return tensor.untyped_storage().data_ptr() in self._parameters

    def _bits_for(self, tensor: torch.Tensor) -> int | None:
        """The width to pack ``tensor`` at, or None to keep it as it is."""
        watched = self.watched
        if watched is None or tensor.dtype == torch.bool:
            return self.bits  # a bool tensor is packed losslessly
        if watched.shapes is not None and tuple(tensor.shape) not in watched.shapes:
            return None  # attention's logsumexp, a mask: the backward exponentiates against them
        return None if self.exponential_bits >= 32 else self.exponential_bits

    def _pack(self, tensor: torch.Tensor, packed: dict):
        bits = None if self._keep(tensor) else self._bits_for(tensor)
        if bits is None:
            note_saved(tensor)
            self.last_step.kept += 1
            return saved_as_is(tensor)
        # The same tensor saved by two ops (tanh's output for tanh and for the next
        # matmul) is packed once; the version counter tells an in-place change apart.
        # An entry lives only as long as its tensor, so a later tensor that reuses the
        # freed memory never matches it.
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape),
               tuple(tensor.stride()), tensor.dtype, version_counter(tensor), bits)
        if key not in packed:
            layout = layout_of(tensor)
            perm = encoding_order(layout, tensor.dtype, self.group_size, self.feature_groups)
            blob = torch.ops.gact.quantize(tensor.detach(), bits, self.group_size, list(perm), self._slot)
            note_saved(blob)
            self.last_step.packed += 1
            self.last_step.bytes_before += tensor.numel() * tensor.element_size()
            self.last_step.bytes_after += blob.numel()
            dense_perm = None if perm == layout.perm else layout.perm
            packed[key] = _Packed(blob, tuple(tensor.shape), tensor.dtype, perm, dense_perm)
            weakref.finalize(tensor, packed.pop, key, None)
        return packed[key]

    def _unpack(self, packed):
        if not isinstance(packed, _Packed):
            return packed
        layout = None if packed.dense_perm is None else list(packed.dense_perm)
        return torch.ops.gact.dequantize(
            packed.blob, list(packed.shape), packed.dtype, self.group_size, list(packed.perm), self._slot, layout
        )

    @contextlib.contextmanager
    def active(self):
        self._parameters = {p.untyped_storage().data_ptr() for p in self._model.parameters()}
        self._parameters |= {b.untyped_storage().data_ptr() for b in self._model.buffers()}
        packed: dict = {}
        self.last_step = HookStep(self.bits)
        try:
            with torch.autograd.graph.saved_tensors_hooks(lambda t: self._pack(t, packed), self._unpack), \
                    _NonlinearWatch(self):
                yield self
        finally:
            self._parameters = set()
