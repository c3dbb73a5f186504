"""Apply a ``CompressionPlan`` to a forward/backward graph pair, in place.

Forward: ``gact::quantize`` right after each source's producer; its blob is saved where
the first member was, and the other members are no longer saved. Backward: one blob
placeholder, ``gact::dequantize`` just before the first use (with feature groups, told
to decode into the source's own layout), and every member rebuilt
by replaying its view chain on the decoded tensor. Dynamic sizes and symbolic view
arguments the backward now needs become saved SymInts (``SavedSection``). New nodes
get ``meta["val"]`` and a ``meta["gact"]`` record; both graphs end linted.

Masks on the CPU under Inductor (``masks_as_bytes``) take another path: Inductor's CPU
kernels store a bool tensor at about 7 ns an element and load one at 2.5 ns, where bytes
and floats take a tenth of that (torch 2.13, measured on this project's machine: a
ReLU's mask of 82k elements, 630 us against 18 us). So the forward hands the op the mask
as bytes 0 and 1 (converted to int32, then uint8, which Inductor fuses into the
producer, never storing the bool; a mask that is a graph input goes to the op as it is),
and the backward decodes it to float32 with ``gact::unpack_mask`` and tests it (``!= 0``)
where the bool was used, a test Inductor fuses into the consumer. The blob is the same 1-bit blob, and the gradient the bool path's,
bit for bit. (bfloat16 would halve the decoded bytes and loads as fast, but a bfloat16 input
changed how Inductor tiled the consuming kernels' reductions: gradients moved by a few ulps.)
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
UNPACK_MASK = torch.ops.gact.unpack_mask.default


def _as_bytes(fw: fx.GraphModule, mask: fx.Node, anchor: fx.Node, fake_mode) -> fx.Node:
    """``mask`` as uint8 0 and 1: converted through int32, which Inductor fuses into the
    producer without storing a bool (a direct conversion took 40% of the bool store's time)."""
    convert = torch.ops.prims.convert_element_type.default
    with fw.graph.inserting_after(anchor):
        words = fw.graph.call_function(convert, (mask, torch.int32), name=f"gact_words_{mask.name}")
    with fw.graph.inserting_after(words):
        as_bytes = fw.graph.call_function(convert, (words, torch.uint8), name=f"gact_bytes_{mask.name}")
    with fake_mode:
        set_val(words, convert(mask.meta["val"], torch.int32))
        set_val(as_bytes, convert(words.meta["val"], torch.uint8))
    for node in (words, as_bytes):
        node.meta["gact"] = {"role": "mask_bytes", "source": mask.name}
    return as_bytes


def _insert_quantize(fw: fx.GraphModule, compression: Compression, fake_mode, as_bytes: bool) -> fx.Node:
    source = compression.source
    anchor = source if source.op != "placeholder" else fw.graph.find_nodes(op="placeholder")[-1]
    # After the source's last use in the forward, which it outlives anyway: placed before
    # a use, the quantize's exact-stride demand makes Inductor compute a pointwise source
    # twice, into a buffer of its own for the quantize and into another for that use.
    order = {node: index for index, node in enumerate(fw.graph.nodes)}
    anchor = max([anchor, *(user for user in source.users if user.op != "output")], key=order.__getitem__)
    if as_bytes:
        anchor = encoded = _as_bytes(fw, source, anchor, fake_mode)
    else:
        encoded = source
    args = (encoded, compression.bits, compression.group_size, list(compression.perm), compression.slot)
    with fw.graph.inserting_after(anchor):
        node = fw.graph.call_function(QUANTIZE, args, name=f"gact_blob_{source.name}")
    with fake_mode:
        given = encoded.meta["val"]
        if compression.channels_last:  # as Inductor's layout optimisation will lay it out
            given = given.contiguous(memory_format=torch.channels_last)
        set_val(node, QUANTIZE(given, *args[1:]))
    if compression.bits == RUNTIME_BITS:  # the blob's length is data-dependent: say where it is bound
        set_unbacked_bindings(node, unbacked_bindings(fake_mode, node.meta["val"]))
    # Inductor must hand the op its input in the compile-time layout (see the op's tags),
    # channels-last where the plan says Inductor lays it out so.
    set_eager_input_vals(node, (given, *args[1:]))
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


def _decode(bw: fx.GraphModule, compression: Compression, args: tuple, blob_val, as_floats: bool, fake_mode) -> fx.Node:
    """The backward's nodes that rebuild the source from its blob (``args`` as for ``gact::dequantize``)."""
    source = compression.source
    symbolic = [s if isinstance(s, int) else s.meta["val"] for s in args[1]]
    if not as_floats:
        decoded = bw.graph.call_function(DEQUANTIZE, args, name=f"gact_decoded_{source.name}")
        with fake_mode:
            set_val(decoded, DEQUANTIZE(blob_val, symbolic, *args[2:]))
        decoded.meta["gact"] = {"role": "dequantize", "source": source.name, "bits": compression.bits}
        return decoded
    blob_in, shape, _, _, perm, _, *layout = args
    unpack_args = (blob_in, shape, torch.float32, perm, *layout)
    floats = bw.graph.call_function(UNPACK_MASK, unpack_args, name=f"gact_decoded_{source.name}")
    mask = bw.graph.call_function(torch.ops.aten.ne.Scalar, (floats, 0), name=f"gact_mask_{source.name}")
    with fake_mode:
        set_val(floats, UNPACK_MASK(blob_val, symbolic, *unpack_args[2:]))
        set_val(mask, torch.ops.aten.ne.Scalar(floats.meta["val"], 0))
    floats.meta["gact"] = {"role": "dequantize", "source": source.name, "bits": compression.bits}
    mask.meta["gact"] = {"role": "replay", "source": source.name}
    return mask


def _compress(section: SavedSection, compression: Compression, fake_mode, masks_as_bytes: bool) -> None:
    fw, bw = section.fw, section.bw
    val = compression.source.meta["val"]
    as_floats = masks_as_bytes and val.dtype == torch.bool and val.device.type == "cpu"
    # A mask that is a graph input is no kernel's output: converting it would add a kernel that loads bools.
    as_bytes = as_floats and compression.source.op != "placeholder"
    blob = _insert_quantize(fw, compression, fake_mode, as_bytes)
    first, *others = compression.members
    old = [section.entry(m.position).bw_placeholder for m in compression.members]
    blob_in = section.replace_tensor(first.position, blob)
    for member in others:
        section.drop_tensor(member.position)
    blob_in.meta["gact"] = dict(blob.meta["gact"], role="blob")

    source = compression.source
    shape = [section.size(source, dim, blob) for dim in range(val.dim())]
    args = (blob_in, shape, val.dtype, compression.group_size, list(compression.perm), compression.slot)
    if compression.dense_perm is not None:  # decoded in the source's own layout, which the backward was traced with
        args = (*args, list(compression.dense_perm))
    with bw.graph.inserting_before(_first_user(bw, old)):
        decoded = _decode(bw, compression, args, blob.meta["val"], as_floats, fake_mode)
        env = {source: decoded}
        for member, placeholder in zip(compression.members, old):
            for view in member.chain:
                if view not in env:
                    env[view] = bw.graph.node_copy(view, lambda n: env[n] if n in env else section.symint(n))
                    env[view].meta["gact"] = {"role": "replay", "source": source.name}
            placeholder.replace_all_uses_with(env[member.chain[-1]] if member.chain else decoded)


def apply_plan(
    fw: fx.GraphModule, bw: fx.GraphModule, saved: SavedGraph, plan: CompressionPlan, *, masks_as_bytes: bool = False
) -> None:
    """Rewrite ``fw`` and ``bw`` in place so that the plan's sources are saved compressed
    (``masks_as_bytes``: CPU masks through bytes and floats, for Inductor; see above)."""
    if not plan.compressions:
        return
    fake_mode = detect_fake_mode([c.source.meta["val"] for c in plan.compressions])
    section = SavedSection(fw, bw, saved)
    for compression in plan.compressions:
        _compress(section, compression, fake_mode, masks_as_bytes)
    section.commit()
    finish(fw, bw, saved.num_fwd_outputs)
