"""How the backward consumes each saved value: linearly, smoothly, or through an exponential.

Stochastic rounding keeps a saved tensor unbiased, so a gradient that is *linear* in it
stays unbiased. A smooth nonlinearity (a product of the tensor with itself, LayerNorm's
statistics, GELU, SiLU, tanh) adds a bias of the order of the rounding variance: small,
but it does not average out (GELU's input at 2 bits: 2.7x the averaging floor), so
``passes.derivatives`` saves such factors instead where that costs no bytes. An
exponential or a singularity is worse: attention's backward recomputes
``P = exp(q k^T / sqrt(d) - lse)`` from the saved query, key and logsumexp, and
``E[exp(x + noise)] = exp(x) E[exp(noise)]`` grows without bound as training sharpens
the logits (gradients 1e6x off at 2 bits on a character LM). This pass finds such uses
from the backward graph itself, so that the plan can keep those tensors at higher
precision (``CoreConfig.nonlinear_bits``).

``dependences`` walks the backward graph once, propagating for every node which saved
values it depends on and how (``Use``); ``classify_uses`` keeps each value's worst.
The rules:

* attention backward ops (every SDPA variant, found by their schema's argument names):
  ``query``, ``key``, ``logsumexp`` and an additive ``attn_bias``/``attn_mask`` are
  exponential; ``value`` and ``out`` enter linearly; an attention forward recomputed in
  the backward (``passes.attention``) likewise, its logsumexp independent of ``value``;
* ``exp`` is exponential unless its argument is non-positive by construction (GELU's
  ``exp(-x*x/2)``) or it only feeds ``1 + exp(.)`` in a denominator (a sigmoid);
* ``log``, ``reciprocal``, ``rsqrt``, ``sqrt``, a tensor divisor and a negative or
  fractional power are exponential (singular) unless their argument is bounded away
  from zero by construction (``mean(x*x) + eps``, ``1 + exp(.)``);
* bounded functions (``erf``, ``tanh``, ``sigmoid``, ``sin``, ...), integer powers and
  products of a value with itself are smooth;
* comparisons do not carry a dependence (the mask pass keeps them exact);
* every other op passes its inputs' uses through, and an op it has no rule for is
  smooth, with that reason.
"""

from __future__ import annotations

import enum
import numbers
import operator
from dataclasses import dataclass

import torch
import torch.fx as fx

aten = torch.ops.aten


class Use(enum.IntEnum):
    """How a gradient depends on a saved value, from harmless to dangerous under rounding."""

    NONE = 0
    LINEAR = 1
    SMOOTH = 2
    EXPONENTIAL = 3

    def __str__(self) -> str:
        return self.name.lower()


@dataclass(frozen=True)
class UseClass:
    use: Use
    reason: str  # the op that made it so ("" for linear)


_ATTENTION_NONLINEAR = frozenset({"query", "key", "logsumexp", "attn_bias", "bias", "attn_mask"})
_ATTENTION_LINEAR = frozenset({"value", "out", "grad_out", "grad_out_"})
_EXPONENTIALS = frozenset({aten.exp.default, aten.exp2.default, aten.expm1.default})
_SINGULAR = frozenset({aten.log.default, aten.log1p.default, aten.log2.default, aten.reciprocal.default,
                       aten.rsqrt.default, aten.sqrt.default})
_BOUNDED = frozenset({aten.erf.default, aten.tanh.default, aten.sigmoid.default, aten.sin.default, aten.cos.default,
                      aten.atan.default, aten.erfc.default, aten.sign.default, aten.abs.default})
_COMPARISONS = frozenset({aten.le.Scalar, aten.lt.Scalar, aten.gt.Scalar, aten.ge.Scalar, aten.eq.Scalar,
                          aten.ne.Scalar, aten.le.Tensor, aten.lt.Tensor, aten.gt.Tensor, aten.ge.Tensor,
                          aten.eq.Tensor, aten.ne.Tensor, aten.isnan.default, aten.isinf.default})
_PRODUCTS = frozenset({aten.mul.Tensor, aten.mm.default, aten.bmm.default, aten.matmul.default,
                       aten.baddbmm.default, aten.addmm.default, aten.dot.default})
# Ops through which a dependence passes unchanged in kind (affine in each input).
_AFFINE_NAMES = frozenset({
    "view", "_unsafe_view", "reshape", "permute", "transpose", "t", "expand", "unsqueeze", "squeeze", "clone",
    "contiguous", "alias", "detach", "slice", "select", "select_scatter", "slice_scatter", "index_select", "gather",
    "scatter_add", "index_put", "_unsafe_index_put", "_unsafe_masked_index_put_accumulate", "index_add", "cat",
    "stack", "split", "split_with_sizes", "chunk", "unbind", "add", "sub", "neg", "sum", "mean", "cumsum", "flip",
    "roll", "repeat", "constant_pad_nd", "pad", "convert_element_type", "_to_copy", "copy", "full_like", "zeros_like",
    "ones_like", "empty_like", "where", "masked_fill", "mul", "div", "mm", "bmm", "addmm", "baddbmm", "matmul",
    "convolution_backward", "convolution", "embedding_dense_backward", "max_pool2d_with_indices_backward",
    "avg_pool2d_backward", "native_dropout_backward", "threshold_backward", "fill", "new_zeros", "new_empty",
    "as_strided", "as_strided_scatter", "diagonal", "tril", "triu", "amax", "amin", "max", "min", "clamp",
    "clamp_min", "clamp_max", "unfold", "col2im", "im2col", "upsample_nearest2d_backward",
    "upsample_bilinear2d_backward", "getitem", "sym_size", "lift_fresh_copy", "scalar_tensor",
})


