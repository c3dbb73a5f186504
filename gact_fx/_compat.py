"""Every private torch contract gact-fx touches, in one place, with where it was checked.

Private functions and classes, private attributes, the FX ``node.meta`` keys that
AOTAutograd and Inductor read, and Dynamo's naming of module paths. When torch moves
one of these, this is the only module to change. ``CONTRACTS`` lists them all;
``tests/test_compat.py`` resolves every one on the installed torch, so an upgrade that
breaks one fails loudly instead of compressing nothing.

Checked on torch 2.9.1 and 2.15.0 (the compat run in ``.ci/run``), 2.13.0 (the whole
suite), 2.10.0, 2.11.0 and 2.14.1. The floor is 2.9: torch 2.8 has neither the
descriptors AOTAutograd tags saved outputs with nor Inductor's custom-partitioner hook.
On 2.9, ``offload=True`` is refused: the activation-offloading pass came in 2.10. Imports of the heavier modules (Inductor, AOTAutograd) are deferred to
the functions that need them so that ``import gact_fx`` stays light.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.fx.experimental import symbolic_shapes as _symbolic_shapes

CHECKED_ON = ("2.9.1", "2.10.0", "2.11.0", "2.13.0", "2.14.1", "2.15.0")
TORCH_VERSION = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])


# -- symbolic sizes ---------------------------------------------------------------------


def _hint_function() -> Callable:
    # The same hint, without a guard, under three names: optimization_hint (2.12+),
    # size_hint with a fallback (2.11, where hint_int warns), hint_int (2.10).
    if hasattr(_symbolic_shapes, "optimization_hint"):
        return _symbolic_shapes.optimization_hint
    size_hint = getattr(_symbolic_shapes, "size_hint", None)
    if size_hint is not None and "fallback" in inspect.signature(size_hint).parameters:
        return size_hint
    return _symbolic_shapes.hint_int


_HINT = _hint_function()


def hint(value) -> int:
    """A concrete int for an int or SymInt, without installing a guard."""
    return int(_HINT(value, fallback=8192)) if isinstance(value, torch.SymInt) else int(value)


def provably_equal(a, b) -> bool:
    """``a == b`` for ints or SymInts, true only when it holds for every size the shape
    environment allows; decided without a guard, so a dynamic dimension stays dynamic."""
    return _symbolic_shapes.statically_known_true(_symbolic_shapes.sym_eq(a, b))


def unbacked_bindings(fake_mode, val):
    """``meta["unbacked_bindings"]`` for a node whose value has data-dependent sizes."""
    from torch.fx.experimental.symbolic_shapes import compute_unbacked_bindings

    return compute_unbacked_bindings(fake_mode.shape_env, val)


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


# -- FX node metadata that torch's passes read -------------------------------------------

# AOTAutograd (2.11+): saved without a version-counter check; 2.10 marks no node with it.
META_NO_VC_CHECK = "saved_tensor_with_no_vc_check"
META_EAGER_INPUT_VALS = "eager_input_vals"  # Inductor: the layout to give a needs_exact_strides op
META_UNBACKED_BINDINGS = "unbacked_bindings"  # where a node binds its data-dependent sizes
META_SHOULD_OFFLOAD = "should_offload"  # torch's activation offloading: move this saved value
META_OUTPUT_DESCS = "desc"  # AOTAutograd: descriptors of the forward's outputs
META_MODULE_STACK = "nn_module_stack"  # Dynamo: the modules a node was traced inside
META_SOURCE_FN_STACK = "source_fn_stack"  # Dynamo: the function or module call that made it


def saved_without_vc_check(node: torch.fx.Node) -> bool:
    return bool(node.meta.get(META_NO_VC_CHECK))


def mark_saved_without_vc_check(node: torch.fx.Node) -> None:
    node.meta[META_NO_VC_CHECK] = True


def set_eager_input_vals(node: torch.fx.Node, args: tuple, kwargs: dict | None = None) -> None:
    node.meta[META_EAGER_INPUT_VALS] = (args, kwargs or {})


def eager_input_vals(node: torch.fx.Node) -> tuple[tuple, dict] | None:
    return node.meta.get(META_EAGER_INPUT_VALS)


def set_unbacked_bindings(node: torch.fx.Node, bindings) -> None:
    node.meta[META_UNBACKED_BINDINGS] = bindings


def mark_for_offload(node: torch.fx.Node) -> None:
    node.meta[META_SHOULD_OFFLOAD] = True


def output_descriptors(output: torch.fx.Node):
    return output.meta.get(META_OUTPUT_DESCS)


def set_output_descriptors(output: torch.fx.Node, descriptors: list) -> None:
    output.meta[META_OUTPUT_DESCS] = descriptors


# Dynamo names module paths from the frame's locals: ``L['self'].blocks[0].fc1`` or
# ``L['self']._modules['blocks']._modules['0']``; ``L['fn']`` where torch.compile wraps a
# module whose forward is torch's own (``nn.Sequential``, checked on 2.9.1, 2.13.0, 2.15.0);
# other locals as ``L['model']``.
DYNAMO_SELF = re.compile(r"^L\['(?:self|fn)'\]\.?|^L\['(\w+)'\]\.?")


def module_stack(node: torch.fx.Node) -> list[str]:
    """Dynamo's module paths of a node, outermost first (raw: ``L['self'].fc1``)."""
    stack = node.meta.get(META_MODULE_STACK) or {}
    return [path for path, _ in stack.values()]


