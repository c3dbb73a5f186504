"""Rebuild in the backward the saved tensors that select between two constants.

An attention mask reaches the backward as a float tensor: a bool mask turned into
``where(mask, 0, -inf)`` (SDPA's CPU kernel and transformers' additive masks), one per
layer, batch x heads x queries x keys. Stored as a float it takes the attention floor's
8 bits an element, and rounding it has nothing to gain. ``rebuild_selects`` saves the
bool mask instead (1 bit an element, before any view such as the batch expand, and
once however many selects read it) and replays ``where`` in the backward: the same
values, bit for bit, in fewer bytes.

A select is rebuilt when its condition is a bool tensor reached through views only from
a node of the forward, and both branches are constants (numbers, or tensors built from
numbers alone, such as ``scalar_tensor(-inf)``). Tensors the plan keeps exact are left
alone, so 32 bits stays the stock partition.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass

import torch
import torch.fx as fx

from .affine import _VIEWS
from .hoist import lossy_placeholders
from .plan import REBUILT_FROM
from .saved import SavedGraph, SavedKind
from .section import SavedSection, finish, set_val

log = logging.getLogger(__name__)

aten = torch.ops.aten
MAX_VIEWS = 8  # views between the saved bool mask and the select's condition


@dataclass(frozen=True)
class _Select:
    position: int  # saved position of the select
    mask: fx.Node  # the forward bool tensor saved in its place
    views: tuple[fx.Node, ...]  # forward views from ``mask`` (excluded) to the condition


def _is_constant(arg) -> bool:
    """A number, or a tensor node computed from numbers alone (no tensor or SymInt input)."""
    if not isinstance(arg, fx.Node):
        return isinstance(arg, (bool, int, float))
    return arg.op == "call_function" and not arg.all_input_nodes and isinstance(arg.meta.get("val"), torch.Tensor)


def _is_size(arg) -> bool:
    """A view's non-tensor argument: ints, SymInt nodes, and lists of them."""
    if isinstance(arg, (list, tuple)):
        return all(_is_size(a) for a in arg)
    if isinstance(arg, fx.Node):
        return isinstance(arg.meta.get("val"), torch.SymInt)
    return isinstance(arg, (int, type(None)))


def _mask_of(condition: fx.Node) -> tuple[fx.Node, tuple[fx.Node, ...]] | None:
    """The first node above ``condition`` that is not a view, and the views below it."""
    views: list[fx.Node] = []
    node = condition
    while node.op == "call_function" and node.target in _VIEWS:
        if len(views) >= MAX_VIEWS or node.kwargs or not all(_is_size(a) for a in node.args[1:]):
            return None
        views.append(node)
        node = node.args[0]
    return node, tuple(reversed(views))


def find_selects(saved: SavedGraph, quantized: Collection[int] | None) -> list[_Select]:
    lossy = lossy_placeholders(saved, quantized)
    found = []
    for value in saved.tensors:
        node = value.node
        if value.bw_placeholder not in lossy or value.kind is not SavedKind.INTERMEDIATE:
            continue
        if node.target is not aten.where.self or node.kwargs:
            continue
        condition, if_true, if_false = node.args
        val = condition.meta.get("val") if isinstance(condition, fx.Node) else None
        if not isinstance(val, torch.Tensor) or val.dtype is not torch.bool:
            continue
        if not (_is_constant(if_true) and _is_constant(if_false)):
            continue
        traced = _mask_of(condition)
        if traced is not None:
            found.append(_Select(value.position, *traced))
    return found


def rebuild_selects(fw: fx.GraphModule, bw: fx.GraphModule, saved: SavedGraph,
                    quantized: Collection[int] | None = None) -> int:
    """Rewrite in place; returns the number of saved selects now rebuilt in the backward.
    ``quantized``: the positions the plan will store lossy (default: every float activation)."""
    selects = find_selects(saved, quantized)
    if not selects:
        return 0
    section = SavedSection(fw, bw, saved)
    masks: dict[fx.Node, fx.Node] = {v.node: v.bw_placeholder for v in saved.tensors}  # forward -> backward

    def backward_arg(arg):
        if isinstance(arg, (list, tuple)):
            return type(arg)(backward_arg(a) for a in arg)
        if isinstance(arg, fx.Node) and isinstance(arg.meta.get("val"), torch.SymInt):
            return section.symint(arg)
        return arg

    for select in selects:
        entry = section.entry(select.position)
        placeholder = entry.bw_placeholder
        first_user = next(n for n in bw.graph.nodes if n in placeholder.users)
        if select.mask not in masks:
            masks[select.mask] = section.add_tensor(select.mask)
        with bw.graph.inserting_before(first_user):
            node = masks[select.mask]
            for view in select.views:
                node = bw.graph.call_function(view.target, (node, *backward_arg(view.args[1:])))
                set_val(node, view.meta["val"])
            branches = []
            for arg in entry.fw_node.args[1:]:
                if isinstance(arg, fx.Node):  # a constant tensor: built again in the backward
                    arg = bw.graph.node_copy(arg)
                branches.append(arg)
            rebuilt = bw.graph.call_function(aten.where.self, (node, *branches))
            set_val(rebuilt, entry.fw_node.meta["val"])
            rebuilt.meta["gact"] = {"role": "rebuilt", "source": entry.fw_node.name}
        placeholder.replace_all_uses_with(rebuilt)
        section.drop_tensor(select.position)
        entry.fw_node.meta.setdefault("gact", {})[REBUILT_FROM] = select.mask.name
        log.debug("gact: %s rebuilt in the backward from the bool %s", entry.fw_node.name, select.mask.name)
    section.commit()
    finish(fw, bw, saved.num_fwd_outputs)
    return len(selects)