def _op_name(target) -> str:
    if target is operator.getitem:
        return "getitem"
    name = getattr(target, "__name__", str(target))
    return name.split(".")[0]


def _is_attention(node: fx.Node, backward: bool) -> bool:
    schema = getattr(node.target, "_schema", None)
    if schema is None or "attention" not in schema.name or ("backward" in schema.name) != backward:
        return False
    names = {argument.name for argument in schema.arguments}
    return {"query", "key"} <= names


def _is_attention_backward(node: fx.Node) -> bool:
    return _is_attention(node, backward=True)


def _bound_arguments(node: fx.Node) -> dict[str, object]:
    schema = node.target._schema
    bound = dict(zip((a.name for a in schema.arguments), node.args))
    bound.update(node.kwargs)
    return bound


def _constant(value) -> float | None:
    return float(value) if isinstance(value, numbers.Real) and not isinstance(value, bool) else None


class _Signs:
    """What is known of a backward value's sign, by construction (no data involved)."""

    def __init__(self) -> None:
        self.nonneg: set[fx.Node] = set()
        self.nonpos: set[fx.Node] = set()
        self.away_from_zero: set[fx.Node] = set()  # >= some c > 0

    def note(self, node: fx.Node) -> None:
        target, args = node.target, node.args
        if target in (aten.mul.Tensor, aten.mul.Scalar) and len(args) == 2:
            a, b = args
            if a is b and isinstance(a, fx.Node):
                self.nonneg.add(node)
                return
            for tensor, other in ((a, b), (b, a)):
                scale = _constant(other)
                if isinstance(tensor, fx.Node) and scale is not None:
                    if (tensor in self.nonneg and scale >= 0) or (tensor in self.nonpos and scale <= 0):
                        self.nonneg.add(node)
                    elif (tensor in self.nonneg and scale <= 0) or (tensor in self.nonpos and scale >= 0):
                        self.nonpos.add(node)
        elif target is aten.neg.default and args[0] in self.nonneg:
            self.nonpos.add(node)
        elif target is aten.neg.default and args[0] in self.nonpos:
            self.nonneg.add(node)
        elif target in (aten.exp.default, aten.abs.default, aten.sigmoid.default):
            self.nonneg.add(node)
        elif target is aten.pow.Tensor_Scalar and _constant(args[1]) is not None and float(args[1]) % 2 == 0:
            self.nonneg.add(node)
        elif target in (aten.sum.dim_IntList, aten.sum.default, aten.mean.dim, aten.mean.default) and args[0] in self.nonneg:
            self.nonneg.add(node)
        elif target in (aten.div.Scalar, aten.div.Tensor) and args[0] in self.nonneg and (_constant(args[1]) or -1) > 0:
            self.nonneg.add(node)
        elif target in (aten.add.Tensor, aten.add.Scalar) and len(args) == 2:
            a, b = args
            signs = [x in self.nonneg or (_constant(x) or -1) >= 0 for x in (a, b)]
            if all(signs):
                self.nonneg.add(node)
                if any((_constant(x) or 0) > 0 or x in self.away_from_zero for x in (a, b)):
                    self.away_from_zero.add(node)


def _divisor_of_sigmoid(exp_node: fx.Node, signs: _Signs) -> bool:
    """``exp(.)`` used only as ``exp(.) + c`` (c > 0), itself used only as a divisor: a sigmoid."""
    for user in exp_node.users:
        if user not in signs.away_from_zero or not user.users:
            return False
        for consumer in user.users:
            divides = consumer.target in (aten.div.Tensor,) and consumer.args[1] is user and consumer.args[0] is not user
            if not (divides or consumer.target is aten.reciprocal.default):
                return False
    return True


def _signs_of(bw: fx.GraphModule) -> _Signs:
    signs = _Signs()
    for node in bw.graph.nodes:  # the sigmoid pattern looks at an exp's users: all signs first
        if node.op == "call_function":
            signs.note(node)
    return signs


def unbounded_exponentials(bw: fx.GraphModule) -> list[fx.Node]:
    """The ``exp`` nodes of a backward graph whose argument is not bounded above by
    construction (``passes.hoist`` moves those that read saved values only)."""
    signs = _signs_of(bw)
    return [
        node for node in bw.graph.nodes
        if node.op == "call_function" and node.target in _EXPONENTIALS
        and not (node.args[0] in signs.nonpos or _divisor_of_sigmoid(node, signs))
    ]


