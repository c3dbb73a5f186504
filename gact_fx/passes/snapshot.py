"""Plain-data views of FX graphs, taken when gact rewrites them (for the report and viz).

Inductor rewrites the graphs it is given in place, so what gact did is recorded as
plain data right after its passes: per node its name, op, target, module path, shape,
dtype, size, inputs and gact role.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx as fx

from .._compat import hint
from .names import module_path
from .plan import node_nbytes


@dataclass(frozen=True)
class NodeView:
    name: str
    op: str  # placeholder, call_function, output
    target: str  # e.g. aten.mm.default, gact.quantize.default
    module: str  # module path that produced it ("" when unknown)
    shape: tuple[int, ...] | None
    dtype: str | None
    nbytes: int
    inputs: tuple[str, ...]
    # gact's meta["gact"]["role"]: quantize, dequantize, replay, blob, mask_bytes, hoisted_mask,
    # hoisted_exp, hoisted_derivative
    role: str | None


@dataclass(frozen=True)
class GraphView:
    nodes: tuple[NodeView, ...]


def _target(node: fx.Node) -> str:
    if node.op in ("placeholder", "output"):
        return node.op
    return str(getattr(node.target, "name", lambda: None)() or getattr(node.target, "__name__", node.target))


def graph_view(gm: fx.GraphModule) -> GraphView:
    nodes = []
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        is_tensor = isinstance(val, torch.Tensor)
        shape = tuple(hint(s) for s in val.shape) if is_tensor else None
        nbytes = node_nbytes(node) if is_tensor else 0
        nodes.append(
            NodeView(
                name=node.name,
                op=node.op,
                target=_target(node),
                module=module_path(node),
                shape=shape,
                dtype=str(val.dtype).removeprefix("torch.") if is_tensor else None,
                nbytes=nbytes,
                inputs=tuple(n.name for n in node.all_input_nodes),
                role=node.meta.get("gact", {}).get("role"),
            )
        )
    return GraphView(tuple(nodes))
