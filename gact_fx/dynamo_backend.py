"""The ``gact`` torch.compile backend: an object that compiles graphs and keeps their records.

``torch.compile(model, backend="gact", options={...})`` reaches ``gact_entry_point``
through the ``torch_dynamo_backends`` entry point; ``gact_fx.backend(**options)`` returns
a ``GactBackend`` to pass as ``backend=`` directly. Either way each graph Dynamo hands
over goes through AOTAutograd with ``GactPartitioner`` and is compiled by Inductor or
run as Python ("eager"), and a ``GraphRecord`` per graph is kept for the report.
Each backend owns the run-time state of its sites (``runtime.registry``): two backends
in one process, at different bits, never see each other's.
"""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Sequence

import torch

from . import _compat
from .config import GactConfig
from .controller import GactController, TrackedTensor
from .partitioner import GactPartitioner
from .report import GraphRecord, Report, log_record
from .runtime.format import RUNTIME_BITS
from .runtime.ops import blob_nbytes
from .runtime.registry import SlotRegistry
from .runtime.rotation import rotation_matrix

log = logging.getLogger("gact_fx")

class GactCompileError(RuntimeError):
    """gact could not compile a graph. Raised instead of exceptions that Dynamo would
    quietly turn into a graph break, leaving that part of the model uncompressed."""


CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")


class _SharedBackends:
    """The backends ``backend="gact"`` shares (one per distinct set of options), every live
    backend (to find a model's), and the one that compiled last (``last_report``)."""

    def __init__(self) -> None:
        self.by_config: dict[GactConfig, GactBackend] = {}
        self.live: weakref.WeakSet[GactBackend] = weakref.WeakSet()
        self.last_used: GactBackend | None = None

    def for_config(self, config: GactConfig) -> GactBackend:
        backend = self.by_config.get(config)
        if backend is None:
            backend = self.by_config[config] = GactBackend(config)
        return backend

    def reset(self) -> None:
        if self.last_used in self.by_config.values():
            self.last_used = None
        self.by_config.clear()


_SHARED = _SharedBackends()


AUTO_COMPILER_VARIABLE = "GACT_FX_COMPILER"


def resolve_compiler(requested: str, example_inputs: Sequence[object], lowering: str = "auto") -> str:
    """'auto' means Inductor, as for any torch.compile user. On the CPU its longer compile
    pays for itself within a few hundred steps (``benchmarks/cpu_step_time.py``), so only
    ``GACT_FX_COMPILER=eager`` (quick experiments, the test suite) or a machine without a
    C++ compiler for Inductor's CPU kernels make 'auto' take the eager path."""
    if requested != "auto":
        return requested
    preferred = os.environ.get(AUTO_COMPILER_VARIABLE, "inductor")
    if preferred not in ("inductor", "eager"):
        raise ValueError(f"{AUTO_COMPILER_VARIABLE} must be 'inductor' or 'eager', got {preferred!r}")
    if lowering == "aten" or any(isinstance(t, torch.Tensor) and t.device.type == "cuda" for t in example_inputs):
        return "inductor"
    if preferred == "inductor":
        from .runtime import cpu_kernels

        if not cpu_kernels.available():  # the same toolchain Inductor needs; its warning said why
            log.warning("gact: compiler='auto' takes the eager path: no working C++ compiler for Inductor's CPU kernels")
            return "eager"
    return preferred


