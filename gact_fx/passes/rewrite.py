"""Apply a ``CompressionPlan`` to a forward/backward graph pair, in place.

Forward: ``gact::quantize`` right after each source's producer; its blob is saved where
the first member was, and the other members are no longer saved. Backward: one blob
placeholder, ``gact::dequantize`` just before the first use (with feature groups, told
to decode into the source's own layout), and every member rebuilt
by replaying its view chain on the decoded tensor. Dynamic sizes and symbolic view
arguments the backward now needs become saved SymInts (``SavedSection``). New nodes
get ``meta["val"]`` and a ``meta["gact"]`` record; both graphs end linted.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from .._compat import (
    detect_fake_mode,
    mark_saved_without_vc_check,
    saved_without_vc_check,
    set_eager_input_vals,
    set_unbacked_bindings,
    unbacked_bindings,
)
from ..runtime import ops as _ops  # noqa: F401  (registers torch.ops.gact)
from ..runtime.format import RUNTIME_BITS
from .plan import Compression, CompressionPlan
from .saved import SavedGraph, output_node
from .section import SavedSection, finish, set_val

QUANTIZE = torch.ops.gact.quantize.default
DEQUANTIZE = torch.ops.gact.dequantize.default


def _insert_quantize(fw: fx.GraphModule, compression: Compression, fake_mode) -> fx.Node:
    source = compression.source
    args = (source, compression.bits, compression.group_size, list(compression.perm), compression.slot)
    anchor = source if source.op != "placeholder" else fw.graph.find_nodes(op="placeholder")[-1]
    with fw.graph.inserting_after(anchor):
        node = fw.graph.call_function(QUANTIZE, args, name=f"gact_blob_{source.name}")
    with fake_mode:
        set_val(node, QUANTIZE(source.meta["val"], *args[1:]))
    if compression.bits == RUNTIME_BITS:  # the blob's length is data-dependent: say where it is bound
        set_unbacked_bindings(node, unbacked_bindings(fake_mode, node.meta["val"]))
    # Inductor must hand the op its input in the compile-time layout (see the op's tags).
    set_eager_input_vals(node, (source.meta["val"], *args[1:]))
    # ``nbytes``: the blob's size, which with run-time bits its shape cannot give (unbacked).
    node.meta["gact"] = {
        "role": "quantize", "source": source.name, "bits": compression.bits, "slot": compression.slot,
        "nbytes": compression.bytes_after,
    }
    if saved_without_vc_check(source):
        mark_saved_without_vc_check(node)
    return node


def _first_user(bw: fx.GraphModule, placeholders: list[fx.Node]) -> fx.Node:
    order = {node: index for index, node in enumerate(bw.graph.nodes)}
    users = [user for ph in placeholders for user in ph.users]
    return min(users, key=order.__getitem__) if users else output_node(bw)


def _compress(section: SavedSection, compression: Compression, fake_mode) -> None:
    fw, bw = section.fw, section.bw
    blob = _insert_quantize(fw, compression, fake_mode)
    first, *others = compression.members
    old = [section.entry(m.position).bw_placeholder for m in compression.members]
    blob_in = section.replace_tensor(first.position, blob)
    for member in others:
        section.drop_tensor(member.position)
    blob_in.meta["gact"] = dict(blob.meta["gact"], role="blob")

    source = compression.source
    val = source.meta["val"]
    shape = [section.size(source, dim, blob) for dim in range(val.dim())]
    args = (blob_in, shape, val.dtype, compression.group_size, list(compression.perm), compression.slot)
    if compression.dense_perm is not None:  # decoded in the source's own layout, which the backward was traced with
        args = (*args, list(compression.dense_perm))
    with bw.graph.inserting_before(_first_user(bw, old)):
        decoded = bw.graph.call_function(DEQUANTIZE, args, name=f"gact_decoded_{source.name}")
        with fake_mode:
            symbolic = [s if isinstance(s, int) else s.meta["val"] for s in shape]
            set_val(decoded, DEQUANTIZE(blob.meta["val"], symbolic, *args[2:]))
        decoded.meta["gact"] = {"role": "dequantize", "source": source.name, "bits": compression.bits}
        env = {source: decoded}
        for member, placeholder in zip(compression.members, old):
            for view in member.chain:
                if view not in env:
                    env[view] = bw.graph.node_copy(view, lambda n: env[n] if n in env else section.symint(n))
                    env[view].meta["gact"] = {"role": "replay", "source": source.name}
            placeholder.replace_all_uses_with(env[member.chain[-1]] if member.chain else decoded)


def apply_plan(fw: fx.GraphModule, bw: fx.GraphModule, saved: SavedGraph, plan: CompressionPlan) -> None:
    """Rewrite ``fw`` and ``bw`` in place so that the plan's sources are saved compressed."""
    if not plan.compressions:
        return
    fake_mode = detect_fake_mode([c.source.meta["val"] for c in plan.compressions])
    section = SavedSection(fw, bw, saved)
    for compression in plan.compressions:
        _compress(section, compression, fake_mode)
    section.commit()
    finish(fw, bw, saved.num_fwd_outputs)
