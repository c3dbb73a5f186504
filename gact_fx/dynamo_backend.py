"""The ``gact`` torch.compile backend: an object that compiles graphs and keeps their records.

``torch.compile(model, backend="gact", options={...})`` reaches ``gact_entry_point``
through the ``torch_dynamo_backends`` entry point; ``gact_fx.backend(**options)`` returns
a ``GactBackend`` to pass as ``backend=`` directly. Either way each graph Dynamo hands
over goes through AOTAutograd with ``GactPartitioner`` and is compiled by Inductor or
run as Python ("eager"), and a ``GraphRecord`` per graph is kept for the report.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from . import _compat
from .config import GactConfig
from .partitioner import GactPartitioner
from .report import GraphRecord, Report, log_record

log = logging.getLogger("gact_fx")

_last_used: GactBackend | None = None


def resolve_compiler(requested: str, example_inputs: Sequence[object]) -> str:
    """'auto' means Inductor when the graph runs on CUDA, eager FX otherwise."""
    if requested != "auto":
        return requested
    on_cuda = any(isinstance(t, torch.Tensor) and t.device.type == "cuda" for t in example_inputs)
    return "inductor" if on_cuda else "eager"


class GactBackend:
    """A torch.compile backend that compresses saved activations.

    ``records`` holds one ``GraphRecord`` per compiled training graph, in compile order.
    """

    def __init__(self, config: GactConfig | None = None, **options) -> None:
        if config is not None and options:
            raise ValueError("pass either a GactConfig or keyword options, not both")
        self.config = config if config is not None else GactConfig.from_options(options)
        self.records: list[GraphRecord] = []

    def __repr__(self) -> str:
        return f"GactBackend({self.config!r}, graphs={len(self.records)})"

    def __call__(self, gm: torch.fx.GraphModule, example_inputs, *, options=None, mode=None):
        global _last_used
        _last_used = self
        config = self.config
        if options:
            config = GactConfig.from_options({**config.as_dict(), **options})
        compiler = resolve_compiler(config.compiler, example_inputs)
        partitioner = GactPartitioner(
            config, graph_index=len(self.records), compiler=compiler, on_record=self._add_record
        )
        with _compat.functorch_config().patch(enable_autograd_cache=False):
            if compiler == "eager":
                if mode not in (None, "default"):
                    log.warning("gact: mode=%r has no effect with compiler='eager'", mode)
                return _compile_eager(gm, example_inputs, partitioner)
            return _compile_inductor(gm, example_inputs, partitioner, mode)

    def _add_record(self, record: GraphRecord) -> None:
        self.records.append(record)
        log_record(record)

    def report(self) -> Report:
        return Report(list(self.records))

    def clear(self) -> None:
        """Forget the records. (Deliberately not named ``reset``: ``torch._dynamo.reset()``
        calls that on backends, and a backend object the user holds keeps its history.)"""
        self.records.clear()


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


_backends_by_config: dict[GactConfig, GactBackend] = {}


def gact_entry_point(gm, example_inputs, *, options=None, mode=None):
    """``backend="gact"``: one shared ``GactBackend`` per distinct set of options."""
    config = GactConfig.from_options(options)
    backend = _backends_by_config.get(config)
    if backend is None:
        backend = _backends_by_config[config] = GactBackend(config)
    return backend(gm, example_inputs, mode=mode)


def _reset_entry_point() -> None:
    """``torch._dynamo.reset()``: the shared backends of ``backend="gact"`` start afresh."""
    global _last_used
    if _last_used in _backends_by_config.values():
        _last_used = None
    _backends_by_config.clear()


gact_entry_point.reset = _reset_entry_point


def last_report() -> Report:
    """The report of the gact backend that compiled most recently (all of its graphs)."""
    if _last_used is None:
        raise RuntimeError("no graph has been compiled with the gact backend (since the last torch._dynamo.reset())")
    return _last_used.report()
