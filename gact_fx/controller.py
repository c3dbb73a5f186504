"""Adaptive bits at run time: sensitivities, the bit allocation, and when to re-measure.

One ``GactController`` per backend. Every compiled training graph becomes a ``Region``
whose float activations were compiled with run-time bits; the controller sets their
widths on their sites (``runtime.registry``) and changes them without recompiling.

Sensitivity probe (GACT's estimator, without a closure from the user): on a probe step
the region's forward also keeps exact copies of a few tensors (at most
``probe_tensors``, in rotation), and their blobs carry a token that names that call.
When the backward reaches the region, a hook that receives the real output gradients
re-runs the region's compiled backward (``torch.autograd.grad(..., retain_graph=True)``):
once with those tensors exact, then per tensor with only it quantized at ``probe_bits``
bits. Each difference gives ``C_l = ||g_l - g_exact||^2 / S(b)``, GACT's definition
(``E||g(s) - g(s')||^2 = 2 C_l S(b)`` for two seeds is twice the same thing). The squared
norm is GACT's, or with ``gradient_metric='relative'`` each parameter's part weighed by
its element count over its squared gradient norm (``error_weights``). A float
tensor goes to 1 bit only if it was measured at 1 bit (``probe_bits=1``): extrapolated
from 2 bits the variance model underestimates 1-bit noise badly, and even measured one
tensor at a time, many tensors at 1 bit together were 3x noisier than uniform 2 bits
on a character LM. No tensor goes below the floor of its use in the backward
(``passes.uses``). The step's own backward then uses the exact copies, so a probe step
trains uncompressed for those tensors.

When (``schedule``): every step until each tensor has been measured once, then after an
interval that starts at ``adapt_interval / 64`` forward calls of the graph and doubles
up to ``adapt_interval`` (a block compiled once and called N times per step counts N),
and again at once when the norm of the graph's gradients jumps. After each probe the
bits are re-solved (``allocation.solve``) under the average-bits budget, which holds
per compiled graph (``AdaptiveConfig.budget``: over the code bits, or over every byte
held). One probe per graph is in flight at a time: a graph called again before its
probe's backward has run simply runs compressed, and a probe whose outputs are dropped
without a backward ends when autograd frees its graph.
"""

from __future__ import annotations

import logging
import math
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch.autograd.graph import GradientEdge

from . import _compat
from .allocation import AllocationProblem, quantization_variance, solve
from .config import AdaptiveConfig
from .runtime.probe import fresh_key, stashing
from .runtime.registry import Site
from .schedule import GradientMonitor, ProbeSchedule, read_floats

log = logging.getLogger("gact_fx")

MAX_FAILED_PROBES = 3  # probes that found no gradient before a graph stops trying


@dataclass
class TrackedTensor:
    """A run-time-bits tensor of a region: its site holds the width in force."""

    site: Site
    name: str
    numel: int
    itemsize: int
    floor: int = 1  # the fewest bits its use in the backward allows (``passes.uses``)
    sensitivity: float | None = None  # C_l, measured at ``probe_bits``
    carried_numel: int = 0  # elements rebuilt from it in the backward (``passes.affine``): budget it frees
    overhead_bytes: int = 0  # its blob's bytes beyond the codes below full precision: scales, minimums, key, tag

    def held_bytes(self, bits: int) -> float:
        """What its blob holds at ``bits``, to within the codes' padding to 8 bytes."""
        if bits >= 8 * self.itemsize:
            return self.numel * self.itemsize
        return self.numel * bits / 8 + self.overhead_bytes

    @property
    def slot(self) -> int:
        return self.site.slot

    @property
    def bits(self) -> int:
        return self.site.runtime_bits()

    @bits.setter
    def bits(self, bits: int) -> None:
        self.site.bits = bits


@dataclass
class _Probe:
    targets: list[TrackedTensor]
    wrt: list[torch.Tensor]  # what the probe differentiates with respect to
    measured: bool = False


class _Sentinel:
    """An object whose death tells that a probe's hooks, and so its graph, were freed."""


