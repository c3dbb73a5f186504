"""Run-time measurement of what autograd really keeps for backward.

``SavedBytesMeter`` counts, through ``torch.autograd.graph.saved_tensors_hooks``, the
bytes of every distinct storage saved while it is active (compiled graphs save their
tensors through the same mechanism), leaving out the storages of given tensors
(parameters and buffers, which are saved by reference and cost nothing extra).
``saved_activation_bytes`` counts what the backward holds when the caller keeps only the
loss: the model's outputs that autograd saved are counted too (transformers' KV caches
and logits), since the backward's reference is then the only one. These are the rules
the report's totals follow (which count copies of weights apart).

Saved-tensor hooks do not nest (only the innermost pair runs), so code that installs
its own, like gact's hook fallback, reports what it keeps through ``note_saved``.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterable

import torch


# The meters counting in this context (a call's state: a ContextVar, not a global list).
_ACTIVE_METERS: contextvars.ContextVar[tuple[SavedBytesMeter, ...]] = contextvars.ContextVar("gact_meters", default=())


def note_saved(tensor: torch.Tensor) -> None:
    """Count ``tensor`` in every active meter: for saved-tensor hooks that hide the meter's."""
    for meter in _ACTIVE_METERS.get():
        meter._pack(tensor)


def saved_as_is(tensor: torch.Tensor) -> torch.Tensor:
    """What a pack hook hands autograd to keep ``tensor`` as it is. Not ``tensor`` itself: a
    saved output holds its own autograd node, a cycle through C++ that Python's collector
    never frees, and with it the whole graph and the weights. The backward needs only the
    values, which the detached view shares."""
    return tensor.detach()


class SavedBytesMeter:
    """``with SavedBytesMeter(exclude=model.parameters()) as meter: loss = model(x)``.

    With ``weights`` (the parameters), a saved tensor of a weight's shape and dtype that
    equals it is a copy of that weight in another layout (Inductor makes such copies of
    convolution weights after the graph is partitioned, where no graph shows them): its
    bytes go to ``weight_copy_nbytes``, not ``nbytes``."""

    def __init__(self, exclude: Iterable[torch.Tensor] = (), weights: Iterable[torch.Tensor] = ()) -> None:
        self._excluded = {t.untyped_storage().data_ptr() for t in exclude}
        self._weights: dict[tuple, list[torch.Tensor]] = {}
        for weight in weights:
            self._weights.setdefault((tuple(weight.shape), weight.dtype, weight.device), []).append(weight)
        self._storages: dict[int, int] = {}
        self._weight_copies: dict[int, int] = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._token: contextvars.Token | None = None

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        pointer = storage.data_ptr()
        if pointer not in self._excluded and storage.nbytes():
            copies = self._weights.get((tuple(tensor.shape), tensor.dtype, tensor.device), ())
            with torch.no_grad():
                is_copy = any(torch.equal(tensor, weight) for weight in copies)
            (self._weight_copies if is_copy else self._storages)[pointer] = storage.nbytes()
        return saved_as_is(tensor)

    def __enter__(self) -> SavedBytesMeter:
        self._hooks.__enter__()
        self._token = _ACTIVE_METERS.set((*_ACTIVE_METERS.get(), self))
        return self

    def __exit__(self, *exc) -> None:
        _ACTIVE_METERS.reset(self._token)
        self._hooks.__exit__(*exc)

    def exclude(self, tensors: Iterable[torch.Tensor]) -> None:
        """Stop counting the storages of ``tensors`` (e.g. outputs known only afterwards)."""
        for tensor in tensors:
            pointer = tensor.untyped_storage().data_ptr()
            self._excluded.add(pointer)
            self._storages.pop(pointer, None)

    @property
    def nbytes(self) -> int:
        return sum(self._storages.values())

    @property
    def weight_copy_nbytes(self) -> int:
        return sum(self._weight_copies.values())


def saved_activation_bytes(model: torch.nn.Module, *inputs, **kwargs) -> int:
    """Bytes one forward call of ``model`` leaves held for the backward when the caller
    keeps only the loss: every storage autograd saved, but the parameters and buffers."""
    return sum(saved_bytes_by_kind(model, *inputs, **kwargs))


def saved_bytes_by_kind(model: torch.nn.Module, *inputs, **kwargs) -> tuple[int, int]:
    """``(activation bytes, weight-copy bytes)`` one forward call leaves held for the backward,
    the caller keeping only the loss; a saved tensor equal to a parameter in another
    layout is a weight copy (see ``SavedBytesMeter``)."""
    exclude = [*model.parameters(), *model.buffers()]
    with SavedBytesMeter(exclude=exclude, weights=model.parameters()) as meter:
        output = model(*inputs, **kwargs)
    del output
    return meter.nbytes, meter.weight_copy_nbytes
