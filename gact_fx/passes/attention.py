"""Give a fused attention backward the output and logsumexp of what was stored.

An SDPA backward takes the forward's ``out`` and ``logsumexp`` beside ``query``, ``key``
and ``value``, and relies on them agreeing: it forms ``D = rowsum(grad_out * out)``,
which equals ``sum_j P_ij dP_ij`` only for ``out = P value``, and rebuilds ``P`` from
``logsumexp``. With ``value`` rounded and ``out`` rounded apart (or kept exact), they no
longer agree, and the mismatch enters ``dS = P (dP - D)`` as a shift of each row that
``grad_query`` and ``grad_key`` then multiply by the keys and queries. As training
sharpens attention this term dominates: on a synthetic head with logits spread like a
trained model's, 2-bit ``value`` and ``out`` gave ``grad_query`` a relative error of 4.3,
against 0.8 once ``out`` and ``logsumexp`` were recomputed from the rounded inputs.

``recompute_attention_outputs`` inserts, before each attention backward whose inputs are
stored lossy, the matching forward op on the backward's own ``query``, ``key``,
``value`` and mask, and feeds the backward its ``output`` and ``logsumexp``. The
forward's ``out`` and ``logsumexp`` are then saved only if something else needs them
(the output projection usually reads ``out`` through a view). Cost: one attention
forward per layer in the backward. Attention with dropout is left alone: its mask would
have to be replayed.
"""

from __future__ import annotations

import contextlib
import logging
import operator
from collections.abc import Collection

import torch
import torch.fx as fx

from .._compat import detect_fake_mode
from .hoist import lossy_placeholders
from .saved import SavedGraph
from .section import SavedSection, finish
from .views import alias_path

log = logging.getLogger(__name__)

# Forward arguments the backward does not carry: the values the forward needs here.
_FORWARD_ONLY = {"compute_log_sumexp": True, "return_debug_mask": False}
_SAME_ARGUMENT = {"attn_bias": ("attn_bias", "attn_mask"), "attn_mask": ("attn_mask", "attn_bias")}


def sdpa_forward_of(node: fx.Node):
    """The forward overload of an SDPA backward node, if aten has one (else None)."""
    schema = getattr(node.target, "_schema", None)
    if schema is None or not schema.name.startswith("aten::_scaled_dot_product") or not schema.name.endswith("_backward"):
        return None
    packet = getattr(torch.ops.aten, schema.name.removeprefix("aten::").removesuffix("_backward"), None)
    return None if packet is None else packet.default


def bound_arguments(node: fx.Node) -> dict[str, object]:
    """A call's arguments by schema name, defaults included."""
    schema = node.target._schema
    bound = {a.name: a.default_value for a in schema.arguments if a.has_default_value()}
    bound.update(zip((a.name for a in schema.arguments), node.args))
    bound.update(node.kwargs)
    return bound


def forward_call(forward, backward: dict[str, object]) -> tuple[tuple, dict] | None:
    """The forward's args and kwargs from the backward's bound arguments (None if one is missing)."""
    args, kwargs = [], {}
    for argument in forward._schema.arguments:
        names = _SAME_ARGUMENT.get(argument.name, (argument.name,))
        found = next((backward[n] for n in names if n in backward), _FORWARD_ONLY.get(argument.name, KeyError))
        if found is KeyError:
            if not argument.has_default_value():
                return None
            continue
        if argument.kwarg_only:
            kwargs[argument.name] = found
        else:
            args.append(found)
    return tuple(args), kwargs


def attention_backwards(bw: fx.GraphModule):
    """Each SDPA backward without dropout that takes the forward's ``out`` and ``logsumexp``:
    (node, its forward overload, its bound arguments), over a snapshot of the graph's nodes."""
    for node in list(bw.graph.nodes):
        forward = sdpa_forward_of(node) if node.op == "call_function" else None
        if forward is None:
            continue
        backward = bound_arguments(node)
        if backward.get("dropout_p") or "out" not in backward or "logsumexp" not in backward:
            continue
        yield node, forward, backward


def _reads_lossy(value, lossy: set[fx.Node]) -> bool:
    return isinstance(value, fx.Node) and alias_path(value).root in lossy


def recompute_attention_outputs(
    fw: fx.GraphModule, bw: fx.GraphModule, saved: SavedGraph, quantized: Collection[int] | None = None
) -> int:
    """Rewrite in place; returns the number of attention backwards changed
    (``quantized`` as for ``passes.hoist.hoist_comparisons``)."""
    lossy = lossy_placeholders(saved, quantized)
    changed = 0
    for node, forward, backward in attention_backwards(bw):
        if not any(_reads_lossy(backward.get(name), lossy) for name in ("query", "key", "value")):
            continue
        call = forward_call(forward, backward)
        if call is None:
            log.debug("%s: no way to call %s from its arguments", node.name, forward)
            continue
        with bw.graph.inserting_before(node):
            recomputed = bw.graph.call_function(forward, *call)
            output = bw.graph.call_function(operator.getitem, (recomputed, 0))
            logsumexp = bw.graph.call_function(operator.getitem, (recomputed, 1))
        with detect_fake_mode(fake_inputs(node)) or contextlib.nullcontext():
            values = forward(*fake_values(call[0]), **fake_values(call[1]))
        recomputed.meta["val"] = values
        output.meta["val"], logsumexp.meta["val"] = values[0], values[1]
        schema_names = [a.name for a in node.target._schema.arguments]
        new_args = list(node.args)
        for name, value in (("out", output), ("logsumexp", logsumexp)):
            index = schema_names.index(name)
            if index < len(new_args):
                new_args[index] = value
            else:
                node.update_kwarg(name, value)
        node.args = tuple(new_args)
        changed += 1
    if not changed:
        return 0
    bw.graph.eliminate_dead_code()
    section = SavedSection(fw, bw, saved)
    for value in saved.tensors:
        if not value.bw_placeholder.users:
            section.drop_tensor(value.position)
    section.commit()
    finish(fw, bw, saved.num_fwd_outputs)
    log.debug("recomputed the output and logsumexp of %d attention backward(s)", changed)
    return changed


def fake_values(value):
    """``value`` with each node in it replaced by its fake value."""
    if isinstance(value, fx.Node):
        return value.meta["val"]
    if isinstance(value, (list, tuple)):
        return type(value)(fake_values(v) for v in value)
    if isinstance(value, dict):
        return {k: fake_values(v) for k, v in value.items()}
    return value


def fake_inputs(node: fx.Node) -> list:
    """The fake tensors among a node's inputs (to find their fake mode)."""
    return [n.meta["val"] for n in node.all_input_nodes if isinstance(n.meta.get("val"), torch.Tensor)]
