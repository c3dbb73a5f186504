"""Run a rebuilt projection for the columns its chain reads, not all of them.

``recompute_projections`` rebuilds attention's value in the backward by running the QKV
projection again on its stored input. With a fused projection the value is a third of
the output: the chain from the matmul views the output's columns as ``(3, heads,
head_dim)`` (or keeps them as one dimension), then picks the value with a select, an
``unbind``, a ``split`` or a slice. ``find_narrowing`` follows the output's columns
through those views to that pick and finds the columns it keeps; the backward
multiplies by those columns of the weight only: a third of the matmul. Picked along the
outermost column dimension they are one range (a slice of the weight and the bias, no
copy). Picked along an inner one (GPT-NeoX's ``(heads, 3 * head_dim)``, each head's
query, key and value side by side) they are a range within each step of the dimensions
outside it, gathered from the weight and the bias into a copy in that order. The views
before the pick get the narrowed sizes, and the pick becomes a select of index 0 or
nothing.

Only chains this analysis can follow are narrowed (views that keep the rows ahead of
the columns, permutes, then one pick along a column dimension that every view before
it either keeps whole or splits outside of); any other chain is replayed whole, as
before.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.fx as fx

from .section import copy_node, set_val

aten = torch.ops.aten

MATMULS = frozenset({aten.mm.default, aten.addmm.default})
_RESHAPES = frozenset({aten.view.default, aten._unsafe_view.default, aten.reshape.default})
_PERMUTES = frozenset({aten.permute.default, aten.transpose.int, aten.t.default})
_SAME = frozenset({aten.clone.default, aten.alias.default})
PICKED_FROM = frozenset({aten.unbind.int, aten.split.Tensor, aten.split_with_sizes.default})


@dataclass(frozen=True)
class _Columns:
    """A dimension made of the matmul output's columns: ``size`` of them, ``stride`` apart."""
    size: int
    stride: int


_ROW = None  # a dimension made of the matmul's rows


