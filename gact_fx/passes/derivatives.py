"""Save the local derivative of an elementwise nonlinearity instead of its input.

A backward multiplies the incoming gradient by factors computed from saved values
alone: GELU's ``g * gelu'(x)``, SiLU's ``g * sigmoid(x) * (1 + x (1 - sigmoid(x)))``,
tanh's ``g * (1 - y*y)``. Recomputed from a rounded ``x``, such a factor is biased,
since ``E[f(x + noise)] != f(x)`` for a curved ``f``: at 2 bits, GELU's input alone
biased a character LM's gradient to twice the averaging floor. Computed in the forward
from the exact ``x`` and saved instead, the factor enters the backward linearly, and
stochastic rounding keeps it unbiased.

``hoist_derivatives`` finds those factors from the graph, with no list of ops:

* a *saved-only* node is one computed from saved values alone (no tangent);
* a *factor* is a saved-only node that a tangent-dependent node reads, and that
  ``passes.uses.dependences`` finds nonlinear in a value stored lossy;
* ``mul(mul(g, a), b)`` with ``a`` and ``b`` factors of one shape is regrouped as
  ``mul(g, mul(a, b))`` first, so that SiLU's two factors become one tensor.

Factors that share saved inputs move together, and only if that does not add bytes:
the factors' bytes must not exceed those of the saved values nothing else in the
backward needs any more. Where those values are stored at ``COARSE_BITS`` or fewer, a
group may add up to one tensor's worth, since there the bias is no longer small: a BERT
head (dense, GELU, LayerNorm) rebuilds both ``gelu'(x)`` and the LayerNorm's input
``gelu(x)`` from ``x``, so both move and ``x`` goes (two tensors for one; at 2 bits,
rounding ``x`` there biased a masked LM's gradient to 1.4x the averaging floor); tanh's
``1 - y*y`` moves although the next layer still needs ``y`` (one tensor more). Above
``COARSE_BITS`` a factor whose values are still needed linearly elsewhere frees nothing
and stays where it is.
"""

from __future__ import annotations

import logging
from collections.abc import Collection

import torch
import torch.fx as fx

from .hoist import hoist_nodes, lossy_placeholders, saved_cone
from .plan import nbytes_of
from .saved import SavedGraph, output_node
from .uses import Use, dependences

log = logging.getLogger(__name__)

aten = torch.ops.aten

# At this many bits or fewer a curved function of a rounded value is biased enough that
# saving its factors is worth a tensor more (the bias shrinks 4x with each bit).
COARSE_BITS = 3


def hoist_derivatives(
    fw: fx.GraphModule, bw: fx.GraphModule, saved: SavedGraph, quantized: Collection[int] | None = None,
    coarse: Collection[int] = (),
) -> int:
    """Rewrite in place; returns the number of factors moved to the forward
    (``quantized`` as for ``passes.hoist.hoist_comparisons``; ``coarse``: the positions
    stored at ``COARSE_BITS`` or fewer, whose factors may add a tensor)."""
    lossy = lossy_placeholders(saved, quantized)
    if not lossy:
        return 0
    inputs = {v.bw_placeholder for v in saved.values}
    _regroup_products(bw, inputs, lossy)
    factors = _factors(bw, inputs, lossy)
    coarse_inputs = lossy_placeholders(saved, coarse)
    chosen = _without_extra_bytes(bw, factors, inputs, lossy, coarse_inputs)
    return hoist_nodes(fw, bw, saved, quantized, chosen, "hoisted_derivative")


def _saved_only(bw: fx.GraphModule, inputs: set[fx.Node]) -> set[fx.Node]:
    found = set(inputs)
    for node in bw.graph.nodes:
        if node.op == "call_function" and not node.is_impure() and all(n in found for n in node.all_input_nodes):
            found.add(node)
    return found


def _nonlinear_in(node: fx.Node, deps, lossy: set[fx.Node]) -> bool:
    return any(root in lossy and use > Use.LINEAR for root, (use, _) in deps.get(node, {}).items())


def _is_float_tensor(node: fx.Node) -> bool:
    val = node.meta.get("val")
    return isinstance(val, torch.Tensor) and val.is_floating_point()