class GactBackend:
    """A torch.compile backend that compresses saved activations.

    ``records`` holds one ``GraphRecord`` per compiled training graph, in compile order;
    ``registry`` the run-time state of its sites.
    """

    def __init__(self, config: GactConfig | None = None, **options) -> None:
        if config is not None and options:
            raise ValueError("pass either a GactConfig or keyword options, not both")
        self.config = config if config is not None else GactConfig.from_options(options)
        self.records: list[GraphRecord] = []
        self.registry = SlotRegistry()
        self.controller: GactController | None = _controller_for(self.config)
        self._announced = False
        _SHARED.live.add(self)

    def __repr__(self) -> str:
        return f"GactBackend({self.config!r}, graphs={len(self.records)})"

    def __call__(self, gm: torch.fx.GraphModule, example_inputs, *, options=None, mode=None):
        _SHARED.last_used = self
        config = self.config.updated(options) if options else self.config
        compiler = resolve_compiler(config.compile.compiler, example_inputs, config.compile.lowering)
        if config.is_adaptive and mode in CUDA_GRAPH_MODES:
            raise ValueError(
                f"gact: mode={mode!r} captures CUDA graphs, which replay kernels without running Python, and "
                "adaptive bits (avg_bits, levels L2.x) set widths and probe from Python at every call; use "
                "uniform bits (bits=..., levels L1.x) with CUDA graphs, or the default mode"
            )
        if config.is_adaptive and self.controller is None:
            self.controller = _controller_for(config)
        elif config.is_adaptive and self.controller.settings != config.adaptive:
            raise ValueError(
                f"this backend's controller runs with {self.controller.settings}; per-call options cannot "
                "change the adaptive settings (one budget per controller): use a separate gact_fx.backend(...)"
            )
        records_before = len(self.records)
        if not self._announced:  # a first step of 30-100 s should not look like a hang
            self._announced = True
            log.info("gact: compiling the model with %s (%s); the first step takes longer than the rest",
                     compiler if compiler == "eager" else "Inductor", _describe(config))
        partitioner = GactPartitioner(
            config, graph_index=records_before, compiler=compiler, on_record=self._add_record,
            allocate_slot=lambda: self._new_site(config).slot,
        )
        # No AOTAutograd cache: a hit would skip the partitioner, and with it the report and
        # the controller's registration. No donated buffers in adaptive mode: the probe runs
        # the backward again with retain_graph=True, which donated buffers forbid.
        patches = {"enable_autograd_cache": False}
        if config.is_adaptive:
            patches["donated_buffer"] = False
        if compiler == "eager" and mode not in (None, "default"):
            log.warning("gact: mode=%r has no effect with compiler='eager'", mode)
        try:
            with _compat.functorch_config().patch(patches), _compat.dynamic_output_shapes_allowed():
                if compiler == "eager":
                    compiled = _compile_eager(gm, example_inputs, partitioner)
                else:
                    compiled = _compile_inductor(gm, example_inputs, partitioner, mode)
        except _compat.fallback_exceptions() as error:
            raise GactCompileError(
                f"gact could not compile this graph ({type(error).__name__}: {error}). Refusing to let "
                "Dynamo fall back to running it uncompressed; pass options={'enabled': False} to "
                "compile without gact."
            ) from error
        if len(self.records) == records_before:
            return compiled  # an inference graph: nothing saved, nothing to do
        record = self.records[-1]
        self._prepare_sites(record)
        record.parameters = [weakref.ref(t) for t in example_inputs if isinstance(t, torch.nn.Parameter)]
        if config.is_adaptive:
            tracked = self._tracked_tensors(record, config.initial_bits)
            fixed = sum(_compat.hint(r.bytes_after) for r in record.rows if r.is_activation and r.bits != RUNTIME_BITS)
            region = self.controller.add_region(record.index, tracked, baseline_bytes=record.baseline_activation_bytes,
                                                fixed_bytes=fixed)
            compiled = self.controller.wrap(region, compiled)
        return compiled

    def _new_site(self, config: GactConfig):
        """A site for one compression, flagged for dithered blobs before anything traces its
        quantize (the blob's length depends on it)."""
        site = self.registry.new_site()
        site.dithered = config.core.rounding == "dithered"
        return site

    def _prepare_sites(self, record: GraphRecord) -> None:
        """Make each site's noise state now, at compile time, on its tensor's device: made
        lazily, a CUDA graph's warm-up call would allocate it in the graph's private pool,
        which cudagraph trees refuse (tensors in the pool not tracked as outputs)."""
        for compression in record.compressions:
            site = self.registry.sites[compression.slot]
            site.rng_state(torch.device(compression.device))
            site.rotation = compression.rotation
            if compression.rotation:  # its matrix too, for the same reason
                rotation_matrix(compression.rotation, torch.device(compression.device))

    def _add_record(self, record: GraphRecord) -> None:
        self.records.append(record)
        log_record(record)

    def owns(self, model: torch.nn.Module) -> list[GraphRecord]:
        """The records of graphs whose parameters belong to ``model``."""
        mine = {id(p) for p in model.parameters()}
        return [r for r in self.records if any(ref() is not None and id(ref()) in mine for ref in r.parameters)]

    def _tracked_tensors(self, record: GraphRecord, initial_bits: int) -> list[TrackedTensor]:
        """The run-time-bits compressions of a graph, named after what produced them."""
        tracked = []
        for compression in record.compressions:
            if compression.bits == RUNTIME_BITS:
                site = self.registry.sites[compression.slot]
                site.bits = max(initial_bits, compression.floor)
                numel = _compat.hint(compression.numel)
                # the blob's bytes beyond its codes, the same at every width below full precision
                overhead = blob_nbytes(numel, getattr(torch, compression.dtype), 2, compression.group_size,
                                       compression.dithered) - numel * 2 // 8
                tracked.append(TrackedTensor(site, compression.label, compression.numel, compression.itemsize,
                                             floor=compression.floor, carried_numel=compression.carried_numel,
                                             overhead_bytes=overhead))
        return tracked

    def report(self) -> Report:
        """A snapshot of every graph compiled so far, with the bits in force now."""
        bits = {slot: site.bits for slot, site in self.registry.sites.items() if site.bits is not None}
        return Report(list(self.records), bits)

    def clear(self) -> None:
        """Forget the records. (Deliberately not named ``reset``: ``torch._dynamo.reset()``
        calls that on backends, and a backend object the user holds keeps its history.)"""
        self.records.clear()


