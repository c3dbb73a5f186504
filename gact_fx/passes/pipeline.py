"""gact's passes over the saved section, in the order they run, and the record each leaves.

The stock partitioner splits the joint graph; then each pass here edits the forward and
backward graphs where it finds something to do (``run`` answers whether it changed
them), and the context finds the saved section again after a pass that did. Passes talk
to later ones only through the graphs and ``meta["gact"]``. Each run leaves a
``PassRun``: its name, its time, whether it changed the graphs and the full-precision
bytes saved for the backward before and after it (the report and the viewer list them).

Planning and rewriting (``passes.plan``, ``passes.rewrite``) come after these, once the
saved section holds what will be stored; ``Stopwatch`` records them the same way.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch.fx as fx

from .affine import recompute_affine, recompute_projections
from .attention import recompute_attention_outputs
from .derivatives import COARSE_BITS, hoist_derivatives
from .hoist import hoist_comparisons, hoist_exponentials
from .plan import activation_nbytes
from .saved import SavedGraph, find_saved, static_placeholders
from .selects import rebuild_selects

BELOW_FULL_PRECISION = 31  # ``at_most`` this: every width below 32 bits, the lossy ones

if TYPE_CHECKING:  # the passes read the config's switches; they do not import it
    from ..config import PassesConfig


@dataclass(frozen=True)
class PassRun:
    name: str
    seconds: float
    changed: bool
    bytes_before: int | None = None  # full-precision bytes saved for the backward (passes over the section)
    bytes_after: int | None = None

    def describe(self) -> str:
        took = f"{self.seconds * 1e3:.1f} ms"
        if self.bytes_before is None:  # a stage, which always runs
            return f"{self.name} ({took})"
        change = "changed" if self.changed else "no change"
        if self.bytes_before != self.bytes_after:
            change += f", saved {self.bytes_before / 1024:.1f} -> {self.bytes_after / 1024:.1f} KiB"
        return f"{self.name} ({took}, {change})"


@dataclass
class PassContext:
    """The graphs the passes edit and their saved section, found again after each change."""

    fw: fx.GraphModule
    bw: fx.GraphModule
    num_fwd_outputs: int
    static_indices: Sequence[int]
    saved: SavedGraph
    # The bits the plan would store each saved float value at, by position, for the
    # current section (``overridden=False``: less those whose bits an override sets).
    planned_bits: Callable[[SavedGraph, bool], dict[int, int]]

    def lossy(self, overridden: bool = True) -> set[int]:
        """Positions of the saved values the plan would store below full precision."""
        return at_most(self.planned_bits(self.saved, overridden), BELOW_FULL_PRECISION)

    def refresh(self) -> None:
        self.saved = find_saved(self.fw, self.bw, self.num_fwd_outputs, self.static_indices)


@dataclass(frozen=True)
class GraphPass:
    name: str
    enabled: Callable[[PassesConfig], bool]
    run: Callable[[PassContext], bool]  # whether it changed the graphs


def at_most(bits: dict[int, int], limit: int) -> set[int]:
    """The positions of ``bits`` (``PassContext.planned_bits``) stored at ``limit`` bits or fewer."""
    return {position for position, width in bits.items() if width <= limit}


def _hoist_derivatives(ctx: PassContext) -> int:
    bits = ctx.planned_bits(ctx.saved, True)  # one dry-run plan for both sets
    return hoist_derivatives(ctx.fw, ctx.bw, ctx.saved, at_most(bits, BELOW_FULL_PRECISION),
                             coarse=at_most(bits, COARSE_BITS))


SECTION_PASSES = (
    GraphPass("rebuild selects", lambda switches: True,
              lambda ctx: rebuild_selects(ctx.fw, ctx.bw, ctx.saved, ctx.lossy())),
    GraphPass("hoist exponentials", lambda switches: True,
              lambda ctx: hoist_exponentials(ctx.fw, ctx.bw, ctx.saved, ctx.lossy())),
    GraphPass("hoist comparisons", lambda switches: True,
              lambda ctx: hoist_comparisons(ctx.fw, ctx.bw, ctx.saved, ctx.lossy())),
    GraphPass("hoist derivatives", lambda switches: switches.save_derivatives, _hoist_derivatives),
    GraphPass("recompute attention", lambda switches: switches.recompute_attention,
              lambda ctx: recompute_attention_outputs(ctx.fw, ctx.bw, ctx.saved, ctx.lossy())),
    # A tensor whose bits an override sets keeps them: it is not rebuilt from another.
    GraphPass("recompute affine", lambda switches: switches.recompute_affine,
              lambda ctx: recompute_affine(ctx.fw, ctx.bw, ctx.saved, ctx.lossy(overridden=False),
                                           static=static_placeholders(ctx.fw, ctx.static_indices))),
    GraphPass("recompute projections", lambda switches: switches.recompute_projections,
              lambda ctx: recompute_projections(ctx.fw, ctx.bw, ctx.saved, ctx.planned_bits(ctx.saved, True),
                                                ctx.lossy(overridden=False),
                                                static=static_placeholders(ctx.fw, ctx.static_indices))),
)


def run_section_passes(ctx: PassContext, switches: PassesConfig, passes=SECTION_PASSES) -> list[PassRun]:
    """Run each pass the switches enable once, in order."""
    runs = []
    for graph_pass in passes:
        if not graph_pass.enabled(switches):
            continue
        before, started = activation_nbytes(ctx.saved), time.perf_counter()
        changed = bool(graph_pass.run(ctx))
        if changed:
            ctx.refresh()
        runs.append(PassRun(graph_pass.name, time.perf_counter() - started, changed, before,
                            activation_nbytes(ctx.saved)))
    return runs


class Stopwatch:
    """Records the later stages (planning, rewriting, lowering) as ``PassRun``s."""

    def __init__(self, runs: list[PassRun]) -> None:
        self.runs = runs

    def time(self, name: str, stage: Callable[[], object]):
        started = time.perf_counter()
        result = stage()
        self.runs.append(PassRun(name, time.perf_counter() - started, True))
        return result