def source_function(node: torch.fx.Node) -> str | None:
    """The name Dynamo gave the innermost call that produced ``node`` (``linear_3``)."""
    stack = node.meta.get(META_SOURCE_FN_STACK) or []
    return str(stack[-1][0]) if stack else None


# -- graphs, partitioners and compilers --------------------------------------------------


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


def inductor_config():
    import torch._inductor.config as config

    return config


def failing_past_recompiles(limit: int):
    """A block in which Dynamo compiles a code object up to ``limit`` times and then raises,
    rather than run the frame eagerly with a logged warning."""
    import torch._dynamo.config as config

    return config.patch(recompile_limit=limit, fail_on_recompile_limit_hit=True)


def inductor_lays_out_channels_last(gm) -> bool:
    """Whether Inductor's layout optimisation will lay ``gm``'s convolutions out channels-last
    (its own heuristic: on the CPU with mkldnn, any graph with a convolution)."""
    try:
        from torch._inductor.graph import GraphLowering

        return bool(GraphLowering.decide_layout_opt(gm, is_inference=False))
    except Exception:  # a torch without the heuristic, or a graph it cannot read: assume not
        return False


def functorch_config():
    import torch._functorch.config as config

    return config


def is_op_overload(target) -> bool:
    return isinstance(target, torch._ops.OpOverload)


def rename_node(node: torch.fx.Node, name: str) -> None:
    """Rename an FX node through its graph's namespace."""
    node._rename(name)


def tree_leaves(tree) -> list:
    from torch.utils._pytree import tree_leaves as _tree_leaves

    return _tree_leaves(tree)


def saved_output_descriptor() -> type:
    """The descriptor AOTAutograd tags saved forward outputs with."""
    from torch._functorch._aot_autograd.descriptors import SavedForBackwardsAOTOutput

    return SavedForBackwardsAOTOutput


def extract_tensor_metadata(val):
    from torch.fx.passes.shape_prop import _extract_tensor_metadata

    return _extract_tensor_metadata(val)


def fallback_exceptions() -> tuple[type[BaseException], ...]:
    """Exceptions Dynamo turns into a graph break (an uncompiled model) when a backend raises them."""
    from torch._dynamo.exc import exceptions_allowed_to_be_fallback

    return tuple(exceptions_allowed_to_be_fallback)


def trace_with_fake_values(fn, values, fake_mode, decompositions) -> torch.fx.GraphModule:
    """``make_fx`` of ``fn`` over existing fake tensors / SymInts, keeping their symbols."""
    from torch.fx.experimental.proxy_tensor import make_fx

    with fake_mode:
        return make_fx(fn, decomposition_table=decompositions, tracing_mode="real")(*values)


