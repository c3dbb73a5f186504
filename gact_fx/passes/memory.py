"""Memory held for backward, node by node, through a forward/backward pair.

``saved_bytes_timeline`` walks the forward then the backward graph and gives, after
each node, the bytes of activations kept for the backward: a saved activation counts
from the node that produces its storage to the end of the forward, then in the backward
until its last use; a tensor the backward decodes counts from its dequantize to its last
use (through replayed views). Parameters and outputs are not counted (they are held
anyway), and aliases count once. Byte sizes are hints when shapes are dynamic.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx as fx

from .plan import COMPRESSIBLE_KINDS, nbytes_of, node_nbytes
from .saved import SavedGraph
from .views import alias_path


@dataclass(frozen=True)
class Timeline:
    forward: tuple[int, ...]  # bytes held after each forward node
    backward: tuple[int, ...]  # bytes held after each backward node

    @property
    def peak(self) -> int:
        return max(self.forward + self.backward, default=0)


def _last_use(node: fx.Node, order: dict[fx.Node, int]) -> int:
    """Index of the last node that reads ``node`` directly or through views of it."""
    last, stack = order[node], [node]
    while stack:
        current = stack.pop()
        for user in current.users:
            last = max(last, order[user])
            if alias_path(user).root is node:
                stack.append(user)
    return last


def saved_bytes_timeline(fw: fx.GraphModule, bw: fx.GraphModule, saved: SavedGraph) -> Timeline:
    fw_nodes, bw_nodes = list(fw.graph.nodes), list(bw.graph.nodes)
    fw_order = {node: i for i, node in enumerate(fw_nodes)}
    bw_order = {node: i for i, node in enumerate(bw_nodes)}
    starts = [0] * (len(fw_nodes) + 1)
    ends = [0] * (len(bw_nodes) + 1)
    roots: dict[fx.Node, int] = {}  # storage root -> index in the backward where it dies
    root_bytes: dict[fx.Node, int] = {}
    for value in saved.tensors:
        if value.kind not in COMPRESSIBLE_KINDS:
            continue
        root = value.path.root
        root_bytes[root] = node_nbytes(root)
        roots[root] = max(roots.get(root, -1), _last_use(value.bw_placeholder, bw_order))
    for root, dies in roots.items():
        starts[fw_order[root]] += root_bytes[root]
        ends[dies + 1] -= root_bytes[root]
    backward_start = sum(root_bytes.values())
    for node in bw_nodes:  # decoded activations live from their decode to their last use
        role = node.meta.get("gact", {}).get("role")
        if role == "dequantize" and isinstance(node.meta.get("val"), torch.Tensor):  # (not a launch's outputs)
            size = nbytes_of(node.meta["val"])
            ends[bw_order[node]] += size
            ends[_last_use(node, bw_order) + 1] -= size
    forward, held = [], 0
    for delta in starts[:-1]:
        held += delta
        forward.append(held)
    backward, held = [], backward_start
    for delta in ends[:-1]:
        held += delta
        backward.append(held)
    return Timeline(tuple(forward), tuple(backward))
