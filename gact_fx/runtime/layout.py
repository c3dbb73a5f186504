"""Dimension orders of encoded tensors: the order a blob takes the elements in, and the
order the decoded tensor's strides are compact in.

A blob holds a tensor's elements in the logical order of ``x.permute(perm)``. Decoding
gives them back compact in ``perm`` unless a ``layout`` asks for another order: with
``feature_groups`` the blob takes the innermost dimension outermost (``perm = (layout[-1],
*layout[:-1])``), while the backward was traced with the source's own ``layout``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def inverse_permutation(perm: Sequence[int]) -> list[int]:
    inverse = [0] * len(perm)
    for position, dim in enumerate(perm):
        inverse[dim] = position
    return inverse


def identity(perm: Sequence[int]) -> bool:
    return all(dim == position for position, dim in enumerate(perm))


def natural_order(perm: Sequence[int], layout: Sequence[int] | None) -> bool:
    """Whether a blob taken in the order ``perm`` and decoded compact in ``layout`` holds the
    tensor in its own row-major order (no permute on either side)."""
    return identity(perm) and (layout is None or identity(layout))


def compact_in(tensor: torch.Tensor, order: Sequence[int]) -> torch.Tensor:
    """``tensor`` with strides compact in the dimension order ``order`` (a copy unless it already is)."""
    order = list(order)
    return tensor.permute(order).contiguous().permute(inverse_permutation(order))


def arrange(flat: torch.Tensor, shape: Sequence, perm: Sequence[int], layout: Sequence[int] | None) -> torch.Tensor:
    """The tensor of ``shape`` whose elements ``flat`` holds in the order of ``perm``,
    compact in ``layout`` (``perm`` when None)."""
    if natural_order(perm, layout):
        return flat.view(shape)
    tensor = flat.view([shape[dim] for dim in perm]).permute(inverse_permutation(perm))
    if layout is None or list(layout) == list(perm):
        return tensor
    return compact_in(tensor, layout)


def feature_major(perm: Sequence[int], layout: Sequence[int] | None) -> bool:
    """Whether ``perm`` takes ``layout``'s innermost dimension outermost and keeps the rest in order,
    so that a [tokens, features] matrix in ``layout`` is encoded as its transpose."""
    perm = list(perm)
    return layout is not None and len(perm) >= 2 and perm == [layout[-1], *layout[:-1]]