@dataclass
class Region:
    """The run-time-bits tensors of one compiled graph, and its probe schedule."""

    index: int
    tensors: list[TrackedTensor]
    schedule: ProbeSchedule
    monitor: GradientMonitor = field(default_factory=GradientMonitor)
    calls: int = 0
    next_probe: int = 0  # rotation pointer into ``tensors``
    adaptations: int = 0
    failed_probes: int = 0
    backward_type_known: bool = False
    in_flight: _Probe | None = None  # the probe whose backward has not run yet
    infeasible_logged: bool = False  # warned that ``budget='bytes'`` is out of reach
    baseline_bytes: int = 0  # the activations the graph saved without gact
    fixed_bytes: int = 0  # what its other saved activations hold: masks, fixed widths, tensors kept as they are

    def held_bytes(self) -> float:
        """The activations it holds at the widths in force."""
        return self.fixed_bytes + sum(t.held_bytes(t.bits) for t in self.tensors)

    @property
    def fully_measured(self) -> bool:
        return all(t.sensitivity is not None for t in self.tensors)

    @property
    def probe_at_call(self) -> int:
        """Once fully measured, the call that probes next."""
        return self.schedule.next_call


class GactController:
    def __init__(self, settings: AdaptiveConfig) -> None:
        self.settings = settings
        self.regions: dict[int, Region] = {}
        self._pending_state: dict | None = None
        self._measuring = False

    # -- registration --------------------------------------------------------------------

    def add_region(self, index: int, tensors: Sequence[TrackedTensor], *, baseline_bytes: int = 0,
                   fixed_bytes: int = 0) -> Region:
        """``baseline_bytes``: the activations the graph saved without gact; ``fixed_bytes``: what
        its saved activations other than ``tensors`` hold (both for ``budget='bytes'``)."""
        region = Region(index, list(tensors), ProbeSchedule(self.settings.adapt_interval),
                        baseline_bytes=baseline_bytes, fixed_bytes=fixed_bytes)
        self.regions[index] = region
        if self._pending_state is not None:
            self._apply_state(region, self._pending_state)
        return region

    def wrap(self, region: Region, compiled_forward: Callable) -> Callable:
        """The compiled forward, counting calls and probing when it is time."""

        # Not functools.wraps: the ``_torchdynamo_*`` attributes it would copy (torch 2.9 puts
        # them on the compiled function) make Dynamo call the function they point to, past
        # this wrapper, and the controller would never see a call.
        def forward(*args):
            region.calls += 1
            training = torch.is_grad_enabled()
            if training:
                self._check_gradient_norm(region)
            if not (training and self._probe_due(region)):
                outputs = compiled_forward(*args)
            else:
                outputs = self._probe_step(region, compiled_forward, args)
            if training:
                self._watch_gradient(region, outputs)
            return outputs

        forward.__name__ = getattr(compiled_forward, "__name__", "forward")
        forward.__wrapped__ = compiled_forward
        for name, value in getattr(compiled_forward, "__dict__", {}).items():  # ``_boxed_call`` among them
            if not name.startswith("_torchdynamo"):
                setattr(forward, name, value)
        return forward

    def _watch_gradient(self, region: Region, outputs) -> None:
        """Note the norm of the gradients this call's backward computes (not the probe's re-runs)."""
        node = _compiled_node_of(_differentiable(outputs))
        if node is None:
            return
        if not region.backward_type_known:
            _compat.allow_backward_rerun(node)  # compiled without donated buffers: the probe re-runs it
            region.backward_type_known = True

        def note(grad_inputs, grad_outputs):
            if not self._measuring:
                region.monitor.note(grad_inputs)

        node.register_hook(note)

    def _check_gradient_norm(self, region: Region) -> None:
        ratio = region.monitor.jumped()
        if ratio is not None and region.fully_measured and region.in_flight is None:
            region.schedule.restart(region.calls)
            log.info("gact: the gradient norm of graph %d jumped %.3gx at call %d: measuring its sensitivities again",
                     region.index, ratio, region.calls)

    # -- views ---------------------------------------------------------------------------

    def tensors(self) -> list[TrackedTensor]:
        return [t for region in self.regions.values() for t in region.tensors]

    def bits(self) -> dict[str, int]:
        return {t.name: t.bits for t in self.tensors()}

    def sensitivities(self) -> dict[str, float | None]:
        return {t.name: t.sensitivity for t in self.tensors()}

    @property
    def adapt_interval(self) -> int:
        return self.settings.adapt_interval

    def average_bits(self, region: Region | None = None) -> float:
        tensors = region.tensors if region else self.tensors()
        total = sum(t.numel for t in tensors)
        return sum(t.bits * t.numel for t in tensors) / total if total else 0.0

    # -- probing -------------------------------------------------------------------------

    def _probe_due(self, region: Region) -> bool:
        if not region.tensors or region.in_flight is not None:
            return False
        if not region.fully_measured:
            return region.failed_probes < MAX_FAILED_PROBES
        return region.schedule.due(region.calls)

    def _probe_targets(self, region: Region) -> list[TrackedTensor]:
        unmeasured = [t for t in region.tensors if t.sensitivity is None]
        pool = unmeasured or region.tensors
        count = min(self.settings.probe_tensors, len(pool))
        start = 0 if unmeasured else region.next_probe % len(pool)
        chosen = [pool[(start + k) % len(pool)] for k in range(count)]
        if not unmeasured:
            region.next_probe = start + count
        return chosen

    def _probe_step(self, region: Region, compiled_forward: Callable, args) -> object:
        targets = self._probe_targets(region)
        slots = frozenset(t.slot for t in targets)
        wrt = _gradient_targets(args)
        with stashing(slots):
            outputs = compiled_forward(*args)
        node = _compiled_node_of(_differentiable(outputs)) if wrt else None
        if node is None:
            _release(targets)
            self._probe_failed(region)
            return outputs
        probe = _Probe(targets, wrt)
        region.in_flight = probe
        if region.fully_measured:
            region.schedule.probed(region.calls)
        self._hook_probe(region, probe, targets, node)
        return outputs

    def _hook_probe(self, region: Region, probe: _Probe, targets: list[TrackedTensor], node) -> None:
        """Measure when the backward reaches the graph's autograd node; end after it ran.

        The hooks hold no tensor of the graph and only a weak reference to the node: if
        the outputs are dropped without a backward, the graph is freed, the hooks with it,
        and the probe ends then (``weakref.finalize`` on an object only the hook holds).
        """
        node_ref = weakref.ref(node)
        alive = _Sentinel()
        weakref.finalize(alive, self._end_probe, region, probe)

        def before_backward(grad_outputs, alive=alive):
            if self._measuring or region.in_flight is not probe or probe.measured:
                return None  # inside another graph's probe (this one measures in the real backward)
            edges = [GradientEdge(node_ref(), i) for i, g in enumerate(grad_outputs) if g is not None]
            grads = [g for g in grad_outputs if g is not None]
            try:
                probe.measured = self._measure(region, targets, edges, grads, probe.wrt)
            except Exception:
                self._end_probe(region, probe)
                raise
            if not probe.measured:
                self._probe_failed(region)
                self._end_probe(region, probe)
            return None

        def after_backward(grad_inputs, grad_outputs):
            if probe.measured and not self._measuring:
                self._end_probe(region, probe)

        node.register_prehook(before_backward)
        node.register_hook(after_backward)

    @staticmethod
    def _end_probe(region: Region, probe: _Probe) -> None:
        if region.in_flight is probe:
            _release(probe.targets)
            region.in_flight = None
        probe.wrt = []

    def _probe_failed(self, region: Region) -> None:
        region.failed_probes += 1
        if region.failed_probes == MAX_FAILED_PROBES and not region.fully_measured:
            log.warning(
                "gact: graph %d's probe found no gradient to measure %d times (its outputs get no "
                "gradient, or it has no trainable inputs); its tensors keep %s bits",
                region.index, MAX_FAILED_PROBES, sorted({t.bits for t in region.tensors}),
            )

    def _measure(self, region, targets, outs: list[GradientEdge], grads: list[torch.Tensor], wrt) -> bool:
        """Measure the targets' sensitivities; False when no output received a gradient."""
        if not outs or not all(t.site.probe.kept for t in targets):
            return False

        def gradient() -> list[torch.Tensor | None]:
            with torch.enable_grad():
                result = torch.autograd.grad(outs, wrt, grads, retain_graph=True, allow_unused=True)
            # None: no parameter depends on the tensors, whose error there is rightly zero.
            return [None if r is None else r.detach().float() for r in result]

        bits = self.settings.probe_bits
        for target in targets:
            target.site.probe.exact()
        self._measuring = True
        try:
            exact = gradient()
            weights = error_weights(exact, self.settings.gradient_metric)
            for target in targets:
                target.site.probe.requantized(bits, fresh_key(target.site.registry.new_token(), target.site.index))
                squared = weighted_error(gradient(), exact, weights)
                target.site.probe.exact()  # the step's own backward then uses exact values
                target.sensitivity = squared / quantization_variance(bits) if math.isfinite(squared) else math.inf
        finally:
            self._measuring = False
        if region.fully_measured:
            if region.adaptations == 0:
                region.schedule.probed(region.calls)
            self._allocate(region)
        return True

    def _allocate(self, region: Region) -> None:
        adaptive = region.tensors
        problem = AllocationProblem(
            tuple(t.sensitivity for t in adaptive),
            tuple(t.numel for t in adaptive),
            self._budget(region),
            full_bits=tuple(8 * t.itemsize for t in adaptive),
            floors=tuple(t.floor for t in adaptive),
            one_bit=tuple(t.sensitivity if self.settings.probe_bits == 1 else None for t in adaptive),
        )
        for tensor, bits in zip(adaptive, solve(problem)):
            tensor.bits = bits
        region.adaptations += 1
        histogram = {b: sum(1 for t in adaptive if t.bits == b) for b in sorted({t.bits for t in adaptive})}
        held = region.held_bytes()
        log.info(
            "gact adapted graph %d at call %d: %d tensors, %.2f average bits (avg_bits %.2f counting %s), "
            "activations %.3gx fewer bytes, predicted gradient variance %.3g, bits %s",
            region.index, region.calls, len(adaptive), self.average_bits(region), self.settings.avg_bits,
            self.settings.budget, region.baseline_bytes / held if held and region.baseline_bytes else math.nan,
            problem.variance([t.bits for t in adaptive]), histogram,
        )
        if self.settings.budget == "bytes" and not region.infeasible_logged:
            allowed = self._allowed_bytes(region)
            if held > 1.001 * allowed:
                region.infeasible_logged = True
                log.warning(
                    "gact: graph %d holds %.3gx fewer activation bytes, short of avg_bits=%.2f's %.3gx: its floors "
                    "and the tensors it holds at fixed widths alone take more",
                    region.index, region.baseline_bytes / held, self.settings.avg_bits, region.baseline_bytes / allowed,
                )

    def _budget(self, region: Region) -> float:
        """The solver's budget for the region's tensors, in code bits."""
        if self.settings.budget == "bytes":
            spare = self._allowed_bytes(region) - region.fixed_bytes - sum(t.overhead_bytes for t in region.tensors)
            return 8 * spare
        return self._codes_budget(region.tensors)

    def _allowed_bytes(self, region: Region) -> float:
        """``budget='bytes'``: the graph's saved activations at ``avg_bits`` per full-precision
        element, the element's width read from the tensors the solver sets."""
        elements = sum(t.numel for t in region.tensors)
        full_bits = 8 * sum(t.numel * t.itemsize for t in region.tensors) / elements if elements else 32
        return region.baseline_bytes * self.settings.avg_bits / full_bits

    def _codes_budget(self, adaptive: Sequence[TrackedTensor]) -> float:
        """Bits for the region's tensors: ``avg_bits`` per element of those free to move,
        the elements the backward rebuilds from them included (``passes.affine``: no longer
        stored, so the tensor that carries them may take more bits), plus each floored
        tensor at its floor. Floors are what a use in the backward requires whatever the
        budget; they cost bytes beyond it (reported), instead of leaving the solver a
        budget the floors alone exceed."""
        bits = 0.0
        for tensor in adaptive:
            if tensor.floor > 1:
                bits += tensor.floor * tensor.numel + self.settings.avg_bits * tensor.carried_numel
            else:
                bits += self.settings.avg_bits * (tensor.numel + tensor.carried_numel)
        return bits

    # -- checkpointing -------------------------------------------------------------------

    def state_dict(self) -> dict:
        return {
            "version": 2,
            "regions": {
                region.index: {
                    "calls": region.calls,
                    "next_probe": region.next_probe,
                    "schedule": region.schedule.state_dict(),
                    "adaptations": region.adaptations,
                    "tensors": {t.name: {"bits": t.bits, "sensitivity": t.sensitivity} for t in region.tensors},
                }
                for region in self.regions.values()
            },
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore bits, sensitivities and the schedule; regions compiled later get theirs then.
        Reads version 1 (before the growing schedule) too."""
        if state.get("version") not in (1, 2):
            raise ValueError(f"unknown gact controller state version {state.get('version')!r}")
        self._pending_state = state
        for region in self.regions.values():
            self._apply_state(region, state)

    def _apply_state(self, region: Region, state: dict) -> None:
        saved = state["regions"].get(region.index) or state["regions"].get(str(region.index))
        if saved is None:
            return
        by_name = saved["tensors"]
        for tensor in region.tensors:
            if tensor.name in by_name:
                tensor.bits = max(by_name[tensor.name]["bits"], tensor.floor)
                tensor.sensitivity = by_name[tensor.name]["sensitivity"]
        region.calls = saved["calls"]
        region.next_probe = saved["next_probe"]
        if "schedule" in saved:
            region.schedule.load_state_dict(saved["schedule"])
        else:  # version 1
            region.schedule.next_call = saved.get("probe_at_call", region.calls + 1)
            region.schedule.interval = self.settings.adapt_interval
        region.adaptations = saved["adaptations"]


def error_weights(exact: Sequence[torch.Tensor | None], metric: str) -> list[float]:
    """What one squared unit of gradient error weighs, per parameter.

    'absolute': 1 (GACT's total squared error, what plain SGD's step carries).
    'relative': the parameter's element count over its squared gradient norm, normalised
    to sum 1 over elements. An Adam-type optimiser divides each gradient element by its
    running RMS, whose mean over a parameter one batch's squared gradient norm per
    element estimates, so this is the error its update carries. Under 'absolute' the
    parameters with large gradients (embedding, output layer) drown the rest: on a
    Llama at L2.2 the MLP weights of layers 1-3 had 78-148% gradient error against 42% overall.
    """
    if metric == "absolute":
        return [1.0] * len(exact)
    norms = _floats([None if g is None else g.square().sum() for g in exact])
    counts = [0 if g is None else g.numel() for g in exact]
    usable = [n is not None and n > 0 and math.isfinite(n) for n in norms]
    total = sum(c for c, ok in zip(counts, usable) if ok) or 1
    # a parameter with no gradient this batch weighs nothing: there is no scale to compare with
    return [c / (n * total) if ok else 0.0 for c, n, ok in zip(counts, norms, usable)]


def weighted_error(gradient: Sequence[torch.Tensor | None], exact: Sequence[torch.Tensor | None],
                   weights: Sequence[float]) -> float:
    """``sum_p w_p ||gradient_p - exact_p||^2`` over the parameters that have a gradient."""
    squares = [None if g is None or w == 0.0 else (g if e is None else g - e).square().sum()
               for g, e, w in zip(gradient, exact, weights)]
    return math.fsum(w * s for w, s in zip(weights, _floats(squares)) if s is not None)


def _floats(values: Sequence[torch.Tensor | None]) -> list[float | None]:
    """``read_floats`` keeping the places of the Nones."""
    read = iter(read_floats([v for v in values if v is not None]))
    return [None if v is None else next(read) for v in values]


def _release(targets: Sequence[TrackedTensor]) -> None:
    for target in targets:
        target.site.release_probe()


def _gradient_targets(args) -> list[torch.Tensor]:
    """What the probe differentiates: the graph's parameters, else its inputs that need grad."""
    needing = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    parameters = [a for a in needing if isinstance(a, torch.nn.Parameter)]
    return parameters or needing


def _compiled_node_of(outputs: list[torch.Tensor]):
    """The AOTAutograd node that produced ``outputs`` (through view nodes), or None."""
    if not outputs:
        return None
    node = outputs[0].grad_fn
    seen = set()
    while node is not None and not _compat.is_compiled_node(node) and node not in seen:
        seen.add(node)
        parents = [n for n, _ in node.next_functions if n is not None]
        node = parents[0] if len(parents) == 1 else None
    return node


def _differentiable(outputs) -> list[torch.Tensor]:
    flat = outputs if isinstance(outputs, (list, tuple)) else [outputs]
    return [o for o in flat if isinstance(o, torch.Tensor) and o.grad_fn is not None]
