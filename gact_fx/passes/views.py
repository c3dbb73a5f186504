"""Alias analysis on FX graphs: which nodes are views, and of what storage root.

A saved tensor that is a view (``t``, ``view``, ``detach``, ``getitem`` of ``split``...)
shares storage with its root. Compressing the view alone would leave the root's
full-precision storage alive, so the passes reason about roots and view chains.
A node is a view when its op schema says every return aliases an input without
writing (``Tensor(a)``, ``Tensor(a)[]``), or when it is ``getitem`` of such a node.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
import torch.fx as fx

from .._compat import is_op_overload


def _aliasing_schema(target) -> torch.FunctionSchema | None:
    if not is_op_overload(target):
        return None
    schema = target._schema
    if not schema.returns:
        return None
    for ret in schema.returns:
        if ret.alias_info is None or ret.alias_info.is_write:
            return None
    return schema


def view_parent(node: fx.Node) -> fx.Node | None:
    """The node whose storage ``node`` views, or None when ``node`` is not a view."""
    if node.op != "call_function":
        return None
    if node.target is operator.getitem:
        parent = node.args[0]
        if isinstance(parent, fx.Node) and _aliasing_schema(parent.target) is not None:
            return parent
        return None
    schema = _aliasing_schema(node.target)
    if schema is None:
        return None
    alias_sets = set().union(*(ret.alias_info.before_set for ret in schema.returns))
    for argument, value in zip(schema.arguments, node.args):
        info = argument.alias_info
        if info is None or not isinstance(value, fx.Node):
            continue
        # ``Tensor(a)`` returns name their set; list returns (``split``: ``Tensor(a -> *) self
        # -> Tensor(a)[]``) leave it on the argument as a wildcard.
        if info.before_set & alias_sets or "*" in info.after_set:
            return value
    return None


@dataclass(frozen=True)
class AliasPath:
    """``node`` reached from ``root`` through ``chain`` (root excluded, node included)."""

    root: fx.Node
    chain: tuple[fx.Node, ...]

    @property
    def is_view(self) -> bool:
        return bool(self.chain)


def alias_path(node: fx.Node) -> AliasPath:
    chain: list[fx.Node] = []
    current = node
    while (parent := view_parent(current)) is not None:
        chain.append(current)
        current = parent
    return AliasPath(root=current, chain=tuple(reversed(chain)))


def foreign_inputs(path: AliasPath) -> list[fx.Node]:
    """Nodes other than the root and the chain itself that replaying ``path`` needs."""
    inside = {path.root, *path.chain}
    needed: list[fx.Node] = []
    for node in path.chain:
        for arg in node.all_input_nodes:
            if arg not in inside and arg not in needed:
                needed.append(arg)
    return needed


def is_symint_node(node: fx.Node) -> bool:
    return isinstance(node.meta.get("val"), torch.SymInt)
