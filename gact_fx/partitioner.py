"""The gact partition function: stock partitioner, then find -> hoist -> plan -> rewrite.

AOTAutograd calls it with the joint graph; it returns the forward and backward graphs
with the saved activations compressed, and hands a ``GraphRecord`` of what it did to
its owner (the backend). It holds no global state.
"""

from __future__ import annotations

import fnmatch
import functools
import re
import time
from collections.abc import Callable, Sequence

import torch.fx as fx

from ._compat import inductor_lays_out_channels_last, partitioners
from .config import GactConfig
from .passes.debias import debias_attention
from .passes.memory import saved_bytes_timeline
from .passes.offload import offload_blobs
from .passes.pipeline import PassContext, Stopwatch, run_section_passes
from .passes.plan import BitsChoice, BitsChooser, BitsSource, Compression, PlanOptions, assign_bits, plan_compression
from .passes.rewrite import apply_plan
from .passes.saved import SavedGraph, find_saved
from .passes.snapshot import graph_view
from .passes.uses import classify_uses
from .report import GraphRecord
from .runtime.format import RUNTIME_BITS

_GRAPH_PREFIX = re.compile(r"^g\d+/")  # ``label_prefix`` of graphs after the first


def bits_chooser(config: GactConfig) -> BitsChooser:
    """Per-tensor overrides first; then run-time bits (adaptive) or the uniform ``bits``."""

    def choose(compression: Compression) -> BitsChoice:
        # Labels of graphs after the first carry a ``g<index>/`` prefix; a pattern may
        # name the tensor with or without it. A value and its saved derivative
        # (``fc1:linear'``, ``passes.derivatives``) share their patterns: the plan that
        # decides whether the derivative is saved sees the value under its own name.
        names = {compression.label, _GRAPH_PREFIX.sub("", compression.label)}
        names |= {name.removesuffix("'") for name in names} | {name.removesuffix("'") + "'" for name in names}
        for pattern, bits in config.core.overrides:
            # A name itself matches before its glob reading: ``qkv:linear[0]`` has brackets.
            if pattern in names or any(fnmatch.fnmatchcase(name, pattern) for name in names):
                return BitsChoice(bits, f"override {pattern!r}", BitsSource.OVERRIDE)
        if config.is_adaptive:
            return BitsChoice(RUNTIME_BITS, f"adaptive (average {config.adaptive.avg_bits:g})", BitsSource.ADAPTIVE)
        return BitsChoice(compression.bits, "uniform", BitsSource.UNIFORM)

    return choose


def _uses(bw: fx.GraphModule, saved: SavedGraph):
    """How the backward consumes each saved tensor, by its position in the saved section."""
    found = classify_uses(bw, [v.bw_placeholder for v in saved.tensors])
    return {v.position: found[v.bw_placeholder] for v in saved.tensors}


def stock_partitioner(name: str) -> Callable:
    min_cut, default = partitioners()
    if name == "min_cut":
        return functools.partial(min_cut, compiler="inductor")
    return default


class GactPartitioner:
    """``partition_fn`` for AOTAutograd. ``on_record`` receives one record per graph."""

    def __init__(
        self,
        config: GactConfig,
        *,
        graph_index: int,
        compiler: str,
        on_record: Callable[[GraphRecord], None],
        allocate_slot: Callable[[], int],
    ) -> None:
        self.config = config
        self.graph_index = graph_index
        self.compiler = compiler
        self.on_record = on_record
        self.allocate_slot = allocate_slot

    @property
    def _inductor_runs_the_ops(self) -> bool:
        """Whether Inductor compiles graphs holding the opaque ``gact::`` ops (its CPU layout
        and bool-store behaviour then shape how the plan lays tensors out)."""
        return self.compiler == "inductor" and self.config.compile.lowering not in ("aten", "triton")

    def _planned_bits(self, bw: fx.GraphModule, saved: SavedGraph, options: PlanOptions,
                      overridden: bool = True) -> dict[int, int]:
        """The bits the plan would store each saved float value at, by position
        (``overridden=False``: less those whose bits a per-tensor override sets)."""
        plan = plan_compression(saved, options, allocate_slot=lambda: -1, uses=_uses(bw, saved))  # a dry run: no slots
        plan = assign_bits(plan, bits_chooser(self.config), estimate_bits=self.config.initial_bits)
        return {
            m.position: c.bits for c in plan.compressions
            if c.is_float and (overridden or c.bits_source != BitsSource.OVERRIDE)
            for m in c.members
        }

    def __call__(
        self,
        joint: fx.GraphModule,
        joint_inputs: Sequence[object],
        *,
        num_fwd_outputs: int,
        static_lifetime_input_indices: Sequence[int] | None = None,
        **kwargs,
    ) -> tuple[fx.GraphModule, fx.GraphModule]:
        kwargs.pop("compiler", None)  # Inductor passes it; stock_partitioner fixes it
        fw, bw = stock_partitioner(self.config.compile.partitioner)(
            joint,
            joint_inputs,
            num_fwd_outputs=num_fwd_outputs,
            static_lifetime_input_indices=static_lifetime_input_indices,
            **kwargs,
        )
        started = time.perf_counter()
        code_before = (fw.code, bw.code)
        static_indices = static_lifetime_input_indices or ()
        saved = baseline = find_saved(fw, bw, num_fwd_outputs, static_indices)
        baseline_timeline = saved_bytes_timeline(fw, bw, baseline)
        options = PlanOptions(
            self.config.core,
            bits=self.config.initial_bits,
            label_prefix=f"g{self.graph_index}/" if self.graph_index else "",
            channels_last=self._inductor_runs_the_ops and inductor_lays_out_channels_last(fw),
        )
        context = PassContext(fw, bw, num_fwd_outputs, static_indices, saved,
                              lambda current, overridden: self._planned_bits(bw, current, options, overridden))
        runs = run_section_passes(context, self.config.passes) if self.config.enabled else []
        saved, stopwatch = context.saved, Stopwatch(runs)
        plan = stopwatch.time("plan", lambda: assign_bits(
            plan_compression(saved, options, allocate_slot=self.allocate_slot, uses=_uses(bw, saved)),
            bits_chooser(self.config), estimate_bits=self.config.initial_bits))
        record = GraphRecord.build(
            index=self.graph_index, compiler=self.compiler, config=self.config, baseline=baseline, saved=saved, plan=plan
        )
        stopwatch.time("rewrite", lambda: apply_plan(fw, bw, saved, plan, masks_as_bytes=self._inductor_runs_the_ops))
        if self.config.passes.debias_attention:
            record.debiased_slots = stopwatch.time("debias attention", lambda: debias_attention(bw))
        lowering = self.config.compile.lowering
        if lowering in ("aten", "triton"):
            from .passes.lower import lower_ops  # imports Inductor's prims

            dithered = self.config.core.rounding == "dithered"
            stopwatch.time(f"lower to {lowering}", lambda: lower_ops(fw, bw, num_fwd_outputs, lowering, dithered))
        if self.config.passes.offload:
            stopwatch.time("offload", lambda: offload_blobs(fw, bw, num_fwd_outputs, static_indices))
        record.attach_code(before=code_before, after=(fw.code, bw.code))
        final = find_saved(fw, bw, num_fwd_outputs, static_indices)
        record.attach_views(
            forward=graph_view(fw),
            backward=graph_view(bw),
            baseline_timeline=baseline_timeline,
            timeline=saved_bytes_timeline(fw, bw, final),
        )
        record.passes = tuple(runs)
        record.pass_seconds = time.perf_counter() - started
        self.on_record(record)
        return fw, bw
