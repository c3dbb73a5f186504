"""The model-rewrite API: ``compress(model, ...)`` and ``decompress(model)``.

``compress`` works in place, like ``nn.Module.compile()``: the same module object comes
back, so its parameters, ``state_dict()`` keys and any optimizer stay as they were. Its
call becomes a gate: in training with grad enabled it runs the gact-compiled forward;
in ``eval()`` or under ``no_grad``/``inference_mode`` it runs the plain forward (no
compression, no compile). ``model.gact`` holds the backend, its report and controller.

The first training step is checked: if torch.compile captured no training graph at
all, nothing would be compressed, so that is an error, or with ``fallback="hooks"`` the
model switches to GACT-style saved-tensor hooks (``hooks.py``); Dynamo graph breaks are
logged, since code between compiled graphs runs uncompressed.

A compressed module compiles itself. An outer ``torch.compile`` around it (the Hugging
Face Trainer's ``torch_compile=True``, Lightning's, the user's own) would otherwise trace
into it with its own backend and compress nothing: the call is a frame the outer compile
does not trace (``_compat.run_uncompiled``), so its graph breaks there and gact's compile
runs inside.
"""

from __future__ import annotations

import copy
import logging
import pathlib
import types
from collections import Counter

import torch

from . import _compat
from .config import GactConfig
from .controller import GactController
from .dynamo_backend import GactBackend, GactCompileError, backend_of
from .hooks import HookCompressor
from .report import Report
from .viz import render_dot, render_html, render_text

log = logging.getLogger("gact_fx")

FALLBACKS = ("error", "hooks")
ATTRIBUTE = "gact"


class GactHandle:
    """``model.gact``: how the model is compressed, and what it reports."""

    def __init__(self, model: torch.nn.Module, backend: GactBackend, fallback: str) -> None:
        self.backend = backend
        self.fallback = fallback
        self.mode = "pending"  # then "compiled", or "hooks" after a fallback
        self.hooks: HookCompressor | None = None
        self._model_name = type(model).__name__

    @property
    def config(self) -> GactConfig:
        return self.backend.config

    @property
    def controller(self) -> GactController | None:
        """The adaptive-bits controller (``None`` with uniform bits)."""
        return self.backend.controller

    def report(self) -> Report:
        """What was compressed: the compiled graphs, or in hooks mode the hooks' last step."""
        if self.mode == "pending":
            raise LookupError(f"{self._model_name} has not run a training step yet: run one first")
        if self.mode == "hooks":
            if self.hooks is None:
                return Report(note=f"compression is off (enabled=False): {self._model_name} runs its plain forward")
            return Report(hooks=self.hooks.last_step)
        return self.backend.report()

    def __repr__(self) -> str:
        return f"GactHandle(mode={self.mode!r}, {self.config!r})"


def _module_call(self, *args, **kwargs):
    """What gact compiles: a frame of this package, where Dynamo starts tracing and inlines
    the module's call. (Compiling ``Module._call_impl`` itself compiles nothing on torch 2.13
    for modules whose forward lives in torch, ``nn.Sequential`` among them: Dynamo skips
    torch's own files as the frame it starts from.) The module comes in as ``self``, so
    Dynamo names module paths as it does for ``torch.compile(model)``."""
    return _compat.plain_call(self)(*args, **kwargs)


def _own_module_call():
    """``_module_call`` with a code object of its own. Dynamo keeps its compiled entries, and
    counts recompiles against ``recompile_limit`` (8), per code object; with one shared by
    every compressed model, each new model's backend was a recompile of the same frame, and
    the ninth model compressed in a process compiled nothing."""
    return types.FunctionType(_module_call.__code__.replace(), _module_call.__globals__, _module_call.__name__)


