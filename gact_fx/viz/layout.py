"""Node positions for the graph viewer: layered (topological generations), via networkx.

Forward on top, backward below it; x is the node's topological generation, y its rank
within the generation in execution order. Cheap enough for graphs of thousands of nodes.
"""

from __future__ import annotations

import networkx as nx

from ..passes.snapshot import GraphView

COLUMN, ROW, GAP = 170, 26, 80


def _positions(view: GraphView, top: int) -> tuple[dict[str, tuple[int, int]], int]:
    graph = nx.DiGraph()
    order = {node.name: index for index, node in enumerate(view.nodes)}
    for node in view.nodes:
        graph.add_node(node.name)
        graph.add_edges_from((source, node.name) for source in node.inputs if source in order)
    positions, height = {}, 0
    for column, generation in enumerate(nx.topological_generations(graph)):
        for row, name in enumerate(sorted(generation, key=order.__getitem__)):
            positions[name] = (column * COLUMN, top + row * ROW)
        height = max(height, len(generation) * ROW)
    return positions, height


def layout(forward: GraphView, backward: GraphView) -> dict[str, dict[str, tuple[int, int]]]:
    """``{"forward": {name: (x, y)}, "backward": {...}}``."""
    forward_positions, height = _positions(forward, 0)
    backward_positions, _ = _positions(backward, height + GAP)
    return {"forward": forward_positions, "backward": backward_positions}
