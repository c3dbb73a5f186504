"""Replace the opaque ``gact::`` ops of a rewritten graph pair by traced code Inductor sees.

Each ``gact::quantize`` becomes a codec's traced ``encode`` and each ``gact::dequantize``
its traced ``decode``; the forward gets one ``gact::keys`` call for all its slots. Two
codecs, one lowering each:

- ``lowering="aten"``: ``runtime.aten_codec``, plain aten ops, which Inductor fuses with
  the producing and consuming kernels;
- ``lowering="triton"``: ``runtime.wrapped_codec``, gact's Triton kernels as user-defined
  kernels, which Inductor launches from its own code.

Traced with ``make_fx`` over the graphs' own fake values, with Inductor's decompositions,
so dynamic sizes stay symbolic. Needs bits fixed at compile time (run-time bits stay on
the opaque ops).
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from .._compat import (
    detect_fake_mode,
    eager_input_vals,
    inductor_decompositions,
    rename_node,
    set_eager_input_vals,
    trace_with_fake_values,
    wrapped_triton_launches,
)
from ..runtime import aten_codec, wrapped_codec
from ..runtime.format import RUNTIME_BITS
from .rewrite import DEQUANTIZE, QUANTIZE
from .section import finish, name_in_both, set_val

KEYS = torch.ops.gact.keys.default
CODECS = {"aten": aten_codec, "triton": wrapped_codec}  # each lowering's codec


def _check_functional(sub: fx.GraphModule) -> None:
    # Inductor takes these graphs to be functional: a traced in-place op corrupted the
    # forward values of a transformer block before this check existed. (A Triton launch
    # writes only the buffer it was traced allocating.)
    for node in sub.graph.nodes:
        schema = getattr(node.target, "_schema", None)
        if schema is not None and schema.is_mutable:
            raise RuntimeError(f"gact: a codec traced a mutating op ({node.target}); it must be functional")


def _functional_launches(sub: fx.GraphModule) -> None:
    """Make each traced Triton launch functional: it returns the buffers it writes (those the
    traced code allocated for it), and later uses read them from its result. In place, it
    has no users and dead-code elimination would drop it; Inductor makes it in place again,
    without the copy, where the buffer has no other use. The traced launch's input values
    go with it: Inductor then hands the kernel its tensors in the traced strides exactly,
    which the kernel's arguments (a row stride, a flat view) were computed from."""
    in_place, functional = wrapped_triton_launches()
    for node in sub.graph.find_nodes(op="call_function", target=in_place):
        arguments = node.kwargs["kwargs"]
        written = [name for name, value in arguments.items()
                   if isinstance(value, fx.Node) and value.target == torch.ops.aten.empty.memory_format]
        if not written:
            raise RuntimeError(f"gact: a traced Triton launch writes no buffer it allocated ({arguments})")
        with sub.graph.inserting_after(node):
            launch = sub.graph.call_function(functional, kwargs={**node.kwargs, "tensors_to_clone": written})
        launch.meta["val"] = {name: arguments[name].meta["val"] for name in written}
        traced_values = eager_input_vals(node)
        if traced_values is None:
            raise RuntimeError("gact: make_fx kept no input values for a traced Triton launch")
        set_eager_input_vals(launch, traced_values[0], {**traced_values[1], "tensors_to_clone": None})
        for name in written:
            buffer = arguments[name]
            later = [user for user in buffer.users if user is not node and user is not launch and node < user]
            with sub.graph.inserting_after(launch):
                result = sub.graph.call_function(operator.getitem, (launch, name))
            result.meta["val"] = buffer.meta["val"]
            for user in later:
                user.replace_input_with(buffer, result)
        sub.graph.erase_node(node)
    sub.graph.lint()


def _inline(graph: fx.Graph, sub: fx.GraphModule, inputs: list[fx.Node], before: fx.Node, role: str) -> fx.Node:
    _functional_launches(sub)
    _check_functional(sub)
    env = dict(zip(sub.graph.find_nodes(op="placeholder"), inputs))
    with graph.inserting_before(before):
        for node in sub.graph.nodes:
            if node.op == "placeholder":
                continue
            if node.op == "output":
                (result,) = node.args[0] if isinstance(node.args[0], (list, tuple)) else (node.args[0],)
                return env[result]
            env[node] = graph.node_copy(node, lambda n: env[n])
            env[node].meta["gact"] = {"role": role}
    raise RuntimeError("traced subgraph has no output")


