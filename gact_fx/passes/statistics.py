"""Which saved tensors are row statistics: a reduction's result, and what is computed
from it elementwise.

A norm saves its rows' statistics beside the activation: LayerNorm's mean and
reciprocal standard deviation, RMSNorm's ``rsqrt(mean(x * x) + eps)``. The backward
reads them nonlinearly (the reciprocal standard deviation cubed), so their rounding
noise biases the gradient; and being one number a row, they hold a row's length fewer
elements than the activation. The plan keeps them exact
(``CoreConfig.exact_statistics``). They are found by producer, not by shape: a
one-feature activation has a statistic's shape and is not one.

A fused attention's logsumexp is one too: a reduction over each query's row of scores,
which the backward exponentiates (``P = exp(S - logsumexp)``), so that an error of e in it
scales the row by exp(-e). It is saved only where ``recompute_attention`` is off.

A statistic is the result of a reduction (``REDUCTIONS``; a norm's or ``var_mean``'s
statistics outputs, ``MULTI_OUTPUT_REDUCTIONS``) over at least ``MIN_REDUCED``
elements per result, or an elementwise function of statistics and scalars, or a view
of one (same element count), or a fused attention's logsumexp.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from .._compat import hint

aten = torch.ops.aten

# A result must summarise at least this many elements: a sum over two rows is not a statistic.
MIN_REDUCED = 16

REDUCTIONS = frozenset({
    aten.mean.dim, aten.mean.default, aten.sum.dim_IntList, aten.sum.default, aten.var.correction, aten.var.dim,
    aten.std.correction, aten.std.dim, aten.amax.default, aten.amin.default, aten.logsumexp.default,
    aten.linalg_vector_norm.default, aten.norm.ScalarOpt_dim,
})
# op -> the indices of its outputs that are statistics (the others are activations)
MULTI_OUTPUT_REDUCTIONS = {
    aten.var_mean.correction: (0, 1),
    aten.std_mean.correction: (0, 1),
    aten.native_layer_norm.default: (1, 2),
    aten.native_group_norm.default: (1, 2),
}
# The fused attention forwards, whose output 1 is the logsumexp (return names vary by release)
_ATTENTION_FORWARDS = frozenset(f"aten::_scaled_dot_product_{variant}" for variant in (
    "flash_attention", "flash_attention_for_cpu", "efficient_attention", "cudnn_attention",
    "fused_attention_overrideable"))
# Ops that keep every element: a statistic stays one through them.
_VIEWS = frozenset({
    aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.squeeze.dim, aten.squeeze.dims,
    aten.squeeze.default, aten.unsqueeze.default, aten.permute.default, aten.transpose.int, aten.t.default,
    aten.alias.default, aten._to_copy.default, torch.ops.prims.convert_element_type.default,
})


def _numel(node: fx.Node) -> int | None:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    return hint(val.numel()) if isinstance(val, torch.Tensor) else None


def _reduced_enough(result: fx.Node, source) -> bool:
    result_numel, source_numel = _numel(result), _numel(source)
    return bool(result_numel and source_numel and source_numel >= MIN_REDUCED * result_numel)


def row_statistics(graph: fx.Graph) -> dict[fx.Node, str]:
    """Every node of ``graph`` that is a row statistic, with the name of its reduction:
    one pass in topological order, so each node sees its inputs' answers."""
    found: dict[fx.Node, str] = {}
    for node in graph.nodes:
        reduction = _classify(node, found)
        if reduction is not None:
            found[node] = reduction
    return found


def _classify(node: fx.Node, found: dict[fx.Node, str]) -> str | None:
    if node.op != "call_function":
        return None
    target = node.target
    if target in REDUCTIONS:
        return str(target) if _reduced_enough(node, node.args[0]) else None
    if target is operator.getitem:
        producer, index = node.args
        if not isinstance(producer, fx.Node):
            return None
        if index in MULTI_OUTPUT_REDUCTIONS.get(producer.target, ()):
            return str(producer.target) if _reduced_enough(node, producer.args[0]) else None
        return str(producer.target) if _is_attention_logsumexp(producer, index) else None
    if target in _VIEWS or torch.Tag.pointwise in getattr(target, "tags", ()):
        return _elementwise_of_statistics(node, found)
    return None


def _is_attention_logsumexp(producer: fx.Node, index: int) -> bool:
    schema = getattr(producer.target, "_schema", None)
    return index == 1 and schema is not None and schema.name in _ATTENTION_FORWARDS


def _elementwise_of_statistics(node: fx.Node, found: dict[fx.Node, str]) -> str | None:
    numel = _numel(node)
    reduction = None
    for arg in node.all_input_nodes:
        arg_numel = _numel(arg)
        if arg_numel is None or arg_numel <= 1:
            continue  # a scalar or a one-element tensor
        if arg not in found or arg_numel != numel:
            return None
        reduction = reduction or found[arg]
    return reduction
