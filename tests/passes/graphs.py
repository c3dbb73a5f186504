"""Hand-made forward/backward graph pairs in AOTAutograd's shape, for the pass tests."""

from __future__ import annotations

import operator

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensorMode

from gact_fx.config import CoreConfig
from gact_fx.passes.plan import PlanOptions

aten = torch.ops.aten


def plan_options(bits: int = 8, *, label_prefix: str = "", channels_last: bool = False, **core) -> PlanOptions:
    """The planner's options for a test graph: groups of 64, nothing too small to compress."""
    core = {"group_size": 64, "min_numel": 0} | core
    return PlanOptions(CoreConfig(**core), bits=bits, label_prefix=label_prefix, channels_last=channels_last)


class Builder:
    """Appends nodes to an FX graph, giving each a fake ``meta["val"]``."""

    def __init__(self, mode: FakeTensorMode):
        self.graph = fx.Graph()
        self.mode = mode

    def input(self, name: str, value) -> fx.Node:
        node = self.graph.placeholder(name)
        node.meta["val"] = self.mode.from_tensor(value) if isinstance(value, torch.Tensor) else value
        return node

    def __call__(self, target, *args) -> fx.Node:
        # Name nodes as AOTAutograd does: after the op packet (``t``, ``mm``, ``t_1``...).
        name = getattr(getattr(target, "overloadpacket", None), "__name__", None) or target.__name__
        node = self.graph.call_function(target, args, name=name)
        with self.mode:
            node.meta["val"] = target(*fx.node.map_arg(args, lambda n: n.meta["val"]))
        return node

    def output(self, *values) -> fx.GraphModule:
        self.graph.output(tuple(values))
        return fx.GraphModule(torch.nn.Module(), self.graph)


def linear_relu_pair(batch: int = 32, features: int = 16, width: int = 64):
    """``out = 2 * relu(x @ w.t())``: saves x (input), t(w) (view of a parameter), relu.

    Returns ``(fw, bw, num_fwd_outputs, static_indices, real_inputs)``.
    """
    mode = FakeTensorMode()
    x, w = torch.randn(batch, features), torch.randn(width, features)
    f = Builder(mode)
    fx_, fw_ = f.input("x", x), f.input("w", w)
    t = f(aten.t.default, fw_)
    relu = f(aten.relu.default, f(aten.mm.default, fx_, t))
    out = f(aten.mul.Tensor, relu, 2.0)
    fw = f.output(out, fx_, t, relu)

    b = Builder(mode)
    bx, bt, brelu = b.input("x", x), b.input("t", torch.randn(features, width)), b.input("relu", torch.randn(batch, width))
    tangent = b.input("tangents_1", torch.randn(batch, width))
    grad = b(aten.mul.Tensor, tangent, 2.0)
    grad = b(aten.where.ScalarSelf, b(aten.le.Scalar, brelu, 0), 0.0, grad)
    grad_w = b(aten.mm.default, b(aten.t.default, grad), bx)
    grad_x = b(aten.mm.default, grad, b(aten.t.default, bt))
    bw = b.output(grad_x, grad_w)
    return fw, bw, 1, [1], (x, w)


def aliases_pair(batch: int = 32, width: int = 64):
    """Saves ``h`` and two views of it (``t(h)`` and a split half), plus ``t(out)``.

    ``out = h * 3`` is the real output, so ``t(out)`` is a view of an output.
    """
    mode = FakeTensorMode()
    x = torch.randn(batch, width)
    f = Builder(mode)
    fx_ = f.input("x", x)
    h = f(aten.sin.default, fx_)
    ht = f(aten.t.default, h)
    halves = f(aten.split.Tensor, h, width // 2, 1)
    first = f(operator.getitem, halves, 0)
    out = f(aten.mul.Tensor, h, 3.0)
    out_t = f(aten.t.default, out)
    fw = f.output(out, h, ht, first, out_t)

    b = Builder(mode)
    bh = b.input("sin", torch.randn(batch, width))
    bht = b.input("t", torch.randn(width, batch))
    bfirst = b.input("getitem", torch.randn(batch, width // 2))
    bout_t = b.input("t_1", torch.randn(width, batch))
    tangent = b.input("tangents_1", torch.randn(batch, width))
    a = b(aten.mul.Tensor, tangent, bh)
    c = b(aten.mul.Tensor, b(aten.t.default, bht), 2.0)
    d = b(aten.sum.dim_IntList, bfirst, [1], True)
    e = b(aten.t.default, bout_t)
    grad = b(aten.add.Tensor, b(aten.add.Tensor, a, c), b(aten.add.Tensor, d, e))
    bw = b.output(grad)
    return fw, bw, 1, [], (x,)


def run_pair(fw: fx.GraphModule, bw: fx.GraphModule, num_fwd_outputs: int, inputs, tangents):
    """Execute a pair as AOTAutograd would: saved SymInts first, then tensors, then tangents."""
    outputs = fw(*inputs)
    saved = list(outputs[num_fwd_outputs:])
    symints = [v for v in saved if not isinstance(v, torch.Tensor)]
    tensors = [v for v in saved if isinstance(v, torch.Tensor)]
    return outputs[:num_fwd_outputs], bw(*symints, *tensors, *tangents)
