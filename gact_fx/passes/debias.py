"""Cancel the bias that rounded query and key put into a fused attention backward.

The attention backward rebuilds ``P = softmax(q k^T * scale)`` from the stored query and
key. Rounding noise in them is unbiased, but softmax is curved: the gradient's mean
moves by about the logits' noise variance times the curvature. At 4 bits that bias is a
few percent of the gradient (docs/accuracy.md), which is why query and key keep 8 bits
(``CoreConfig.nonlinear_bits``).

For a gradient ``g(x)`` evaluated at ``x + e`` with zero-mean noise ``e`` of covariance
``C``, ``E[g(x + e)] = g(x) + B`` with ``B`` the second-order term ``(1/2) tr(C d2g)``.
Evaluating at ``x + e + z`` and ``x + e - z``, with ``z`` of the same covariance and
independent of ``e``, gives on average ``g(x) + 2B`` each, to the same order, so

    2 g(x + e) - (g(x + e + z) + g(x + e - z)) / 2

has mean ``g(x)`` up to higher-order terms. With dithered rounding (``rounding="dithered"``)
the noise is uniform over one step of each group whatever the value, and decoding the
same codes under another key (``gact::redither``) gives ``x + e'``: ``z = (e' - e) / sqrt(2)``
is the difference of the two draws' dither over sqrt(2), zero-mean with exactly ``e``'s
covariance. It is not independent of ``e`` for a value at a fixed place between two
levels, which leaves a third-order term; a ``z`` from two further keys, independent of
``e``, measured no better (docs/accuracy.md). Stochastic rounding's noise depends on the
value, and its codes decode the same under any key, so the pass needs dithering.

``debias_attention`` runs after the rewrite, on the backward graph: for each SDPA
backward whose query or key is decoded from a blob, it decodes them again under other
noise, recomputes the attention forward and runs the backward at the shifted inputs
too, and replaces each gradient the backward returns by the combination above. Cost:
two attention forwards and backwards more per layer. Attention with dropout is left
alone, as ``passes.attention`` leaves it.
"""

from __future__ import annotations

import contextlib
import logging
import math
import operator

import torch
import torch.fx as fx

from .._compat import detect_fake_mode
from .attention import attention_backwards, bound_arguments, fake_inputs, fake_values, forward_call
from .rewrite import DEQUANTIZE
from .views import alias_path

log = logging.getLogger(__name__)

REDITHER = torch.ops.gact.redither.default
_aten = torch.ops.aten
_SHIFTED = ("query", "key")


class _Emitter:
    """Adds nodes to ``graph`` before a point, each with the fake value its op gives."""

    def __init__(self, graph: fx.Graph, fake_mode) -> None:
        self.graph = graph
        self.fake_mode = fake_mode

    def __call__(self, target, *args, **kwargs) -> fx.Node:
        node = self.graph.call_function(target, args, kwargs)
        with self.fake_mode or contextlib.nullcontext():
            node.meta["val"] = target(*fake_values(args), **fake_values(kwargs))
        return node


def _decoded_root(value) -> tuple[fx.Node, tuple[fx.Node, ...]] | None:
    """The ``gact::dequantize`` a backward argument is a view of, and the views in between."""
    if not isinstance(value, fx.Node):
        return None
    path = alias_path(value)
    if path.root.op != "call_function" or path.root.target is not DEQUANTIZE:
        return None
    return path.root, path.chain


def _replay(emit: _Emitter, chain: tuple[fx.Node, ...], root: fx.Node, new_root: fx.Node) -> fx.Node:
    """The views ``chain`` took from ``root``, taken from ``new_root``."""
    mapping = {root: new_root}
    current = new_root
    for view in chain:
        args = fx.node.map_arg(view.args, lambda n: mapping.get(n, n))
        kwargs = fx.node.map_arg(view.kwargs, lambda n: mapping.get(n, n))
        current = mapping[view] = emit(view.target, *args, **kwargs)
    return current