class _GatedCall:
    """The module's call: gact-compiled when training with grad, the plain forward otherwise."""

    def __init__(self, model: torch.nn.Module, handle: GactHandle) -> None:
        self.plain = _compat.plain_call(model)
        self._compiled = torch.compile(_own_module_call(), backend=handle.backend)
        self._entry = _compat.run_uncompiled(self._call)  # (made here: it imports Dynamo)
        self.model, self.handle = model, handle

    def __call__(self, *args, **kwargs):
        return self._entry(*args, **kwargs)

    def compiled(self, *args, **kwargs):
        return self._compiled(self.model, *args, **kwargs)

    def _call(self, *args, **kwargs):
        if not (self.model.training and torch.is_grad_enabled()):
            return self.plain(*args, **kwargs)
        if self.handle.mode == "hooks":
            if self.handle.hooks is None:  # compression off (level L0): nothing to hook
                return self.plain(*args, **kwargs)
            with self.handle.hooks.active():
                return self.plain(*args, **kwargs)
        if self.handle.mode == "compiled":
            return self.compiled(*args, **kwargs)
        breaks_before = Counter(_compat.graph_break_counts())
        output = self.compiled(*args, **kwargs)
        self._check_first_step(breaks_before)
        return output

    def _check_first_step(self, breaks_before: Counter) -> None:
        handle = self.handle
        breaks = Counter(_compat.graph_break_counts()) - breaks_before
        if breaks:
            reasons = "; ".join(f"{reason.splitlines()[0]} (x{count})" for reason, count in breaks.most_common(3))
            log.warning(
                "gact: %d graph break(s) in %s; activations of the code between compiled graphs are not "
                "compressed. Reasons: %s", sum(breaks.values()), handle._model_name, reasons,
            )
        if handle.backend.records:
            handle.mode = "compiled"
        elif handle.fallback == "hooks":
            self._fall_back_to_hooks()
        else:
            raise self._nothing_compiled_error()

    def _fall_back_to_hooks(self) -> None:
        handle, config = self.handle, self.handle.config
        handle.mode = "hooks"
        if not config.enabled:
            log.warning("gact: torch.compile captured no training graph of %s; compression is off, so it "
                        "runs the plain forward (fallback='hooks')", handle._model_name)
            return
        handle.hooks = HookCompressor(
            self.model, registry=handle.backend.registry, bits=config.initial_bits, group_size=config.core.group_size,
            min_numel=config.core.min_numel, feature_groups=config.core.feature_groups, rotation=config.core.rotation,
            dithered=config.core.rounding == "dithered", nonlinear_bits=config.core.nonlinear_bits,
            save_derivatives=config.passes.save_derivatives,
        )
        log.warning(
            "gact: torch.compile captured no training graph of %s, so this step ran uncompressed; "
            "from the next step activations are compressed through saved-tensor hooks at %d bits "
            "(fallback='hooks')%s", handle._model_name, config.initial_bits,
            "; adaptive bits need the compiled path, so every tensor gets the same width" if config.is_adaptive else "",
        )

    def _nothing_compiled_error(self) -> GactCompileError:
        hint = ""
        if _compat.inside_ddp_forward():
            hint = (" Under DistributedDataParallel, torch 2.13 compiles no module compiled in place (neither "
                    "compress() nor nn.Module.compile()): use DDP(torch.compile(model, backend=gact_fx.backend(...))).")
        return GactCompileError(
            f"torch.compile captured no training graph of {self.handle._model_name}, so nothing would be "
            "compressed. Make the forward traceable, or pass fallback='hooks' to compress through "
            "saved-tensor hooks instead." + hint
        )


def compress(model: torch.nn.Module, level: str | None = None, *, fallback: str = "error", **options) -> torch.nn.Module:
    """Make ``model`` train with compressed activations; returns the same module.

    ``level`` is one of GACT's (``gact_fx.LEVELS``); ``options`` are those of the backend
    (``bits``, ``avg_bits``, ``group_size``, ...). ``fallback``: 'error' (default) or 'hooks'.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"compress() takes an nn.Module, got {type(model).__name__}")
    if fallback not in FALLBACKS:
        raise ValueError(f"fallback must be one of {FALLBACKS}, got {fallback!r}")
    if hasattr(model, ATTRIBUTE):
        raise ValueError(f"{type(model).__name__} already has a '{ATTRIBUTE}' attribute: compressed twice?")
    config = GactConfig.from_options({**options, **({"level": level} if level is not None else {})})
    handle = GactHandle(model, GactBackend(config), fallback)
    _compat.set_compiled_call(model, _GatedCall(model, handle))
    setattr(model, ATTRIBUTE, handle)
    return model


def decompress(model: torch.nn.Module) -> torch.nn.Module:
    """Undo ``compress``: the plain module again (same object, same parameters)."""
    if not isinstance(getattr(model, ATTRIBUTE, None), GactHandle):
        raise ValueError(f"{type(model).__name__} was not compressed by gact_fx.compress()")
    _compat.set_compiled_call(model, None)
    delattr(model, ATTRIBUTE)
    return model


FORMATS = ("html", "dot", "text")


def _backend_of(target) -> GactBackend:
    if isinstance(target, GactBackend):
        return target
    handle = getattr(_user_module(target), ATTRIBUTE, None)
    if isinstance(handle, GactHandle):
        return handle.backend
    return backend_of(target)


def _user_module(model):
    """The user's module behind what ``torch.compile`` returned (or ``model`` itself)."""
    compiled = _compat.compiled_with(model)
    return compiled[0] if compiled is not None else model