def _describe(config: GactConfig) -> str:
    if not config.enabled:
        return "compression off"
    if config.is_adaptive:
        return f"adaptive, {config.adaptive.avg_bits:g} bits on average"
    return f"{config.core.bits} bits"


def _controller_for(config: GactConfig) -> GactController | None:
    return GactController(config.adaptive) if config.is_adaptive else None


def _compile_eager(gm, example_inputs, partitioner):
    run_fx = _compat.boxed_eager_compiler()
    return _compat.aot_autograd(
        fw_compiler=run_fx,
        bw_compiler=run_fx,
        partition_fn=partitioner,
        decompositions=_compat.inductor_decompositions(),
        keep_inference_input_mutations=True,
    )(gm, example_inputs)


def _compile_inductor(gm, example_inputs, partitioner, mode):
    from .inductor_partitioner import InductorGactPartitioner

    patches = {"custom_partitioner_fn": InductorGactPartitioner(partitioner)}
    if mode not in (None, "default"):
        patches.update(_compat.inductor_mode_options(mode))
    return _compat.inductor_compile_fx()(gm, example_inputs, config_patches=patches)


def gact_entry_point(gm, example_inputs, *, options=None, mode=None):
    """``backend="gact"``: one shared ``GactBackend`` per distinct set of options."""
    return _SHARED.for_config(GactConfig.from_options(options))(gm, example_inputs, mode=mode)


# ``torch._dynamo.reset()`` calls this: the shared backends of ``backend="gact"`` start afresh.
gact_entry_point.reset = _SHARED.reset


def last_report() -> Report:
    """The report of the gact backend that compiled most recently (all of its graphs)."""
    if _SHARED.last_used is None:
        raise RuntimeError("no graph has been compiled with the gact backend (since the last torch._dynamo.reset())")
    return _SHARED.last_used.report()


def backend_of(model: torch.nn.Module) -> GactBackend:
    """The live gact backend that compiled training graphs of ``model`` (compiled or not)."""
    for backend in list(_SHARED.live):
        if backend.owns(model):
            return backend
    raise LookupError(
        "no gact backend has compiled a training step of this model: run one training step first. If it did "
        "train, torch.compile captured no training graph of it: gact_fx.report() of the module torch.compile "
        "returned says why"
    )
