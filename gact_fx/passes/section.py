"""``SavedSection``: the one place that edits what a forward graph saves for backward.

AOTAutograd pairs forward outputs and backward placeholders by position: forward
``[real outputs | saved tensors | saved SymInts]``, backward ``[saved SymInts | saved
tensors | tangents ...]``, and tensors saved without a version-counter check last in
their section. Passes add, replace and drop saved values through this editor and call
``commit()``, which rewrites both graphs in that order; no pass touches the forward
output tuple or the backward placeholders itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx as fx

from .._compat import (
    extract_tensor_metadata,
    output_descriptors,
    rename_node,
    saved_output_descriptor,
    saved_without_vc_check,
    set_output_descriptors,
)
from .saved import SavedGraph, find_saved, output_node


def set_val(node: fx.Node, val) -> None:
    """Set ``meta["val"]`` (and ``tensor_meta`` for tensors) on a new node."""
    node.meta["val"] = val
    if isinstance(val, torch.Tensor):
        node.meta["tensor_meta"] = extract_tensor_metadata(val)


def copy_node(graph: fx.Graph, node: fx.Node, arg_map) -> fx.Node:
    """``node`` copied into ``graph`` (its arguments through ``arg_map``), with its value."""
    copy = graph.node_copy(node, arg_map)
    set_val(copy, node.meta["val"])
    return copy


@dataclass
class _Entry:
    fw_node: fx.Node
    bw_placeholder: fx.Node
    desc_type: type | None = None


class SavedSection:
    def __init__(self, fw: fx.GraphModule, bw: fx.GraphModule, saved: SavedGraph) -> None:
        self.fw, self.bw = fw, bw
        self.num_fwd_outputs = saved.num_fwd_outputs
        out = output_node(fw)
        descs = output_descriptors(out)
        self._real_descs = list(descs[: self.num_fwd_outputs]) if descs is not None else None
        saved_descs = list(descs[self.num_fwd_outputs :]) if descs is not None else [None] * len(saved.values)
        entries = [_Entry(v.node, v.bw_placeholder, type(d) if d is not None else None) for v, d in zip(saved.values, saved_descs)]
        symint_positions = {v.position for v in saved.symints}
        self.tensors = [e for p, e in enumerate(entries) if p not in symint_positions]
        self.symints = [e for p, e in enumerate(entries) if p in symint_positions]
        self._tensor_by_position = {v.position: e for v, e in zip(saved.values, entries) if v.position not in symint_positions}
        self._symint_by_expr = {
            e.fw_node.meta["val"].node.expr: e for e in self.symints if isinstance(e.fw_node.meta["val"], torch.SymInt)
        }
        self._retired: list[fx.Node] = []  # replaced or dropped placeholders, erased at commit

    # -- tensors ---------------------------------------------------------------------------

    def entry(self, position: int) -> _Entry:
        return self._tensor_by_position[position]

    def _placeholder_for(self, fw_node: fx.Node) -> fx.Node:
        """A new backward placeholder for ``fw_node``; both get one name, free in both graphs."""
        name = name_in_both(self.fw, self.bw, fw_node)
        first = self.bw.graph.find_nodes(op="placeholder")[0]
        with self.bw.graph.inserting_before(first):
            placeholder = self.bw.graph.placeholder(name)
        set_val(placeholder, fw_node.meta["val"])
        return placeholder  # commit() moves it to its place

    def replace_tensor(self, position: int, fw_node: fx.Node) -> fx.Node:
        """Save ``fw_node`` in place of the tensor at ``position``; returns its new placeholder.

        The old placeholder stays in the graph until ``drop_tensor`` or ``commit``; the
        caller moves its uses first.
        """
        entry = self.entry(position)
        old_placeholder = entry.bw_placeholder
        entry.fw_node = fw_node
        entry.bw_placeholder = self._placeholder_for(fw_node)
        self._retired.append(old_placeholder)
        return entry.bw_placeholder

    def drop_tensor(self, position: int) -> fx.Node:
        """Stop saving the tensor at ``position``; returns its placeholder (uses must be moved)."""
        entry = self.entry(position)
        self.tensors.remove(entry)
        self._retired.append(entry.bw_placeholder)
        return entry.bw_placeholder

    def add_tensor(self, fw_node: fx.Node) -> fx.Node:
        entry = _Entry(fw_node, self._placeholder_for(fw_node))
        self.tensors.append(entry)
        return entry.bw_placeholder

    # -- SymInts ---------------------------------------------------------------------------

    def symint(self, fw_node: fx.Node) -> fx.Node:
        """A backward node for the forward SymInt ``fw_node``, saving it if needed."""
        for entry in self.symints:
            if entry.fw_node is fw_node:
                return entry.bw_placeholder
        expr = fw_node.meta["val"].node.expr
        if expr in self._symint_by_expr:
            return self._symint_by_expr[expr].bw_placeholder
        entry = _Entry(fw_node, self._placeholder_for(fw_node))
        self.symints.append(entry)
        self._symint_by_expr[expr] = entry
        return entry.bw_placeholder

    def size(self, fw_tensor: fx.Node, dim: int, after: fx.Node):
        """Size ``dim`` of a forward tensor as an int, or as a backward SymInt node."""
        size = fw_tensor.meta["val"].shape[dim]
        if not isinstance(size, torch.SymInt):
            return size
        if size.node.expr in self._symint_by_expr:
            return self._symint_by_expr[size.node.expr].bw_placeholder
        with self.fw.graph.inserting_after(after):
            size_node = self.fw.graph.call_function(torch.ops.aten.sym_size.int, (fw_tensor, dim))
        set_val(size_node, size)
        return self.symint(size_node)

    # -- commit ----------------------------------------------------------------------------

    def commit(self) -> None:
        """Write the section back into both graphs, in AOTAutograd's order."""
        for placeholder in self._retired:
            if placeholder.users:
                raise RuntimeError(f"gact: placeholder {placeholder.name} still has users at commit")
            self.bw.graph.erase_node(placeholder)
        self._retired.clear()
        # Stable: tensors saved without a version-counter check must come last.
        self.tensors.sort(key=lambda e: saved_without_vc_check(e.fw_node))
        out = output_node(self.fw)
        real = list(out.args[0][: self.num_fwd_outputs])
        out.args = (tuple(real + [e.fw_node for e in self.tensors + self.symints]),)
        if self._real_descs is not None:
            default = saved_output_descriptor()
            set_output_descriptors(
                out, self._real_descs + [(e.desc_type or default)(i) for i, e in enumerate(self.tensors + self.symints)]
            )
        self._order_placeholders()

    def _order_placeholders(self) -> None:
        ours = [e.bw_placeholder for e in self.symints + self.tensors]
        mine = set(ours)
        rest = [p for p in self.bw.graph.find_nodes(op="placeholder") if p not in mine]
        previous = None
        for placeholder in ours + rest:
            if previous is None:
                first = next(iter(self.bw.graph.nodes))
                if first is not placeholder:
                    first.prepend(placeholder)
            else:
                previous.append(placeholder)
            previous = placeholder


def name_in_both(fw: fx.GraphModule, bw: fx.GraphModule, fw_node: fx.Node, base: str | None = None) -> str:
    """Rename ``fw_node`` to a name (``base`` or a suffixed variant) that no other node of
    either graph uses, and return it: the backward placeholder must carry the same one."""
    taken = {n.name for n in fw.graph.nodes if n is not fw_node} | {n.name for n in bw.graph.nodes}
    base = base or fw_node.name
    name, suffix = base, 0
    while name in taken:
        suffix += 1
        name = f"{base}_{suffix}"
    if name != fw_node.name:
        rename_node(fw_node, name)
    return name


def finish(fw: fx.GraphModule, bw: fx.GraphModule, num_fwd_outputs: int) -> None:
    """End of a pass: dead-code-eliminate, lint, recompile, and re-check the contract."""
    for gm in (fw, bw):
        gm.graph.eliminate_dead_code()
        gm.graph.lint()
        gm.recompile()
    find_saved(fw, bw, num_fwd_outputs)  # raises if the forward/backward pairing broke