def _is_gact(backend) -> bool:
    from .dynamo_backend import gact_entry_point

    return isinstance(backend, GactBackend) or backend is gact_entry_point


def report(model) -> Report:
    """What gact did to ``model``: a module given to ``compress()`` or to ``torch.compile(...,
    backend=gact)`` (the compiled module or the original), after a training step.

    If the model trained without anything compressed (torch.compile captured no training
    graph of it), the report says so and why, instead of raising."""
    handle = getattr(_user_module(model), ATTRIBUTE, None)
    if isinstance(handle, GactHandle):
        return handle.report()
    try:
        return backend_of(model).report()
    except LookupError:
        compiled = _compat.compiled_with(model)
        if compiled is None or not _is_gact(compiled[1]):
            raise
    breaks = Counter(_compat.graph_break_counts())
    reasons = "; ".join(f"{reason.splitlines()[0]} (x{count})" for reason, count in breaks.most_common(3))
    return Report(note=(
        f"nothing compressed: torch.compile captured no training graph of {type(compiled[0]).__name__}, so it "
        "trained uncompressed (a step in eval() or under no_grad captures none either). "
        + (f"Dynamo's graph breaks so far: {reasons}" if reasons else "Dynamo reported no graph break.")
    ))


def _default_loss(output) -> torch.Tensor:
    leaves = [t for t in _compat.tree_leaves(output) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    return sum(t.float().sum() for t in leaves)


def visualize(target, *example_inputs, path=None, format: str | None = None, title: str | None = None, loss=None, **options) -> str:
    """Render what gact does to a model as HTML, DOT or text; returns it, writes ``path`` if given.

    ``target`` is a module that already ran a training step with gact (``compress`` or
    ``torch.compile(backend=gact)``), a ``GactBackend``, or, with ``example_inputs``, a plain
    module: a copy of it is compiled with ``options`` and runs one step (``loss(output)``,
    by default the sum of the outputs). ``format`` defaults from ``path``'s suffix.
    """
    path = pathlib.Path(path) if path is not None else None
    if format is None:
        format = {".html": "html", ".htm": "html", ".dot": "dot", ".gv": "dot"}.get(path.suffix.lower() if path else "", "text")
    if format not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {format!r}")
    if example_inputs:
        if not isinstance(target, torch.nn.Module):
            raise TypeError("example inputs go with an nn.Module to compile and run")
        backend = GactBackend(GactConfig.from_options(options))
        model = copy.deepcopy(target)
        (loss or _default_loss)(torch.compile(model, backend=backend)(*example_inputs)).backward()
    else:
        if options:
            raise ValueError("options only apply when visualize() compiles the model (give example inputs)")
        backend = _backend_of(target)
    report = backend.report()
    if not report.records:
        raise LookupError("no training graph was compiled: run a training step first (or give example inputs)")
    if format == "html":
        sensitivities = {t.slot: t.sensitivity for t in backend.controller.tensors()} if backend.controller else {}
        name = type(_user_module(target)).__name__ if isinstance(target, torch.nn.Module) else "model"
        text = render_html(report, title=title or f"gact-fx: {name}", sensitivities=sensitivities)
    elif format == "dot":
        text = render_dot(report)
    else:
        text = render_text(report)
    if path is not None:
        path.write_text(text, encoding="utf-8")
        log.info("gact: wrote %s (%d bytes)", path, len(text))
    return text
