"""Every private torch API gact-fx touches, in one place.

Checked on torch 2.13.0 (CPU build). When torch moves one of these, this is the only
module to change. Imports of the heavier ones (Inductor, AOTAutograd) are deferred to
the functions that need them so that ``import gact_fx`` stays light.
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch
from torch.fx.experimental.symbolic_shapes import optimization_hint as _optimization_hint


def hint(value) -> int:
    """A concrete int for an int or SymInt, without installing a guard."""
    return int(_optimization_hint(value, fallback=8192)) if isinstance(value, torch.SymInt) else int(value)


def detect_fake_mode(values):
    from torch._guards import detect_fake_mode as _detect

    return _detect(values)


def partitioners():
    """The two stock partitioners: ``(min_cut_rematerialization_partition, default_partition)``."""
    from torch._functorch.partitioners import default_partition, min_cut_rematerialization_partition

    return min_cut_rematerialization_partition, default_partition


def aot_autograd(**kwargs):
    from torch._dynamo.backends.common import aot_autograd as _aot_autograd

    return _aot_autograd(**kwargs)


def inductor_decompositions():
    """Inductor's decomposition table, for the eager path to see Inductor's graphs."""
    import torch._inductor.lowering  # noqa: F401  (some decompositions consult it, e.g. max_pool2d)
    from torch._inductor.decomposition import select_decomp_table

    return select_decomp_table()


def boxed_eager_compiler():
    """A fw/bw 'compiler' that runs the FX graph as Python, with boxed arguments."""
    from torch._functorch.aot_autograd import make_boxed_func

    def compile_eager(gm: torch.fx.GraphModule, example_inputs):
        return make_boxed_func(gm.forward)

    return compile_eager


def inductor_compile_fx():
    from torch._inductor.compile_fx import compile_fx

    return compile_fx


def custom_partitioner_base() -> type:
    """Inductor's base class for ``config.custom_partitioner_fn`` (imports Inductor)."""
    from torch._inductor.custom_graph_pass import CustomPartitionerFn

    return CustomPartitionerFn


def hash_files(paths) -> bytes:
    from torch._inductor.custom_graph_pass import get_hash_for_files

    return get_hash_for_files(tuple(paths))


def inductor_mode_options(mode: str) -> dict:
    """Inductor config patches for a ``torch.compile`` mode name."""
    from torch._inductor import list_mode_options

    return list_mode_options(mode)


def is_op_overload(target) -> bool:
    return isinstance(target, torch._ops.OpOverload)


def rename_node(node: torch.fx.Node, name: str) -> None:
    """Rename an FX node through its graph's namespace."""
    node._rename(name)


def unbacked_bindings(fake_mode, val):
    """``meta["unbacked_bindings"]`` for a node whose value has data-dependent sizes."""
    from torch.fx.experimental.symbolic_shapes import compute_unbacked_bindings

    return compute_unbacked_bindings(fake_mode.shape_env, val)


def tree_leaves(tree) -> list:
    from torch.utils._pytree import tree_leaves as _tree_leaves

    return _tree_leaves(tree)


def functorch_config():
    import torch._functorch.config as config

    return config


def saved_output_descriptor() -> type:
    """The descriptor AOTAutograd tags saved forward outputs with."""
    from torch._functorch._aot_autograd.descriptors import SavedForBackwardsAOTOutput

    return SavedForBackwardsAOTOutput


def extract_tensor_metadata(val):
    from torch.fx.passes.shape_prop import _extract_tensor_metadata

    return _extract_tensor_metadata(val)


@contextlib.contextmanager
def dynamic_output_shapes_allowed():
    """Let fake impls return data-dependent sizes during this compile (run-time bits need it).

    Dynamo only allows them under ``fullgraph=True`` or ``capture_dynamic_output_shape_ops``;
    otherwise ``new_dynamic_size()`` raises an exception Dynamo turns into a silent graph break.
    """
    from torch._guards import TracingContext

    context = TracingContext.try_get()
    shape_env = getattr(getattr(context, "fake_mode", None), "shape_env", None)
    if shape_env is None:
        yield
        return
    previous = shape_env.settings  # a frozen ShapeEnvSettings (part of fake-dispatch cache keys)
    shape_env.settings = dataclasses.replace(previous, allow_dynamic_output_shape_ops=True)
    try:
        yield
    finally:
        shape_env.settings = previous


def fallback_exceptions() -> tuple[type[BaseException], ...]:
    """Exceptions Dynamo turns into a graph break (an uncompiled model) when a backend raises them."""
    from torch._dynamo.exc import exceptions_allowed_to_be_fallback

    return tuple(exceptions_allowed_to_be_fallback)


def trace_with_fake_values(fn, values, fake_mode, decompositions) -> torch.fx.GraphModule:
    """``make_fx`` of ``fn`` over existing fake tensors / SymInts, keeping their symbols."""
    from torch.fx.experimental.proxy_tensor import make_fx

    with fake_mode:
        return make_fx(fn, decomposition_table=decompositions, tracing_mode="real")(*values)


def set_compiled_call(module: torch.nn.Module, call) -> None:
    """What ``module(...)`` runs instead of its plain call (``nn.Module.compile``'s slot); None restores it."""
    module._compiled_call_impl = call


def graph_break_counts() -> dict[str, int]:
    """Dynamo's graph-break counts so far, by reason (empty if Dynamo was never imported)."""
    import sys

    utils = sys.modules.get("torch._dynamo.utils")
    return dict(utils.counters["graph_break"]) if utils is not None else {}


def inside_ddp_forward() -> bool:
    """Whether a DistributedDataParallel forward is running (Dynamo treats it specially)."""
    if not torch.distributed.is_available():
        return False
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel._get_active_ddp_module() is not None


def offload_marked_activations(fw, bw, num_fwd_outputs: int, static_inputs) -> None:
    """torch's activation offloading over the nodes marked ``meta["should_offload"]``."""
    from torch._functorch._activation_offloading.activation_offloading import enable_activation_offloading
    from torch.utils._ordered_set import OrderedSet

    enable_activation_offloading(fw, bw, num_fwd_outputs, OrderedSet(static_inputs))
