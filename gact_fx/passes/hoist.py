"""Move backward computations on saved values into the forward, and save their results.

Some backward nodes turn a saved value into what the backward really consumes, through
a function that rounding noise cannot cross unbiased. Computed in the forward on the
exact values instead, their results are saved in place of the inputs:

* comparisons with a constant (``hoist_comparisons``): ReLU's backward is
  ``where(le(relu_out, 0), 0, grad)``, and when the min-cut partitioner recomputes a
  BatchNorm output in backward, the following ReLU's mask is ``le(recomputed, 0)``.
  Rebuilt from quantized values the mask flips near the threshold, which biases the
  gradient (5.9% error at 8 bits on an MLP, against ~1% for GELU). Saved instead: an
  exact bool mask, 1 bit per element.
* unbounded exponentials (``hoist_exponentials``; ``passes.uses`` says which): a
  cross-entropy's backward recomputes ``exp(logits - max - log_sum)`` from the saved
  logits; rounded logits bias that exponential. Saved instead: the probabilities, which
  the backward then uses linearly (``grad - p * sum(grad)``), so they can take as few
  bits as any linear use. Same size, no floor needed. (Fused attention kernels recompute
  their exponential inside one op: nothing to move there.)

Each hoisted node's inputs must be saved values only (no tangent), through at most
``MAX_CONE_NODES`` nodes. Saved values nothing else in backward uses are then no longer
saved.
"""

from __future__ import annotations

import logging
import numbers
from collections.abc import Collection

import torch
import torch.fx as fx

from ..runtime.reference import FLOAT_DTYPES
from .names import tensor_name
from .plan import COMPRESSIBLE_KINDS
from .saved import SavedGraph, output_node
from .section import SavedSection, finish
from .uses import unbounded_exponentials

log = logging.getLogger(__name__)

aten = torch.ops.aten
COMPARISONS = frozenset(
    {aten.le.Scalar, aten.lt.Scalar, aten.gt.Scalar, aten.ge.Scalar, aten.eq.Scalar, aten.ne.Scalar}
)
MAX_CONE_NODES = 64  # a longer recomputation is not worth repeating in the forward


def _is_comparison(node: fx.Node) -> bool:
    return node.target in COMPARISONS and isinstance(node.args[1], numbers.Number)


def saved_cone(target: fx.Node, saved_inputs: set[fx.Node]) -> list[fx.Node] | None:
    """The backward nodes ``target`` is computed from, if they use saved values only."""
    cone, stack = set(), [target]
    while stack:
        node = stack.pop()
        if node in cone or node in saved_inputs:
            continue
        if node.op != "call_function" or node.is_impure() or len(cone) >= MAX_CONE_NODES:
            return None  # a tangent, an RNG op, or too long a recomputation
        cone.add(node)
        stack.extend(node.all_input_nodes)
    return [node for node in target.graph.nodes if node in cone]


def hoist_comparisons(
    fw: fx.GraphModule, bw: fx.GraphModule, saved: SavedGraph, quantized: Collection[int] | None = None
) -> int:
    """Rewrite in place; returns the number of comparisons moved to the forward.

    ``quantized``: positions of the saved values that will be stored lossy. A comparison
    is hoisted only if it reads one of them (default: every float activation); reading
    exact values, it is right as it stands.
    """
    found = [n for n in bw.graph.nodes if _is_comparison(n)]
    return hoist_nodes(fw, bw, saved, quantized, found, "hoisted_mask")


def hoist_exponentials(
    fw: fx.GraphModule, bw: fx.GraphModule, saved: SavedGraph, quantized: Collection[int] | None = None
) -> int:
    """Rewrite in place; returns the number of exponentials moved to the forward
    (``quantized`` as for ``hoist_comparisons``)."""
    return hoist_nodes(fw, bw, saved, quantized, unbounded_exponentials(bw), "hoisted_exp")


def lossy_placeholders(saved: SavedGraph, quantized: Collection[int] | None) -> set[fx.Node]:
    """The backward placeholders of the saved values that will be stored below full precision."""
    return {
        v.bw_placeholder
        for v in saved.tensors
        if v.kind in COMPRESSIBLE_KINDS and v.val.dtype in FLOAT_DTYPES and (quantized is None or v.position in quantized)
    }


# The name of a hoisted value, after the saved value its cone reads (``passes.names``):
# ``fc1:linear'`` is the derivative of the function applied to ``fc1``'s output.
_HOISTED_NAMES = {"hoisted_derivative": "{}'", "hoisted_mask": "mask of {}", "hoisted_exp": "exp of {}"}


def hoist_nodes(fw, bw, saved: SavedGraph, quantized: Collection[int] | None, targets: list[fx.Node], role: str) -> int:
    """Move each target (with its cone, ``saved_cone``) into the forward and save its
    result instead, if the cone reads a lossy saved value; returns how many moved."""
    section = SavedSection(fw, bw, saved)
    fw_value = {v.bw_placeholder: v.node for v in saved.values}
    lossy = lossy_placeholders(saved, quantized)
    copies: dict[fx.Node, fx.Node] = dict(fw_value)  # backward node -> its forward counterpart
    hoisted = 0
    for target in targets:
        cone = saved_cone(target, set(fw_value))
        if cone is None or not any(arg in lossy for node in cone for arg in node.all_input_nodes):
            continue
        # Right after the last forward node the cone reads (a saved value, or a node an
        # earlier cone copied): the exact values it reads stay alive no longer than they did.
        # (FX nodes compare by their position in the graph.)
        reads = [copies[arg] for node in cone for arg in node.all_input_nodes if arg in copies]
        last_input = max(reads, default=None)
        anchor = last_input.next if last_input is not None else output_node(fw)
        while anchor.op == "placeholder":
            anchor = anchor.next
        with fw.graph.inserting_before(anchor):
            for node in cone:
                if node not in copies:
                    copies[node] = fw.graph.node_copy(node, copies.__getitem__)
                    copies[node].meta.pop("autograd_backward", None)
        result = copies[target]
        result.meta["gact"] = {"role": role, "of": target.name}
        read = next(copies[arg] for node in cone for arg in node.all_input_nodes if arg in lossy)
        result.meta["gact"]["name"] = _HOISTED_NAMES[role].format(tensor_name(read))
        target.replace_all_uses_with(section.add_tensor(result))
        bw.graph.erase_node(target)
        hoisted += 1
    if not hoisted:
        return 0
    bw.graph.eliminate_dead_code()
    for value in saved.tensors:
        if not value.bw_placeholder.users:
            section.drop_tensor(value.position)
    section.commit()
    finish(fw, bw, saved.num_fwd_outputs)
    log.debug("moved %d backward node(s) into the forward (%s)", hoisted, role)
    return hoisted
