"""Find the values a partitioned forward graph saves for backward, and classify each.

AOTAutograd's contract (torch 2.13): the forward graph returns
``[real outputs (num_fwd_outputs) | saved tensors | saved SymInts]`` and the backward
graph's placeholders are ``[saved SymInts | saved tensors | tangents ...]``, position
for position and name for name. ``find_saved`` reads that contract, checks it, and
returns one ``SavedValue`` per saved entry with its class:

* intermediate: computed in this graph (possibly through views): the activations;
* graph input / view of input: a non-static input, which is how activations cross a
  graph break;
* parameter / view of parameter: a static input (parameter or buffer);
* parameter copy: computed from parameters and buffers only (Inductor's layout copies of
  convolution weights on the CPU, a transposed weight): weights, not activations;
* model output / view of output: shares storage with a real output. A caller that keeps
  only the loss drops it, so the backward's is the only reference: it is an activation;
* symint / opaque: not a tensor.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.fx as fx

from .views import AliasPath, alias_path


class SavedKind(str, enum.Enum):
    INTERMEDIATE = "intermediate"
    GRAPH_INPUT = "graph input"
    VIEW_OF_INPUT = "view of input"
    PARAMETER = "parameter"
    VIEW_OF_PARAMETER = "view of parameter"
    PARAMETER_COPY = "parameter copy"
    MODEL_OUTPUT = "model output"
    VIEW_OF_OUTPUT = "view of output"
    SYMINT = "symint"
    OPAQUE = "opaque"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class SavedValue:
    """One entry of the forward graph's saved section."""

    position: int  # index within the saved section (after the real outputs)
    node: fx.Node  # the forward node that is saved
    bw_placeholder: fx.Node  # the backward placeholder that receives it
    kind: SavedKind
    path: AliasPath | None  # storage root and view chain; None for non-tensors

    @property
    def val(self):
        return self.node.meta.get("val")


@dataclass(frozen=True)
class SavedGraph:
    """The saved section of a forward/backward pair."""

    values: tuple[SavedValue, ...]
    num_fwd_outputs: int

    @property
    def tensors(self) -> tuple[SavedValue, ...]:
        return tuple(v for v in self.values if v.kind not in (SavedKind.SYMINT, SavedKind.OPAQUE))

    @property
    def symints(self) -> tuple[SavedValue, ...]:
        return tuple(v for v in self.values if v.kind is SavedKind.SYMINT)


def _same_value(fw_node: fx.Node, bw_node: fx.Node) -> bool:
    """The pairing is positional; names usually agree, but RNG functionalization renames
    the saved RNG states (``rng_state_output_N``): then shape and dtype must agree."""
    if fw_node.name == bw_node.name:
        return True
    a, b = fw_node.meta.get("val"), bw_node.meta.get("val")
    return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape


def output_node(gm: fx.GraphModule) -> fx.Node:
    return gm.graph.find_nodes(op="output")[0]


def _is_sym(node) -> bool:
    return isinstance(node, fx.Node) and isinstance(node.meta.get("val"), (torch.SymInt, torch.SymFloat, torch.SymBool, int))


def static_placeholders(fw: fx.GraphModule, static_indices: Sequence[int]) -> set[fx.Node]:
    """The forward placeholders of static inputs (parameters, buffers).

    ``static_indices`` are positions among the primal inputs, which is how AOTAutograd's
    own partitioners read them; the forward's placeholders are those primals, in order.
    """
    placeholders = fw.graph.find_nodes(op="placeholder")
    return {placeholders[i] for i in static_indices if i < len(placeholders)}


def parameter_only(fw: fx.GraphModule, static: set[fx.Node]) -> set[fx.Node]:
    """The forward nodes computed from parameters and buffers only (at least one, no other input)."""
    found: dict[fx.Node, tuple[bool, bool]] = {}  # node -> (reads a static input, reads anything else)
    for node in fw.graph.nodes:
        if node.op == "placeholder":
            found[node] = (node in static, node not in static)
            continue
        inputs = [found[n] for n in node.all_input_nodes if n in found]
        found[node] = (any(s for s, _ in inputs), any(d for _, d in inputs))
    return {node for node, (reads_static, reads_other) in found.items()
            if reads_static and not reads_other and node.op != "placeholder"}


def _classify(node: fx.Node, static: set[fx.Node], outputs: set[fx.Node], output_roots: set[fx.Node],
              from_parameters: set[fx.Node]):
    val = node.meta.get("val")
    if _is_sym(node):
        return SavedKind.SYMINT, None
    if not isinstance(val, torch.Tensor):
        return SavedKind.OPAQUE, None
    path = alias_path(node)
    if path.root in output_roots:
        return (SavedKind.MODEL_OUTPUT if node in outputs else SavedKind.VIEW_OF_OUTPUT), path
    if path.root.op == "placeholder":
        if path.root in static:
            return (SavedKind.VIEW_OF_PARAMETER if path.is_view else SavedKind.PARAMETER), path
        return (SavedKind.VIEW_OF_INPUT if path.is_view else SavedKind.GRAPH_INPUT), path
    if path.root in from_parameters:
        return SavedKind.PARAMETER_COPY, path
    return SavedKind.INTERMEDIATE, path


def find_saved(
    fw: fx.GraphModule,
    bw: fx.GraphModule,
    num_fwd_outputs: int,
    static_input_indices: Sequence[int] = (),
) -> SavedGraph:
    """Pair each saved forward value with its backward placeholder and classify it."""
    fw_outputs = list(output_node(fw).args[0])
    saved_nodes = fw_outputs[num_fwd_outputs:]
    num_symints = sum(1 for n in saved_nodes if _is_sym(n))
    num_tensors = len(saved_nodes) - num_symints
    if any(_is_sym(n) for n in saved_nodes[:num_tensors]):
        raise RuntimeError("gact: forward graph saves a SymInt before a tensor; AOTAutograd contract changed")

    bw_placeholders = bw.graph.find_nodes(op="placeholder")
    bw_saved = bw_placeholders[num_symints : num_symints + num_tensors] + bw_placeholders[:num_symints]
    for fw_node, bw_node in zip(saved_nodes, bw_saved):
        if not isinstance(fw_node, fx.Node) or not _same_value(fw_node, bw_node):
            raise RuntimeError(
                f"gact: saved value {fw_node} does not match backward placeholder {bw_node.name}; "
                "the AOTAutograd forward/backward contract is not the one gact was written for"
            )

    real_outputs = [n for n in fw_outputs[:num_fwd_outputs] if isinstance(n, fx.Node)]
    output_roots = {
        alias_path(n).root for n in real_outputs if isinstance(n.meta.get("val"), torch.Tensor)
    }
    static = static_placeholders(fw, static_input_indices)
    from_parameters = parameter_only(fw, static)
    values = []
    for position, (fw_node, bw_node) in enumerate(zip(saved_nodes, bw_saved)):
        kind, path = _classify(fw_node, static, set(real_outputs), output_roots, from_parameters)
        values.append(SavedValue(position, fw_node, bw_node, kind, path))
    return SavedGraph(values=tuple(values), num_fwd_outputs=num_fwd_outputs)