def _encoder(codec, perm, bits, group_size, dithered):
    def encode(x, key):
        return codec.encode(x, perm, bits, group_size, key, dithered)

    return encode


def _decoder(codec, shape, dtype, group_size, perm, bits, layout, dithered):
    """``decode(blob, *symbolic sizes)``: the static sizes of ``shape`` are baked in."""

    def decode(blob, *sizes):
        given = iter(sizes)
        full = [next(given) if isinstance(s, fx.Node) else s for s in shape]
        return codec.decode(blob, full, dtype, group_size, perm, bits, layout, dithered)

    return decode


def _lower_quantizes(fw: fx.GraphModule, bw: fx.GraphModule, fake_mode, decompositions, lowering: str,
                     dithered: bool) -> None:
    quantizes = fw.graph.find_nodes(op="call_function", target=QUANTIZE)
    if any(q.args[1] == RUNTIME_BITS for q in quantizes):
        raise ValueError(f"lowering={lowering!r} needs bits fixed at compile time; adaptive bits use the gact:: ops")
    device = quantizes[0].args[0].meta["val"].device
    slots = [q.args[4] for q in quantizes]
    with fw.graph.inserting_after(fw.graph.find_nodes(op="placeholder")[-1]):
        keys = fw.graph.call_function(KEYS, (slots, device))
    with fake_mode:
        set_val(keys, KEYS(slots, device))
    for index, node in enumerate(quantizes):
        source, bits, group_size, perm, _ = node.args
        with fw.graph.inserting_before(node):
            key = fw.graph.call_function(torch.ops.aten.select.int, (keys, 0, index))
        with fake_mode:
            set_val(key, keys.meta["val"][index])

        traced = trace_with_fake_values(
            _encoder(CODECS[lowering], perm, bits, group_size, dithered), [source.meta["val"], key.meta["val"]], fake_mode,
            decompositions
        )
        blob = _inline(fw.graph, traced, [source, key], node, "quantize")
        blob.meta["gact"] = dict(node.meta["gact"])
        node.replace_all_uses_with(blob)
        fw.graph.erase_node(node)
        # The saved value and its backward placeholder must share a name.
        placeholder = next(p for p in bw.graph.find_nodes(op="placeholder") if p.name == node.name)
        rename_node(placeholder, name_in_both(fw, bw, blob, base=node.name))


def _lower_dequantizes(bw: fx.GraphModule, fake_mode, decompositions, lowering: str, dithered: bool) -> None:
    for node in bw.graph.find_nodes(op="call_function", target=DEQUANTIZE):
        blob, shape, dtype, group_size, perm, _, *layout = node.args
        bits = blob.meta["gact"]["bits"]
        symbolic = [s for s in shape if isinstance(s, fx.Node)]
        values = [blob.meta["val"], *(s.meta["val"] for s in symbolic)]
        decoder = _decoder(CODECS[lowering], shape, dtype, group_size, perm, bits, layout[0] if layout else None,
                           dithered)
        traced = trace_with_fake_values(decoder, values, fake_mode, decompositions)
        decoded = _inline(bw.graph, traced, [blob, *symbolic], node, "dequantize")
        decoded.meta["gact"] = dict(node.meta["gact"])
        node.replace_all_uses_with(decoded)
        bw.graph.erase_node(node)


def lower_ops(fw: fx.GraphModule, bw: fx.GraphModule, num_fwd_outputs: int, lowering: str,
              dithered: bool = False) -> int:
    """Rewrite in place with ``CODECS[lowering]``; returns the number of quantize ops lowered
    (``dithered``: the sites' ``rounding="dithered"``, which the float blobs then carry)."""
    quantizes = fw.graph.find_nodes(op="call_function", target=QUANTIZE)
    if not quantizes:
        return 0
    fake_mode = detect_fake_mode([q.args[0].meta["val"] for q in quantizes])
    decompositions = inductor_decompositions()
    _lower_quantizes(fw, bw, fake_mode, decompositions, lowering, dithered)
    _lower_dequantizes(bw, fake_mode, decompositions, lowering, dithered)
    finish(fw, bw, num_fwd_outputs)
    return len(quantizes)