def wrapped_triton_launches():
    """The higher-order ops a ``wrap_triton`` launch traces to: (in place, functional)."""
    from torch._higher_order_ops.triton_kernel_wrap import (
        triton_kernel_wrapper_functional,
        triton_kernel_wrapper_mutation,
    )

    return triton_kernel_wrapper_mutation, triton_kernel_wrapper_functional


def inductor_triton_source(kernel) -> str:
    """The source Inductor writes into its module for a traced ``@triton.jit`` kernel: the
    kernel and everything it calls, which Inductor then compiles itself."""
    from torch._inductor.codegen.wrapper import user_defined_triton_kernel_transitive_closure_source_code

    return user_defined_triton_kernel_transitive_closure_source_code(kernel)


def has_activation_offloading() -> bool:
    """Whether torch has the activation-offloading pass (2.10+), which ``offload=True`` drives."""
    import importlib.util

    return importlib.util.find_spec("torch._functorch._activation_offloading") is not None


def offload_marked_activations(fw, bw, num_fwd_outputs: int, static_inputs) -> None:
    """torch's activation offloading over the nodes marked ``meta["should_offload"]``."""
    from torch._functorch._activation_offloading.activation_offloading import enable_activation_offloading
    from torch.utils._ordered_set import OrderedSet

    enable_activation_offloading(fw, bw, num_fwd_outputs, OrderedSet(static_inputs))


# -- modules, autograd nodes and tensors at run time -------------------------------------


def plain_call(module: torch.nn.Module) -> Callable:
    """What ``module(...)`` runs without ``compile()``: hooks included, the forward inside."""
    return module._call_impl


def set_compiled_call(module: torch.nn.Module, call) -> None:
    """What ``module(...)`` runs instead of its plain call (``nn.Module.compile``'s slot); None restores it."""
    module._compiled_call_impl = call


def version_counter(tensor: torch.Tensor) -> int:
    """How many in-place writes ``tensor``'s storage has seen (autograd's version counter)."""
    return tensor._version


