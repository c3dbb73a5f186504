"""Human names for saved tensors: the module and the function that produced them.

``fc1:linear``, ``encoder.layer.0.attention.self.query:linear``, ``gelu``: taken from the
``nn_module_stack`` and ``source_fn_stack`` metadata Dynamo leaves on nodes, so that bits,
sensitivities and per-tensor overrides can be read and written by name; a view stored
on its own after the tensor it views (``qkv:linear[0]``).
"""

from __future__ import annotations

import re

import torch
import torch.fx as fx

from .._compat import DYNAMO_SELF, module_stack, source_function
from .views import alias_path

aten = torch.ops.aten

_INDEX = re.compile(r"\[(\d+)\]")
_KEY = re.compile(r"\['([^']+)'\]")


def module_path(node: fx.Node) -> str:
    stack = module_stack(node)
    if not stack:
        return ""
    path = DYNAMO_SELF.sub(lambda m: "" if m.group(1) is None else f"{m.group(1)}.", stack[-1])
    path = _INDEX.sub(r".\1", path)
    path = _KEY.sub(r".\1", path).replace("._modules.", ".").replace("_modules.", "")
    return path.strip(".")


def function_name(node: fx.Node) -> str:
    name = source_function(node)
    if name is not None:
        return re.sub(r"_\d+$", "", name)
    if node.op == "placeholder":
        return "input"
    return getattr(node.target, "__name__", str(node.target)).split(".")[0]


def tensor_name(node: fx.Node) -> str:
    """``module:function``; a view compressed on its own is named after the tensor it
    views, with the index it selects: ``qkv:linear[1]`` for attention's key. A value gact
    moved into the forward may carry its own name (``fc1:linear'``: the derivative of
    the function applied to ``fc1``'s output, ``passes.derivatives``)."""
    given = node.meta.get("gact", {}).get("name")
    if given:
        return given
    path = alias_path(node)
    if path.is_view:
        index = next((v.args[2] for v in reversed(path.chain) if v.target is aten.select.int), None)
        suffix = f"[{index}]" if isinstance(index, int) else f"[{path.chain[-1].name}]"
        return tensor_name(path.root) + suffix
    module, function = module_path(node), function_name(node)
    if node.op == "call_function" and not module_stack(node) and source_function(node) is None:
        module = _inherited_module_path(node)
    return f"{module}:{function}" if module else function


def _inherited_module_path(node: fx.Node, depth: int = 3) -> str:
    """For a node Dynamo did not trace (made by a decomposition or the partitioner, as
    ReLU's mask ``le`` of an ``alias`` of its output): the module path of the value it was
    computed from, through such nodes."""
    for source in node.all_input_nodes:
        if module_stack(source) or source_function(source) is not None:  # traced by Dynamo
            return module_path(source)
        if depth > 1 and source.op == "call_function":
            path = _inherited_module_path(source, depth - 1)
            if path:
                return path
    return ""


def unique_names(nodes: list[fx.Node], prefix: str = "") -> dict[fx.Node, str]:
    """``tensor_name`` of each node, with ``#2``, ``#3``... on repeats and an optional prefix."""
    seen: dict[str, int] = {}
    names = {}
    for node in nodes:
        base = prefix + tensor_name(node)
        seen[base] = seen.get(base, 0) + 1
        names[node] = base if seen[base] == 1 else f"{base}#{seen[base]}"
    return names