@dataclass(frozen=True)
class Narrowing:
    """How to replay ``chain`` for the output columns of ``matmul`` that its pick keeps:
    indices ``lo:hi`` of the column dimension ``picked``, in every step of the dimensions
    outside it."""
    matmul: fx.Node
    width: int  # the matmul's output columns
    picked: _Columns
    lo: int
    hi: int
    shapes: dict[fx.Node, list]  # the reshapes before the pick, and their narrowed shapes
    pick: fx.Node  # the node that picked the columns
    source: fx.Node  # the tensor it picked them from (past the unbind or split, not replayed)
    dim: int  # the dimension it picked along
    drops_dim: bool  # a select or unbind drops it; a split or slice keeps it

    @property
    def spans(self) -> tuple[tuple[int, int], ...]:
        """The output columns kept, as ``(start, stop)`` ranges in order."""
        step = self.picked.size * self.picked.stride
        return tuple((outer + self.lo * self.picked.stride, outer + self.hi * self.picked.stride)
                     for outer in range(0, self.width, step))

    def replay(self, graph: fx.Graph, fw_node: fx.Node, backward_of: Callable) -> fx.Node | None:
        """The backward node for ``fw_node``: narrowed where the chain changes, else a copy
        (``None`` for a node not replayed)."""
        if fw_node is picked_from(self.pick):
            return None
        if fw_node is self.matmul:
            *bias, a, b = (backward_of(arg) for arg in fw_node.args)
            columns = self._kept(graph, b, dim=1)
            return _call(graph, fw_node.target, (*(self._kept(graph, x, dim=0) for x in bias), a, columns))
        if fw_node in self.shapes:
            shape = [backward_of(size) if isinstance(size, fx.Node) else size for size in self.shapes[fw_node]]
            return _call(graph, fw_node.target, (backward_of(fw_node.args[0]), shape))
        if fw_node is self.pick:  # the narrowed source holds the picked columns only
            source = backward_of(self.source)
            return _call(graph, aten.select.int, (source, self.dim, 0)) if self.drops_dim else source
        return copy_node(graph, fw_node, backward_of)

    def _kept(self, graph: fx.Graph, tensor: fx.Node, dim: int) -> fx.Node:
        """The kept columns of ``tensor``, whose dimension ``dim`` holds the output's columns."""
        spans = self.spans
        if len(spans) == 1:
            return _call(graph, aten.slice.Tensor, (tensor, dim, *spans[0]))
        size, stride = self.picked.size, self.picked.stride
        shape = list(tensor.meta["val"].shape)
        split = shape[:dim] + [self.width // (size * stride), size, stride] + shape[dim + 1:]
        kept = _call(graph, aten.slice.Tensor, (_call(graph, aten.view.default, (tensor, split)), dim + 1, self.lo,
                                                self.hi))
        gathered = _call(graph, aten.clone.default, (kept,))  # contiguous, in the kept columns' order
        kept_width = len(spans) * (self.hi - self.lo) * stride
        return _call(graph, aten.view.default, (gathered, shape[:dim] + [kept_width] + shape[dim + 1:]))


def picked_from(node: fx.Node) -> fx.Node | None:
    """The ``unbind`` or ``split`` node that ``node``, a ``getitem`` of it, picks from."""
    source = node.args[0] if node.target is operator.getitem and node.args else None
    if isinstance(source, fx.Node) and source.op == "call_function" and source.target in PICKED_FROM:
        return source
    return None


def _call(graph: fx.Graph, target, args: tuple) -> fx.Node:
    node = graph.call_function(target, args)
    set_val(node, target(*fx.node.map_arg(args, lambda arg: arg.meta["val"])))
    return node


def _dim(node: fx.Node) -> int:
    """The dimension argument of an unbind or split node."""
    if node.target is aten.unbind.int:
        return node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
    return node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", 0)


def _picked_range(node: fx.Node, size: int) -> tuple[int, int] | None:
    """``(lo, hi)``: the indices along its dimension that the pick ``node`` keeps."""
    if node.target is aten.select.int:
        index = node.args[2] % size
        return index, index + 1
    if node.target is aten.slice.Tensor:
        given = node.args[2:]
        start, end, step = (*given, *(None, None, 1)[len(given):])
        if step != 1 or not all(isinstance(v, (int, type(None))) for v in (start, end)):
            return None
        start, end, _ = slice(start, end).indices(size)
        return (start, end) if start < end else None
    source, index = node.args[0], node.args[1]
    if source.target is aten.unbind.int:
        return index, index + 1
    if source.target is aten.split.Tensor:
        chunk = source.args[1]
        return (index * chunk, min(size, (index + 1) * chunk)) if isinstance(chunk, int) else None
    sizes = source.args[1]
    if not all(isinstance(s, int) for s in sizes):
        return None
    return sum(sizes[:index]), sum(sizes[:index + 1])


def _pick_dim(node: fx.Node, ndim: int) -> int | None:
    if node.target in (aten.select.int, aten.slice.Tensor):
        dim = node.args[1] if len(node.args) > 1 else 0
    elif (source := picked_from(node)) is not None:
        dim = _dim(source)
    else:
        return None
    return dim % ndim if isinstance(dim, int) else None


def find_narrowing(carrier: fx.Node, chain: Sequence[fx.Node]) -> Narrowing | None:
    """A ``Narrowing`` of ``chain`` (forward nodes from ``carrier`` to a rebuilt tensor
    through one matmul by a parameter), or ``None`` where the chain reads every output
    column or takes a path this analysis does not follow."""
    matmuls = [i for i, node in enumerate(chain) if node.target in MATMULS]
    if len(matmuls) != 1:
        return None
    matmul = chain[matmuls[0]]
    if matmul.args[-2] is not (chain[matmuls[0] - 1] if matmuls[0] else carrier):
        return None  # the parameter is the left operand: its rows, not its columns, are the output's
    out = matmul.meta["val"]
    width = out.shape[-1]
    if out.dim() != 2 or not isinstance(width, int):
        return None
    dims: list[_Columns | None] = [_ROW, _Columns(width, 1)]
    reshapes: list[tuple[fx.Node, int]] = []  # (node, index of its first column dimension)
    permuted = False
    rest = list(chain[matmuls[0] + 1:])
    while rest:
        node = rest.pop(0)
        if node.target in _SAME:
            continue
        if node.target in _RESHAPES:
            shape = tuple(node.meta["val"].shape)  # the sizes an argument of -1 stands for
            first = _column_split(shape, width)
            if permuted or first is None:
                return None
            dims = [_ROW] * first + [_Columns(s, math.prod(shape[i + 1:])) for i, s in enumerate(shape) if i >= first]
            reshapes.append((node, first))
            continue
        if node.target in _PERMUTES:
            dims = _permuted(node, dims)
            permuted = True
            continue
        if node.target in PICKED_FROM and rest and picked_from(rest[0]) is node:
            node = rest.pop(0)
        elif node.target not in (aten.select.int, aten.slice.Tensor):
            return None
        return _narrowing(matmul, width, dims, reshapes, node)
    return None


def _column_split(shape, width: int) -> int | None:
    """The index of ``shape``'s first column dimension: its trailing sizes, all ints,
    multiply to ``width``."""
    product, first = 1, len(shape)
    while product < width and first > 0:
        first -= 1
        if not isinstance(shape[first], int) or shape[first] <= 0:
            return None
        product *= shape[first]
    return first if product == width else None


def _permuted(node: fx.Node, dims: list) -> list:
    if node.target is aten.t.default:
        return dims[::-1]
    if node.target is aten.transpose.int:
        a, b = (d % len(dims) for d in node.args[1:3])
        dims = list(dims)
        dims[a], dims[b] = dims[b], dims[a]
        return dims
    return [dims[d % len(dims)] for d in node.args[1]]


def _narrowing(matmul, width, dims, reshapes, pick) -> Narrowing | None:
    dim = _pick_dim(pick, len(dims))
    if dim is None or dims[dim] is _ROW:
        return None
    picked = dims[dim]
    kept = _picked_range(pick, picked.size)
    if kept is None or kept[1] - kept[0] == picked.size:
        return None
    shapes = {}
    for node, first in reshapes:
        shape = list(node.args[1])
        sizes = node.meta["val"].shape
        for i in range(first, len(sizes)):
            narrowed = _narrowed_size(_Columns(sizes[i], math.prod(sizes[i + 1:])), picked, kept[1] - kept[0])
            if narrowed is None:
                return None
            shape[i] = narrowed
        shapes[node] = shape
    unbound = picked_from(pick)
    source = pick.args[0] if unbound is None else unbound.args[0]
    drops_dim = pick.target is aten.select.int or (unbound is not None and unbound.target is aten.unbind.int)
    return Narrowing(matmul, width, picked, kept[0], kept[1], shapes, pick, source, dim, drops_dim)


def _narrowed_size(columns: _Columns, picked: _Columns, kept: int) -> int | None:
    """The size of a view's column dimension once the picked dimension keeps ``kept`` of
    its indices: the same if it lies wholly outside or inside one step of the picked
    dimension, smaller if it spans it, ``None`` if it splits it."""
    low, high = columns.stride, columns.stride * columns.size
    if low >= picked.stride * picked.size or high <= picked.stride:
        return columns.size
    if low <= picked.stride and high >= picked.stride * picked.size:
        return columns.size * kept // picked.size
    return None