Deps = dict[fx.Node, tuple[Use, str]]  # saved placeholder -> (how this value depends on it, why)


def _merge(into: Deps, other: Deps, cap: tuple[Use, str] | None = None) -> None:
    for root, (use, reason) in other.items():
        if cap is not None and cap[0] > use:
            use, reason = cap
        if root not in into or use > into[root][0]:
            into[root] = (use, reason)


def classify_uses(bw: fx.GraphModule, saved: list[fx.Node]) -> dict[fx.Node, UseClass]:
    """For each saved placeholder of ``bw``: how the gradients depend on it."""
    worst: dict[fx.Node, tuple[Use, str]] = {node: (Use.NONE, "") for node in saved}
    for node, result in dependences(bw, saved).items():
        if node.op != "call_function":
            continue
        for root, found in result.items():
            if found[0] > worst[root][0]:
                worst[root] = found
    return {node: UseClass(*worst[node]) for node in saved}


def dependences(bw: fx.GraphModule, saved: list[fx.Node]) -> dict[fx.Node, Deps]:
    """For each node of ``bw`` that depends on a saved placeholder: on which, and how
    (the placeholders themselves included, each linear in itself)."""
    deps: dict[fx.Node, Deps] = {node: {node: (Use.LINEAR, "")} for node in saved}
    without_value: dict[fx.Node, Deps] = {}  # attention forward -> its deps but value's
    signs = _signs_of(bw)
    for node in bw.graph.nodes:
        if node.op != "call_function":
            continue
        inputs = [n for n in node.all_input_nodes if deps.get(n)]
        if not inputs:
            continue
        result: Deps = {}
        name = _op_name(node.target)
        if node.target in _COMPARISONS:
            continue  # a bool mask: exact once the mask pass has run
        if _is_attention_backward(node) or _is_attention(node, backward=False):
            for argument, value in _bound_arguments(node).items():
                if isinstance(value, fx.Node) and deps.get(value):
                    exponential = argument in _ATTENTION_NONLINEAR
                    cap = (Use.EXPONENTIAL, f"{name} ({argument})") if exponential else None
                    _merge(result, deps[value], cap)
                    if exponential:
                        _merge(without_value.setdefault(node, {}), deps[value], cap)
        elif node.target is operator.getitem and node.args[0] in without_value and node.args[1] != 0:
            # an attention forward recomputed in the backward (``passes.attention``):
            # its logsumexp does not depend on ``value``
            _merge(result, without_value[node.args[0]])
        elif node.target in _EXPONENTIALS:
            (argument,) = node.args[:1]
            benign = argument in signs.nonpos or _divisor_of_sigmoid(node, signs)
            _merge(result, deps[argument], (Use.SMOOTH, f"{name} (bounded)") if benign else (Use.EXPONENTIAL, name))
        elif node.target in _SINGULAR or (node.target is aten.div.Tensor and node.args[1] in deps and deps[node.args[1]]):
            divisor = node.args[1] if node.target is aten.div.Tensor else node.args[0]
            benign = divisor in signs.away_from_zero
            _merge(result, deps[divisor], (Use.SMOOTH, f"{name} (away from 0)") if benign else (Use.EXPONENTIAL, name))
            if node.target is aten.div.Tensor and deps.get(node.args[0]):
                _merge(result, deps[node.args[0]], (Use.SMOOTH, "div") if node.args[0] is node.args[1] else None)
        elif node.target is aten.pow.Tensor_Scalar:
            exponent = _constant(node.args[1])
            if exponent is not None and exponent == int(exponent) and exponent >= 0:
                cap = None if exponent <= 1 else (Use.SMOOTH, f"pow {exponent:g}")
                _merge(result, deps[node.args[0]], cap)
            else:
                benign = node.args[0] in signs.away_from_zero
                _merge(result, deps[node.args[0]], (Use.SMOOTH if benign else Use.EXPONENTIAL, f"pow {node.args[1]}"))
        elif node.target in _BOUNDED or name in ("gelu_backward", "silu_backward", "sigmoid_backward", "tanh_backward"):
            for value in inputs:
                _merge(result, deps[value], (Use.SMOOTH, name))
        elif node.target in _PRODUCTS or name in ("mul", "mm", "bmm", "matmul", "addmm", "baddbmm"):
            for value in inputs:
                _merge(result, deps[value])
            # the operands as passed, not ``all_input_nodes``, which lists ``mul(y, y)``'s y once
            operands = [a for a in node.args if isinstance(a, fx.Node) and deps.get(a)] or inputs
            shared = set.intersection(*(set(deps[v]) for v in operands)) if len(operands) > 1 else set()
            for root in shared:  # the value times itself: quadratic
                if result[root][0] < Use.SMOOTH:
                    result[root] = (Use.SMOOTH, name)
        elif name in _AFFINE_NAMES:
            for value in inputs:
                _merge(result, deps[value])
        else:
            for value in inputs:
                _merge(result, deps[value], (Use.SMOOTH, f"{name} (no rule: treated as smooth)"))
        deps[node] = result
    return deps