def _regroup_products(bw: fx.GraphModule, inputs: set[fx.Node], lossy: set[fx.Node]) -> None:
    """``mul(mul(g, a), b)`` -> ``mul(g, mul(a, b))`` where ``a`` and ``b`` are saved-only
    factors of the product's shape and one of them is nonlinear in a lossy value."""
    saved_only = _saved_only(bw, inputs)
    deps = dependences(bw, list(inputs))
    for node in list(bw.graph.nodes):
        while _is_mul(node):
            split = _regroupable(node, saved_only, deps, lossy)
            if split is None:
                break
            inner, rest, a, b = split
            with bw.graph.inserting_before(node):
                product = bw.graph.call_function(aten.mul.Tensor, (a, b))
            product.meta.update({k: v for k, v in node.meta.items() if k in ("val", "tensor_meta", "stack_trace")})
            node.args = (rest, product)
            bw.graph.erase_node(inner)
            saved_only.add(product)
            deps = dependences(bw, list(inputs))


def _is_mul(node: fx.Node) -> bool:
    return node.op == "call_function" and node.target is aten.mul.Tensor and len(node.args) == 2 and not node.kwargs


def _same_shape(a, b: fx.Node) -> bool:
    return isinstance(a, fx.Node) and _is_float_tensor(a) and a.meta["val"].shape == b.meta["val"].shape


def _regroupable(node: fx.Node, saved_only, deps, lossy):
    for inner, b in (node.args, node.args[::-1]):
        if not (isinstance(inner, fx.Node) and _is_mul(inner) and len(inner.users) == 1 and b in saved_only):
            continue
        if inner in saved_only or not _same_shape(b, node):
            continue
        for rest, a in (inner.args, inner.args[::-1]):
            if a in saved_only and rest not in saved_only and _same_shape(a, node):
                if _nonlinear_in(a, deps, lossy) or _nonlinear_in(b, deps, lossy):
                    return inner, rest, a, b
    return None


def _factors(bw: fx.GraphModule, inputs: set[fx.Node], lossy: set[fx.Node]) -> list[fx.Node]:
    saved_only = _saved_only(bw, inputs)
    deps = dependences(bw, list(inputs))
    return [
        node for node in bw.graph.nodes
        if node in saved_only and node not in inputs and _is_float_tensor(node)
        and any(user not in saved_only for user in node.users)
        and _nonlinear_in(node, deps, lossy)
        and saved_cone(node, inputs) is not None
    ]


def _without_extra_bytes(bw: fx.GraphModule, factors: list[fx.Node], inputs: set[fx.Node], lossy: set[fx.Node],
                         coarse: set[fx.Node]) -> list[fx.Node]:
    """The factors whose group (factors sharing saved inputs) frees at least its own bytes;
    where every lossy saved input it reads is ``coarse``, up to one tensor more (as many
    bytes again as it frees, or as its largest lossy input, whichever is more)."""
    needed, stack, cut = set(), [output_node(bw)], set(factors)
    while stack:
        node = stack.pop()
        if node not in needed:
            needed.add(node)
            if node not in cut:
                stack.extend(node.all_input_nodes)
    reads = {f: {n for c in saved_cone(f, inputs) for n in c.all_input_nodes if n in inputs} for f in factors}
    groups: list[tuple[list[fx.Node], set[fx.Node]]] = []
    for factor in factors:
        joined = [g for g in groups if g[1] & reads[factor]]
        members, roots = [factor], set(reads[factor])
        for group in joined:
            members += group[0]
            roots |= group[1]
            groups.remove(group)
        groups.append((members, roots))
    chosen = []
    for members, roots in groups:
        added = sum(nbytes_of(f.meta["val"]) for f in members)
        freed = sum(nbytes_of(r.meta["val"]) for r in roots if r not in needed and isinstance(r.meta.get("val"), torch.Tensor))
        allowance = freed
        if roots & lossy <= coarse:
            lossy_roots = [r.meta["val"] for r in roots & lossy if isinstance(r.meta.get("val"), torch.Tensor)]
            largest = max(map(nbytes_of, lossy_roots), default=0)
            allowance += max(freed, largest)
        if added <= allowance:
            chosen += members
        else:
            log.debug("kept %s in the backward: saving it would add %d bytes", [f.name for f in members], added - freed)
    return [f for f in factors if f in chosen]
