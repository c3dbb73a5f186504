"""Rebuild in the backward the saved tensors that are affine in another saved tensor.

A pre-norm transformer saves LayerNorm's normalised input ``x_hat`` (for LayerNorm's
backward) and also its output ``x_hat * weight + bias`` (for the next linear layer's
weight gradient): two tensors of one size, rounded apart, each at the budget's bits.
The second is a few elementwise ops away from the first. ``recompute_affine`` stops
saving it and replays those ops in the backward on the stored first one: the bytes of
one tensor fewer, which adaptive bits then spend on the one that is left
(the carrier's ``meta["gact"]`` key ``CARRIES``, read by ``passes.plan``; the report lists
the rebuilt tensor with its carrier, ``REBUILT_FROM``).

Only ops that are affine in the carried tensor are replayed (views; add and sub of, and
mul and div by, values that do not come from it), so that the rebuilt tensor stays an
unbiased function of the rounded one: ``E[a * round(x) + b] = a * x + b``. Casts to
another float type (autocast's, before a matmul) are replayed too: they round the rebuilt
tensor to the type the forward rounded the stored one to. The other
operands must already reach the backward: saved tensors, parameters and buffers (saved
in addition, at no cost), constants. Tensors the plan keeps exact are left alone, so
32 bits stays bit-exact.

``recompute_projections`` goes one step further, through matmuls by a parameter: a
projection's output saved beside the input the projection's weight gradient already
keeps (attention's value beside the normalised input of the QKV projection). The chain
may then change size (the select, ``unbind`` or ``split`` of the value from a fused QKV
output), and replaying it costs the matmul again in the backward: with a fused
projection, only the value's columns of it where ``passes.narrow`` can follow the chain
to them. Only tensors the backward reads linearly (``passes.uses``) and the plan would
not store at more bits than their carrier are rebuilt this way: query and key, read
through an exponential, keep their own stored copies and floors.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

import torch
import torch.fx as fx

from .._compat import hint, provably_equal
from ..runtime.reference import FLOAT_DTYPES
from .hoist import lossy_placeholders
from .narrow import MATMULS, find_narrowing, picked_from
from .plan import CARRIES, REBUILT_FROM
from .saved import SavedGraph, SavedKind
from .section import SavedSection, copy_node, finish
from .uses import Use, classify_uses

log = logging.getLogger(__name__)

aten = torch.ops.aten

MAX_CHAIN = 16  # ops between the carrier and the rebuilt tensor

_VIEWS = frozenset({
    aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.permute.default, aten.transpose.int,
    aten.t.default, aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default,
    aten.clone.default, aten.alias.default, aten.slice.Tensor, aten.select.int, aten.expand.default,
})
_EITHER_SIDE = frozenset({aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor})  # affine in either argument
_FIRST_ONLY = frozenset({aten.div.Tensor, aten.add.Scalar, aten.sub.Scalar, aten.mul.Scalar, aten.div.Scalar,
                         aten.neg.default})  # affine in the first argument


@dataclass(frozen=True)
class _Rebuild:
    position: int  # saved position of the tensor rebuilt
    carrier: int  # saved position of the tensor it is rebuilt from
    chain: tuple[fx.Node, ...]  # forward nodes from the carrier (excluded) to the rebuilt tensor
    operands: frozenset[fx.Node]  # forward nodes the chain also reads

    @property
    def through_matmul(self) -> bool:
        return any(node.target in MATMULS for node in self.chain)


def _numel(node) -> int | torch.SymInt | None:
    """The element count, symbolic under dynamic shapes (never made concrete: that would
    add a guard and specialise a dynamic dimension)."""
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    return val.numel() if isinstance(val, torch.Tensor) else None


def _same_numel(node, numel) -> bool:
    """``node`` provably holds ``numel`` elements, decided without a guard."""
    other = _numel(node)
    return other is not None and provably_equal(other, numel)


class _Finder:
    def __init__(self, saved: SavedGraph, static: set[fx.Node]) -> None:
        self.saved_position = {v.node: v.position for v in saved.tensors}
        self.static = static

    def _operand_ok(self, node, depth: int = 0) -> bool:
        """``node`` reaches the backward without the carrier: a constant, a saved tensor,
        a parameter or buffer, a SymInt, or a view of one of those."""
        if not isinstance(node, fx.Node):
            return all(self._operand_ok(n, depth) for n in node) if isinstance(node, (list, tuple)) else True
        if node in self.saved_position or node in self.static or not isinstance(node.meta.get("val"), torch.Tensor):
            return True
        return (depth < MAX_CHAIN and _passes_through(node)
                and all(self._operand_ok(a, depth + 1) for a in node.args))

    def _static(self, node, depth: int = 0) -> bool:
        """``node`` is a parameter or buffer, or a view or cast of one."""
        if not isinstance(node, fx.Node):
            return False
        if node in self.static:
            return True
        return depth < MAX_CHAIN and _passes_through(node) and self._static(node.args[0], depth + 1)

    def _matmul_input(self, node: fx.Node) -> fx.Node | None:
        """The input of ``mm(a, b)`` or ``addmm(bias, a, b)`` that the other operands, all
        parameters, multiply."""
        if node.target is aten.addmm.default and not self._static(node.args[0]):
            return None
        a, b = node.args[-2:]
        if self._static(b) and not self._static(a):
            return a
        if self._static(a) and not self._static(b):
            return b
        return None

    def trace(self, node: fx.Node, numel, through_matmuls: bool = False) -> tuple[int, list[fx.Node], set[fx.Node]] | None:
        """``(carrier position, chain, operands)`` if ``node`` is affine in one saved tensor.
        ``through_matmuls``: also through views that change the size and matmuls by a
        parameter; every elementwise op still reads its carrier at its own size."""
        chain: list[fx.Node] = []
        operands: set[fx.Node] = set()
        while len(chain) < MAX_CHAIN:
            if chain and node in self.saved_position:
                return self.saved_position[node], chain[::-1], operands
            if node.op != "call_function" or node.kwargs and not _passes_through(node):
                return None
            if through_matmuls and picked_from(node) is not None:  # getitem(unbind(x)), getitem(split(x)): a view of x
                chain += [node, node.args[0]]
                node = node.args[0].args[0]
                continue
            size = _numel(node) if through_matmuls else numel
            if size is None or not _same_numel(node, size):
                return None
            tensors = [a for a in node.args if isinstance(a, fx.Node) and isinstance(a.meta.get("val"), torch.Tensor)]
            if through_matmuls and node.target in MATMULS:
                carrier = self._matmul_input(node)
            elif through_matmuls and _passes_through(node):
                carrier = node.args[0] if all(self._operand_ok(o) for o in node.args[1:]) else None
            else:
                if _passes_through(node) or node.target in _FIRST_ONLY:
                    sides = [node.args[0]]
                elif node.target in _EITHER_SIDE:
                    sides = [a for a in node.args[:2] if isinstance(a, fx.Node)]
                else:
                    return None
                carrier = next(
                    (a for a in sides if _same_numel(a, size)
                     and all(self._operand_ok(o) for o in node.args if o is not a)),
                    None,
                )
            if not isinstance(carrier, fx.Node) or sum(1 for t in tensors if t is carrier) != 1:
                return None
            chain.append(node)
            operands |= {t for t in tensors if t is not carrier}
            node = carrier
        return None


def _float_cast(node: fx.Node) -> bool:
    """``node`` converts a tensor to another floating-point type, and does nothing else."""
    if node.target is aten._to_copy.default:
        dtype = node.kwargs.get("dtype")
        return len(node.args) == 1 and set(node.kwargs) == {"dtype"} and dtype in FLOAT_DTYPES
    return node.target is torch.ops.prims.convert_element_type.default and node.args[1] in FLOAT_DTYPES


def _passes_through(node) -> bool:
    """``node`` reads one tensor as it is (a view) or rounded to another float type (a cast)."""
    return isinstance(node, fx.Node) and node.op == "call_function" and (node.target in _VIEWS or _float_cast(node))


def _view_roots(node: fx.Node) -> set[fx.Node]:
    """``node`` and, through views and casts, the nodes it reads."""
    roots, stack = set(), [node]
    while stack:
        n = stack.pop()
        if n not in roots:
            roots.add(n)
            if _passes_through(n):
                stack.extend(a for a in n.all_input_nodes)
    return roots


def find_rebuilds(saved: SavedGraph, quantized: Collection[int] | None, static: set[fx.Node], *,
                  through_matmuls: bool = False,
                  eligible: Callable[[int, int], bool] = lambda position, carrier: True) -> list[_Rebuild]:
    """The lossy saved tensors to rebuild, none of them the carrier or an operand of another.
    ``through_matmuls``: only the rebuilds through a matmul by a parameter, and of those
    only the ones ``eligible(position, carrier)`` allows."""
    finder = _Finder(saved, static)
    lossy = lossy_placeholders(saved, quantized)
    viewed = {v.path.root for v in saved.tensors if v.path is not None and v.path.is_view}  # storage still held
    found: list[_Rebuild] = []
    for value in saved.tensors:
        numel = _numel(value.node)
        if value.bw_placeholder not in lossy or value.kind is not SavedKind.INTERMEDIATE or numel is None:
            continue
        if value.node in viewed:
            continue
        traced = finder.trace(value.node, numel, through_matmuls)
        if traced is None:
            continue
        carrier, chain, operands = traced
        carrier_node = saved.values[carrier].node
        reads = set().union(*(_view_roots(o) for o in operands)) if operands else set()
        if carrier_node in reads or saved.values[carrier].val.dtype not in FLOAT_DTYPES:
            continue  # the carrier twice: no longer affine
        rebuild = _Rebuild(value.position, carrier, tuple(chain), frozenset(reads))
        if through_matmuls and not (rebuild.through_matmul and eligible(value.position, carrier)):
            continue
        found.append(rebuild)
    kept: list[_Rebuild] = []
    dropped: set[int] = set()
    needed: set[int] = set()
    for rebuild in found:
        reads = {finder.saved_position[n] for n in rebuild.operands if n in finder.saved_position}
        if rebuild.carrier in dropped or reads & dropped or rebuild.position in needed:
            continue
        kept.append(rebuild)
        dropped.add(rebuild.position)
        needed |= reads | {rebuild.carrier}
    return kept


def recompute_affine(
    fw: fx.GraphModule,
    bw: fx.GraphModule,
    saved: SavedGraph,
    quantized: Collection[int] | None = None,
    static: Collection[fx.Node] = (),
) -> int:
    """Rewrite in place; returns the number of saved tensors now rebuilt in the backward.
    ``quantized``: the positions the plan will store lossy; ``static``: the forward's
    parameter and buffer placeholders."""
    return _rebuild(fw, bw, saved, find_rebuilds(saved, quantized, set(static)))


def recompute_projections(
    fw: fx.GraphModule,
    bw: fx.GraphModule,
    saved: SavedGraph,
    bits: Mapping[int, int],
    quantized: Collection[int] | None = None,
    static: Collection[fx.Node] = (),
) -> int:
    """``recompute_affine`` through matmuls by a parameter, for the tensors the backward
    reads linearly and the plan (``bits``, by position) stores at no more bits than
    their carrier. Returns the number of saved tensors now rebuilt in the backward."""
    uses = classify_uses(bw, [v.bw_placeholder for v in saved.tensors])

    def eligible(position: int, carrier: int) -> bool:
        linear = uses[saved.values[position].bw_placeholder].use <= Use.LINEAR
        return linear and position in bits and carrier in bits and bits[position] <= bits[carrier]

    return _rebuild(fw, bw, saved, find_rebuilds(saved, quantized, set(static), through_matmuls=True,
                                                 eligible=eligible))


def _rebuild(fw: fx.GraphModule, bw: fx.GraphModule, saved: SavedGraph, rebuilds: list[_Rebuild]) -> int:
    if not rebuilds:
        return 0
    section = SavedSection(fw, bw, saved)
    in_backward = {v.node: v.bw_placeholder for v in saved.tensors}

    def backward_of(node):
        if isinstance(node, (list, tuple)):
            return type(node)(backward_of(n) for n in node)
        if not isinstance(node, fx.Node):
            return node
        if node not in in_backward:
            val = node.meta.get("val")
            if isinstance(val, torch.SymInt):
                return section.symint(node)
            if node.op != "placeholder":  # a view of what reaches the backward, copied where it is needed
                return copy_node(bw.graph, node, backward_of)
            in_backward[node] = section.add_tensor(node)  # a parameter or buffer: held by the model anyway
        return in_backward[node]

    for rebuild in rebuilds:
        entry = section.entry(rebuild.position)
        placeholder = entry.bw_placeholder
        first_user = next(n for n in bw.graph.nodes if n in placeholder.users)
        carrier = saved.values[rebuild.carrier]
        narrowing = find_narrowing(carrier.node, rebuild.chain) if rebuild.through_matmul else None
        replay = narrowing.replay if narrowing is not None else copy_node
        with bw.graph.inserting_before(first_user):
            node = carrier.bw_placeholder
            local = {carrier.node: node}

            def mapped(n):
                return local[n] if n in local else backward_of(n)

            for fw_node in rebuild.chain:
                if (node := replay(bw.graph, fw_node, mapped)) is None:
                    continue  # an unbind or split, whose pick the narrowing replays alone
                node.meta["gact"] = {"role": "rebuilt", "source": saved.values[rebuild.position].node.name}
                local[fw_node] = node
        placeholder.replace_all_uses_with(node)
        section.drop_tensor(rebuild.position)
        carried = carrier.node.meta.setdefault("gact", {})
        carried[CARRIES] = carried.get(CARRIES, 0) + hint(_numel(entry.fw_node))
        entry.fw_node.meta.setdefault("gact", {})[REBUILT_FROM] = carrier.node.name
        log.debug("gact: %s rebuilt in the backward from %s (%d ops%s)", entry.fw_node.name, carrier.node.name,
                  len(rebuild.chain), ", through a matmul" if rebuild.through_matmul else "")
    section.commit()
    finish(fw, bw, saved.num_fwd_outputs)
    return len(rebuilds)
