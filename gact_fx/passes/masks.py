"""Hoist backward comparisons of saved activations into the forward, as exact bool masks.

Backward graphs often rebuild a mask from a saved activation: ReLU's backward is
``where(le(relu_out, 0), 0, grad)``. A quantized ``relu_out`` rounds small positive
values to 0 and flips that mask, which biases the gradient (5.9% error at 8 bits on an
MLP, against ~1% for GELU). This pass computes each such comparison in the forward on
the exact value and saves the bool result instead (1 bit per element, lossless after
compression); the saved activation is dropped when nothing else in backward uses it.
"""

from __future__ import annotations

import numbers

import torch
import torch.fx as fx

from .plan import COMPRESSIBLE_KINDS
from .saved import SavedGraph, output_node
from .section import SavedSection, finish
from .views import view_parent

aten = torch.ops.aten
COMPARISONS = frozenset(
    {aten.le.Scalar, aten.lt.Scalar, aten.gt.Scalar, aten.ge.Scalar, aten.eq.Scalar, aten.ne.Scalar}
)
FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def _comparisons_of(placeholder: fx.Node) -> list[tuple[tuple[fx.Node, ...], fx.Node]]:
    """(view chain, comparison) pairs: comparisons with a constant reached through views."""
    found = []
    frontier = [(placeholder, ())]
    while frontier:
        node, chain = frontier.pop()
        for user in node.users:
            if user.target in COMPARISONS and user.args[0] is node and isinstance(user.args[1], numbers.Number):
                found.append((chain, user))
            elif view_parent(user) is node:
                frontier.append((user, (*chain, user)))
    return found


def hoist_comparisons(fw: fx.GraphModule, bw: fx.GraphModule, saved: SavedGraph) -> int:
    """Rewrite in place; returns the number of comparisons moved to the forward."""
    section = SavedSection(fw, bw, saved)
    fw_symint = {e.bw_placeholder: e.fw_node for e in section.symints}
    fw_output = output_node(fw)
    hoisted = 0
    for value in saved.tensors:
        if value.kind not in COMPRESSIBLE_KINDS or value.val.dtype not in FLOATS:
            continue
        placeholder = value.bw_placeholder
        for chain, comparison in _comparisons_of(placeholder):
            env = {placeholder: value.node}
            # Before the output: every forward value (and saved SymInt) exists there.
            with fw.graph.inserting_before(fw_output):
                for node in (*chain, comparison):
                    env[node] = fw.graph.node_copy(node, lambda n: env[n] if n in env else fw_symint[n])
                    env[node].meta.pop("autograd_backward", None)
            mask = env[comparison]
            mask.meta["gact"] = {"role": "hoisted_mask", "of": value.node.name}
            comparison.replace_all_uses_with(section.add_tensor(mask))
            bw.graph.erase_node(comparison)
            hoisted += 1
        bw.graph.eliminate_dead_code()
        if not placeholder.users:
            section.drop_tensor(value.position)
    if hoisted:
        section.commit()
        finish(fw, bw, saved.num_fwd_outputs)
    return hoisted