def squared_norm(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The sum of the tensors' squared L2 norms, accumulated in float32, as a scalar tensor: one
    fused kernel per device and dtype (``_foreach_norm``, as ``clip_grad_norm_`` uses), with
    no squared copy of each tensor (2.7x faster on a tiny ViT's gradients, 1.6x on a
    base-width BERT's)."""
    with torch.no_grad():
        return torch.stack(torch._foreach_norm(tensors, 2, dtype=torch.float32)).square().sum()


def add_one_(tensors: list[torch.Tensor]) -> None:
    """Add 1 to each tensor in place: one fused kernel per device and dtype (``_foreach_add_``)."""
    torch._foreach_add_(tensors, 1)


def dispatch_mode_active() -> bool:
    """Whether a TorchDispatchMode (make_fx's tracer, a FLOP counter) sees the ops called now."""
    return torch._C._len_torch_dispatch_stack() > 0


COMPILED_NODE_NAME = "CompiledFunction"  # AOTAutograd's autograd.Function (its node: CompiledFunctionBackward)


def is_compiled_node(node) -> bool:
    """Whether an autograd node is the backward of a graph AOTAutograd compiled."""
    return COMPILED_NODE_NAME in node.name()


def allow_backward_rerun(node) -> None:
    """Let a compiled graph's backward run again with ``retain_graph=True``.

    AOTAutograd refuses when the graph may have donated buffers; for a graph compiled
    without them (``donated_buffer=False``) it still refuses, because its record of the
    donated buffers is None rather than empty. Call only on graphs gact compiled without
    donated buffers: the record is then set to what it is, empty.
    """
    metadata = type(node)._forward_cls.metadata
    if metadata.bw_donated_idxs is None:
        metadata.bw_donated_idxs = []


def graph_break_counts() -> dict[str, int]:
    """Dynamo's graph-break counts so far, by reason (empty if Dynamo was never imported, or
    if the counters cannot be read: an account of graph breaks must never fail a step)."""
    import sys

    utils = sys.modules.get("torch._dynamo.utils")
    try:
        return dict(utils.counters["graph_break"]) if utils is not None else {}
    except Exception:  # noqa: BLE001  (a changed counter layout must not break training)
        return {}


def run_uncompiled(fn: Callable) -> Callable:
    """``fn`` as a frame an outer ``torch.compile`` does not trace: it breaks its graph there and
    calls ``fn`` as Python (compiled functions that ``fn`` calls still compile with their own backend)."""
    reason = "gact_fx.compress(): the module compiles itself with gact's backend"
    try:
        return torch.compiler.disable(fn, reason=reason)
    except TypeError:  # torch before 2.10 takes no reason
        return torch.compiler.disable(fn)


def compiled_with(module) -> tuple[torch.nn.Module, Callable, dict] | None:
    """``(original module, backend, backend keyword arguments)`` of a module returned by
    ``torch.compile``, or None for any other module (or a torch that keeps them elsewhere)."""
    original = getattr(module, "_orig_mod", None)
    context = getattr(module, "dynamo_ctx", None)
    if original is None or context is None:
        return None
    wrapper, seen = getattr(context, "callback", None), 0
    while wrapper is not None and not hasattr(wrapper, "compiler_fn") and seen < 16:
        wrapper, seen = getattr(wrapper, "_torchdynamo_orig_backend", None), seen + 1
    if wrapper is None or not hasattr(wrapper, "compiler_fn"):
        return None
    return original, wrapper.compiler_fn, dict(getattr(wrapper, "kwargs", None) or {})


def inside_ddp_forward() -> bool:
    """Whether a DistributedDataParallel forward is running (Dynamo treats it specially)."""
    if not torch.distributed.is_available():
        return False
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel._get_active_ddp_module() is not None


def compile_cpp_library(source: str):
    """Compile C++ ``source`` into a shared library with Inductor's CPU toolchain and flags
    (OpenMP, no fused multiply-add) and load it (a ``ctypes.CDLL``); cached on disk."""
    from torch._inductor.codecache import CppCodeCache

    return CppCodeCache.load(source)


def register_inductor_random() -> None:
    """Register ``prims.inductor_random`` (Philox keyed by a seed tensor, inside Inductor's kernels)."""
    import torch._inductor.inductor_prims  # noqa: F401


# -- the list of contracts, for tests/test_compat.py -------------------------------------


@dataclass(frozen=True)
class Contract:
    """One private thing gact relies on; ``resolve()`` raises or returns None if it is gone."""

    name: str
    resolve: Callable[[], object]


def _attribute(module: str, path: str) -> Callable[[], object]:
    def resolve():
        value = importlib.import_module(module)
        for part in path.split("."):
            value = getattr(value, part)
        return value

    return resolve


def _read_by(key: str, *modules: str) -> Callable[[], object]:
    """A meta key is alive when the torch code that honours it still mentions it."""

    def resolve():
        sources = [inspect.getsource(importlib.import_module(m)) for m in modules]
        return all(f'"{key}"' in s or f"'{key}'" in s for s in sources) or None

    return resolve


def _config_option(config: str, name: str) -> Callable[[], object]:
    def resolve():
        return name in importlib.import_module(config)._config or None

    return resolve


def _dynamo_module_path() -> bool:
    """Dynamo still names module paths ``L['self']...`` (traced on a tiny module)."""
    import torch._dynamo

    seen = []

    def backend(gm, example_inputs):
        seen.extend(p for node in gm.graph.nodes for p in module_stack(node))
        return gm.forward

    torch.compile(torch.nn.Sequential(torch.nn.Linear(2, 2)), backend=backend, fullgraph=True)(torch.ones(1, 2))
    return bool(seen) and all(DYNAMO_SELF.match(path) for path in seen) or None


def _compiled_function_metadata() -> object:
    """The backward node of an AOTAutograd graph: its name and its forward class's metadata."""
    compiler = aot_autograd(fw_compiler=boxed_eager_compiler(), bw_compiler=boxed_eager_compiler())
    x = torch.ones(3, requires_grad=True)
    output = torch.compile(lambda t: (t * t).sum(), backend=compiler, fullgraph=True)(x)  # keeps the node alive
    node = output.grad_fn
    while node is not None and not is_compiled_node(node):
        node = node.next_functions[0][0]
    return node is not None and hasattr(type(node)._forward_cls.metadata, "bw_donated_idxs") or None


CONTRACTS: tuple[Contract, ...] = (
    Contract("symbolic_shapes.optimization_hint (2.12+), size_hint (2.11) or hint_int (2.10)", lambda: _HINT),
    Contract("symbolic_shapes.statically_known_true and sym_eq",
             lambda: (_symbolic_shapes.statically_known_true, _symbolic_shapes.sym_eq)),
    Contract("symbolic_shapes.compute_unbacked_bindings",
             _attribute("torch.fx.experimental.symbolic_shapes", "compute_unbacked_bindings")),
    Contract("ShapeEnvSettings.allow_dynamic_output_shape_ops",
             lambda: "allow_dynamic_output_shape_ops" in {f.name for f in dataclasses.fields(
                 importlib.import_module("torch.fx.experimental.symbolic_shapes").ShapeEnvSettings)} or None),
    Contract("_guards.TracingContext.try_get", _attribute("torch._guards", "TracingContext.try_get")),
    Contract("_guards.detect_fake_mode", _attribute("torch._guards", "detect_fake_mode")),
    Contract("partitioners.default_partition", _attribute("torch._functorch.partitioners", "default_partition")),
    Contract("partitioners.min_cut_rematerialization_partition",
             _attribute("torch._functorch.partitioners", "min_cut_rematerialization_partition")),
    Contract("_dynamo.backends.common.aot_autograd", _attribute("torch._dynamo.backends.common", "aot_autograd")),
    Contract("_inductor.decomposition.select_decomp_table",
             _attribute("torch._inductor.decomposition", "select_decomp_table")),
    Contract("aot_autograd.make_boxed_func", _attribute("torch._functorch.aot_autograd", "make_boxed_func")),
    Contract("_inductor.compile_fx.compile_fx", _attribute("torch._inductor.compile_fx", "compile_fx")),
    Contract("custom_graph_pass.CustomPartitionerFn",
             _attribute("torch._inductor.custom_graph_pass", "CustomPartitionerFn")),
    Contract("custom_graph_pass.get_hash_for_files", _attribute("torch._inductor.custom_graph_pass", "get_hash_for_files")),
    Contract("_inductor.list_mode_options", _attribute("torch._inductor", "list_mode_options")),
    Contract("inductor config custom_partitioner_fn", _config_option("torch._inductor.config", "custom_partitioner_fn")),
    Contract("inductor config post_grad_fusion_options",
             _config_option("torch._inductor.config", "post_grad_fusion_options")),
    Contract("functorch config enable_autograd_cache", _config_option("torch._functorch.config", "enable_autograd_cache")),
    Contract("functorch config donated_buffer", _config_option("torch._functorch.config", "donated_buffer")),
    Contract("functorch config activation_memory_budget",
             _config_option("torch._functorch.config", "activation_memory_budget")),
    Contract("_ops.OpOverload", _attribute("torch._ops", "OpOverload")),
    Contract("fx.Node._rename", _attribute("torch.fx", "Node._rename")),
    Contract("utils._pytree.tree_leaves", _attribute("torch.utils._pytree", "tree_leaves")),
    Contract("descriptors.SavedForBackwardsAOTOutput",
             _attribute("torch._functorch._aot_autograd.descriptors", "SavedForBackwardsAOTOutput")),
    Contract("shape_prop._extract_tensor_metadata", _attribute("torch.fx.passes.shape_prop", "_extract_tensor_metadata")),
    Contract("_dynamo.exc.exceptions_allowed_to_be_fallback",
             _attribute("torch._dynamo.exc", "exceptions_allowed_to_be_fallback")),
    Contract("proxy_tensor.make_fx", _attribute("torch.fx.experimental.proxy_tensor", "make_fx")),
    Contract("activation_offloading.enable_activation_offloading (2.10+, for offload=True)",
             lambda: not has_activation_offloading() or _attribute(
                 "torch._functorch._activation_offloading.activation_offloading", "enable_activation_offloading")()),
    Contract("utils._ordered_set.OrderedSet", _attribute("torch.utils._ordered_set", "OrderedSet")),
    Contract("inductor_prims registers prims.inductor_random",
             lambda: (register_inductor_random(), torch.ops.prims.inductor_random)[1]),
    Contract("nn.Module._call_impl", _attribute("torch.nn", "Module._call_impl")),
    Contract("nn.Module._compiled_call_impl",
             lambda: "_compiled_call_impl" in inspect.getsource(torch.nn.Module._wrapped_call_impl) or None),
    Contract("Tensor._version", lambda: version_counter(torch.zeros(1)) is not None or None),
    Contract("_C._len_torch_dispatch_stack", lambda: dispatch_mode_active() is False or None),
    Contract("_foreach_norm(tensors, ord, dtype=)",
             lambda: squared_norm([torch.ones(2, dtype=torch.float16), torch.ones(3)]).item() == 5.0 or None),
    Contract("_dynamo.utils.counters", _attribute("torch._dynamo.utils", "counters")),
    Contract("triton_kernel_wrap.triton_kernel_wrapper_functional and _mutation (for lowering='triton')",
             lambda: all(wrapped_triton_launches()) or None),
    Contract("wrapper.user_defined_triton_kernel_transitive_closure_source_code (the static check of lowering='triton')",
             _attribute("torch._inductor.codegen.wrapper", "user_defined_triton_kernel_transitive_closure_source_code")),
    Contract("OptimizedModule: _orig_mod and dynamo_ctx.callback down to compiler_fn",
             lambda: compiled_with(torch.compile(torch.nn.Identity(), backend="eager"))[1] is not None or None),
    Contract("DistributedDataParallel._get_active_ddp_module",
             _attribute("torch.nn.parallel", "DistributedDataParallel._get_active_ddp_module")),
    Contract("CompiledFunction node name and metadata.bw_donated_idxs", _compiled_function_metadata),
    Contract("Dynamo module paths L['self']...", _dynamo_module_path),
    Contract(f"meta[{META_NO_VC_CHECK!r}] (torch 2.11+)",
             lambda: TORCH_VERSION < (2, 11) or _read_by(META_NO_VC_CHECK, "torch._functorch.partitioners")()),
    Contract(f"meta[{META_EAGER_INPUT_VALS!r}]", _read_by(META_EAGER_INPUT_VALS, "torch._inductor.graph")),
    Contract(f"meta[{META_UNBACKED_BINDINGS!r}]", _read_by(META_UNBACKED_BINDINGS, "torch._inductor.graph")),
    Contract(f"meta[{META_SHOULD_OFFLOAD!r}] (2.10+)",
             lambda: not has_activation_offloading() or _read_by(
                 META_SHOULD_OFFLOAD, "torch._functorch._activation_offloading.activation_offloading")()),
    Contract(f"meta[{META_OUTPUT_DESCS!r}]", _read_by(META_OUTPUT_DESCS, "torch._functorch.partitioners")),
    Contract(f"meta[{META_MODULE_STACK!r}]", _read_by(META_MODULE_STACK, "torch._dynamo.output_graph")),
    Contract(f"meta[{META_SOURCE_FN_STACK!r}]", _read_by(META_SOURCE_FN_STACK, "torch._dynamo.output_graph")),
    Contract("Tag.needs_exact_strides", lambda: torch.Tag.needs_exact_strides),
    Contract("codecache.CppCodeCache.load compiles and loads C++",
             lambda: compile_cpp_library('extern "C" int gact_contract(void) { return 7; }').gact_contract() == 7 or None),
)