def _shifted_roots(emit: _Emitter, root: fx.Node) -> tuple[fx.Node, fx.Node]:
    """The decoded ``root`` plus and minus ``z``: the difference of a second decode under other
    noise, over sqrt(2)."""
    blob, shape, dtype, group_size, perm, slot, *rest = root.args
    redithered = emit(REDITHER, blob, shape, group_size, slot)
    again = emit(DEQUANTIZE, redithered, shape, dtype, group_size, perm, slot, *rest, **root.kwargs)
    for copy, original in ((redithered, blob), (again, root)):  # what a lowering reads: the width, the tensor
        if "gact" in original.meta:
            copy.meta["gact"] = dict(original.meta["gact"])
    # special values decode the same both times: inf - inf (or a NaN) must add nothing
    difference = emit(_aten.sub.Tensor, again, root)
    value = difference.meta["val"]
    zero = emit(_aten.full.default, [], 0.0, dtype=value.dtype, device=value.device)
    difference = emit(_aten.where.self, emit(_aten.eq.Tensor, difference, difference), difference, zero)
    z = emit(_aten.mul.Tensor, difference, 1 / math.sqrt(2))
    return emit(_aten.add.Tensor, root, z), emit(_aten.sub.Tensor, root, z)


def _shifted_backward(emit: _Emitter, node: fx.Node, forward, inputs: dict[str, fx.Node]) -> fx.Node:
    """The attention backward ``node`` at other query and key: its forward recomputed there first."""
    bound = bound_arguments(node) | inputs
    call = forward_call(forward, bound)
    recomputed = emit(forward, *call[0], **call[1])
    replaced = inputs | {"out": emit(operator.getitem, recomputed, 0),
                         "logsumexp": emit(operator.getitem, recomputed, 1)}
    names = [a.name for a in node.target._schema.arguments]
    args = [replaced.get(name, arg) for name, arg in zip(names, node.args)]
    kwargs = {name: replaced.get(name, arg) for name, arg in node.kwargs.items()}
    return emit(node.target, *args, **kwargs)


def debias_attention(bw: fx.GraphModule) -> frozenset[int]:
    """Rewrite ``bw`` in place; returns the slots of the query and key it debiased."""
    changed, slots = 0, set()
    for node, forward, bound in attention_backwards(bw):
        decoded = {name: _decoded_root(bound.get(name)) for name in _SHIFTED}
        decoded = {name: found for name, found in decoded.items() if found is not None}
        if not decoded or forward_call(forward, bound) is None:
            continue
        emit = _Emitter(bw.graph, detect_fake_mode(fake_inputs(node)))
        with bw.graph.inserting_before(node):
            # one shift per decoded tensor: query and key may be views of the same one
            shifted_roots = {root: _shifted_roots(emit, root) for root, _ in decoded.values()}
            backwards = [
                _shifted_backward(emit, node, forward, {name: _replay(emit, chain, root, shifted_roots[root][side])
                                                        for name, (root, chain) in decoded.items()})
                for side in (0, 1)]
        for gradient in [user for user in node.users if user.target is operator.getitem]:
            if not isinstance(gradient.meta.get("val"), torch.Tensor):
                continue
            with bw.graph.inserting_before(gradient.next):  # in order, after the gradient
                plus, minus = (emit(operator.getitem, shifted, gradient.args[1]) for shifted in backwards)
                average = emit(_aten.mul.Tensor, emit(_aten.add.Tensor, plus, minus), 0.5)
                doubled = emit(_aten.mul.Tensor, gradient, 2.0)
                combined = emit(_aten.sub.Tensor, doubled, average)
            gradient.replace_all_uses_with(combined, delete_user_cb=lambda user: user is not doubled)
        slots.update(root.args[5] for root, _ in decoded.values())
        changed += 1
    if changed:
        bw.graph.lint()
        bw.recompile()
        log.debug("debiased %d attention backward(s)", changed)
    return frozenset(slots)
