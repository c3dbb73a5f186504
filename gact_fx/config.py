"""gact's options, one frozen dataclass per concern, and GACT's levels as constructors.

``GactConfig`` holds four sections: ``core`` (what is stored, at how many bits),
``adaptive`` (the bits chosen from measured sensitivity), ``passes`` (the graph
rewrites around compression) and ``compile`` (how the graphs are compiled). The planner
takes ``core`` and the controller ``adaptive``. Users pass flat names
(``torch.compile(..., options={...})``, ``gact_fx.backend(...)``, ``gact_fx.compress(...)``)
and ``GactConfig.from_options`` routes each to its section; a wrong name or value is a
``ValueError`` that says what is allowed: at once from ``gact_fx.backend`` and
``gact_fx.compress``, and when Dynamo first calls the backend for ``torch.compile``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from . import _compat
from .runtime import format as fmt
from .runtime.rotation import check_block as check_rotation_block

COMPILERS = ("auto", "inductor", "eager")
LOWERINGS = ("auto", "op", "aten", "triton")
ROUNDINGS = ("stochastic", "dithered")
PARTITIONERS = ("min_cut", "default")
GRADIENT_METRICS = ("relative", "absolute")
BUDGETS = ("codes", "bytes")


@dataclass(frozen=True, kw_only=True, slots=True)
class CoreConfig:
    """What is stored, and at how many bits."""

    enabled: bool = True
    """False compiles through the same path with no compression (the baseline)."""

    bits: int = 3
    """Uniform mode (``avg_bits`` unset): bits per element of every compressed
    floating-point activation: 1, 2, 3, 4, 8, or 32 (pass-through: stored as is). The
    default, 3 bits with dithered rounding and attention's value rebuilt, is the narrowest
    that trained the measured transformers about as close to fp32 as 4 bits (GACT's L1)
    did (docs/accuracy.md)."""

    group_size: int = 256
    """Elements sharing one fp32 min and scale: a multiple of 16 from 16 to 4096."""

    feature_groups: bool = True
    """Form each group from ``group_size`` tokens of one feature (the tensor's innermost
    dimension) instead of ``group_size`` contiguous elements, so that a feature with a
    wide range (the outlier features of a gated MLP's product) does not set the scale of
    its neighbours; the backward gets the tensor back in its own layout. ``False``:
    contiguous elements, which suit channels-first convolutions, whose innermost
    dimension is not a feature (docs/accuracy.md)."""

    rotation: int = 0
    """0 (off), or 16, 32, 64, 128 or 256: rotate each block of that many elements along a
    tensor's innermost dimension with a random-sign Hadamard before rounding, and back
    after decoding (``runtime.rotation``). Rounding stays unbiased; a group's range
    shrinks where a few features carry outliers, and grows a little where none do
    (docs/accuracy.md says on which models it paid). Same bytes. Tensors whose innermost
    dimension it does not divide are stored unrotated. Needs ``lowering='op'``."""

    nonlinear_rotation: int = 0
    """0 (off), or a block as ``rotation`` takes: rotate only the tensors the backward
    reads through an exponential (attention's query and key, ``passes.uses``) with a
    random-sign Hadamard of that block along their innermost dimension (a head's) before
    rounding, and back after decoding. Where a few of a head's dimensions carry its
    range, the rounding step shrinks, and with it the noise in the logits
    (docs/accuracy.md). Same bytes; tensors whose innermost dimension the block does not
    divide stay unrotated; ``rotation``, where set, applies instead. Needs
    ``lowering='op'``."""

    rounding: str = "dithered"
    """How a float value becomes a code and comes back, unbiased either way:
    ``"dithered"`` (subtractive dither) rounds up or down at random and subtracts the same
    noise again when it decodes, which halves the variance the rounding adds
    (``runtime.format``) for 8 more bytes a tensor and a decoder that draws the noise
    again (docs/accuracy.md); ``"stochastic"`` decodes the same codes plainly, which keeps
    a group's smallest and largest values exact (a saturated tanh's outputs) where
    dithering moves every value by up to half a step, and is what ``lowering='aten'``
    needs."""

    min_numel: int = 4096
    """Saved tensors with fewer elements stay in full precision (too small to matter)."""

    nonlinear_bits: int = 8
    """At least this many bits for saved tensors the backward consumes through an
    exponential or a singularity (``passes.uses``: attention's query, key and
    logsumexp, a log-softmax output), whose rounding noise would otherwise bias the
    gradient; 32 keeps them exact, 1 lifts the floor. Per-tensor ``overrides`` win."""

    exact_statistics: bool = True
    """Keep the row statistics a norm saves (LayerNorm's mean and reciprocal standard
    deviation, RMSNorm's ``rsqrt``: the result of a reduction over at least 16 elements
    each, and what is computed from it elementwise; a fused attention's logsumexp, where
    ``recompute_attention`` is off) in full precision (``passes.statistics``). The
    backward reads them nonlinearly, and they hold a row's length fewer elements than
    the activation they summarise. False rounds them like any other tensor. The
    saved-tensor hooks of ``compress(..., fallback="hooks")`` see no producers and round
    the norms' statistics (not attention's logsumexp)."""

    overrides: tuple[tuple[str, int], ...] = ()
    """Per-tensor bits: ``{pattern: bits}`` (given as a dict), fnmatch patterns over tensor
    names such as ``"*LayerNorm*"``; the first match wins. Pinned tensors are outside
    the adaptive budget."""

    compress_inputs: bool = True
    """Also compress saved non-parameter graph inputs: the activations that cross a
    graph break into this graph."""

    compress_outputs: bool = True
    """Also compress the model outputs the backward saves (transformers' KV caches, the
    logits): the caller still gets them in full precision, and a caller that keeps only
    the loss drops them, leaving the backward's compressed copy. A caller that keeps its
    outputs pays ``(bits + 0.125) / 32`` of them extra."""

    def __post_init__(self) -> None:
        for name in ("enabled", "feature_groups", "exact_statistics", "compress_inputs", "compress_outputs"):
            _check_type(name, getattr(self, name), bool)
        for name in ("bits", "group_size", "min_numel", "nonlinear_bits", "rotation", "nonlinear_rotation"):
            _check_type(name, getattr(self, name), int)
        check_rotation_block(self.rotation)
        check_rotation_block(self.nonlinear_rotation, "nonlinear_rotation")
        if self.rounding not in ROUNDINGS:
            raise ValueError(f"rounding must be one of {ROUNDINGS}, got {self.rounding!r}")
        fmt.check_bits(self.bits)
        if self.nonlinear_bits not in fmt.SUPPORTED_BITS:
            raise ValueError(f"nonlinear_bits must be one of {fmt.SUPPORTED_BITS}, got {self.nonlinear_bits!r}")
        overrides = self.overrides.items() if isinstance(self.overrides, Mapping) else self.overrides
        try:
            overrides = tuple((str(pattern), bits) for pattern, bits in overrides)
        except (TypeError, ValueError):
            raise ValueError(f"overrides must map name patterns to bits, got {self.overrides!r}") from None
        for pattern, bits in overrides:
            _check_type(f"overrides[{pattern!r}]", bits, int)
            fmt.check_bits(bits)
        object.__setattr__(self, "overrides", overrides)
        fmt.check_group_size(self.group_size)
        if self.min_numel < 0:
            raise ValueError(f"min_numel must be >= 0, got {self.min_numel}")


@dataclass(frozen=True, kw_only=True, slots=True)
class AdaptiveConfig:
    """Bits chosen per tensor from its measured effect on the gradient: on when ``avg_bits`` is set."""

    avg_bits: float | None = None
    """Adaptive mode: the average bits per element the allocation must respect (per
    compiled graph); each tensor gets 1, 2, 3, 4, 8 or 32 bits from its measured
    sensitivity. Bits change at run time without a recompile."""

    adapt_interval: int = 1000
    """Adaptive mode: forward calls between two sensitivity probes (each re-solves the bits)."""

    probe_bits: int = 2
    """Adaptive mode: the width a tensor is quantized at while its sensitivity is measured."""

    probe_tensors: int = 16
    """Adaptive mode: tensors measured per probe step (in rotation): bounds the probe's
    cost (one extra backward each) and the exact copies it keeps."""

    gradient_metric: str = "absolute"
    """Adaptive mode: the gradient error the bits minimise. 'absolute' (the default) is
    GACT's total squared error, what plain SGD's step carries, in which the parameters
    with the largest gradients dominate. 'relative' weighs each parameter's error by its
    element count over its squared gradient norm: the noise an Adam-type optimiser's
    update carries (it divides each gradient by its running RMS). Measured on one task
    only (BENCHMARKS.md), hence not the default."""

    budget: str = "codes"
    """Adaptive mode: what ``avg_bits`` counts. 'codes' (the default, GACT's): the code bits
    of the tensors free to move, averaged over their elements and the elements the backward
    rebuilds from them; tensors held at a floor, the groups' scales and minimums, and the
    tensors compressed at fixed widths (masks) cost bytes beyond it. 'bytes': every byte
    the graph's saved activations hold after gact (floors, scales and minimums, masks and
    tensors kept as they are included) is at most what it saved without gact times
    ``avg_bits`` over its float activations' width: an fp32 model holds ``32 / avg_bits``
    times fewer activation bytes (the report's ratio), a bf16 one ``16 / avg_bits``."""

    def __post_init__(self) -> None:
        for name in ("adapt_interval", "probe_bits", "probe_tensors"):
            _check_type(name, getattr(self, name), int)
        if self.avg_bits is not None:
            if isinstance(self.avg_bits, bool) or not isinstance(self.avg_bits, (int, float)):
                raise ValueError(f"avg_bits must be a number, got {self.avg_bits!r}")
            if not 1 <= self.avg_bits <= 32:
                raise ValueError(f"avg_bits must be between 1 and 32, got {self.avg_bits}")
            object.__setattr__(self, "avg_bits", float(self.avg_bits))
        if self.adapt_interval < 1 or self.probe_tensors < 1:
            raise ValueError("adapt_interval and probe_tensors must be >= 1")
        if self.probe_bits not in fmt.QUANTIZED_BITS:
            raise ValueError(f"probe_bits must be one of {fmt.QUANTIZED_BITS}, got {self.probe_bits}")
        if self.gradient_metric not in GRADIENT_METRICS:
            raise ValueError(f"gradient_metric must be one of {GRADIENT_METRICS}, got {self.gradient_metric!r}")
        if self.budget not in BUDGETS:
            raise ValueError(f"budget must be one of {BUDGETS}, got {self.budget!r}")
        if self.budget != "codes" and self.avg_bits is None:
            raise ValueError(f"budget={self.budget!r} says what avg_bits counts; it needs avg_bits (adaptive mode)")


@dataclass(frozen=True, kw_only=True, slots=True)
class PassesConfig:
    """The graph rewrites around compression."""

    save_derivatives: bool = True
    """Save the local derivative of an elementwise nonlinearity (GELU, SiLU) computed in
    the forward from the exact input, instead of the input the backward would
    differentiate after rounding (``passes.derivatives``); only where that adds no bytes.
    False stores the input, which at 2 bits biases the gradient. The saved-tensor hooks
    do the same for GELU, SiLU, tanh and sigmoid (``local_derivatives``)."""

    recompute_attention: bool = True
    """Give each fused attention backward whose inputs are stored lossy the output and
    logsumexp recomputed from the stored query, key and value, so that they agree
    (``passes.attention``): one attention forward more per layer in the backward, and
    the logsumexp no longer saved. False passes the saved output, whose mismatch
    with the rounded value multiplies the query and key gradients' error, and the saved
    logsumexp (kept exact with ``exact_statistics``); it needs ``nonlinear_bits`` of 8 or
    more."""

    debias_attention: bool = False
    """Remove the bias that rounded query and key put into each fused attention backward
    (``passes.debias``). Softmax is curved, so noise in the logits biases the gradient by
    about the noise's variance: at 4 bits that keeps query and key at ``nonlinear_bits``'
    8. With dithered rounding the noise is known, and the pass decodes query and key a
    second time under other noise, runs the attention backward also at the stored values
    plus and minus that difference, and returns ``2 g - (g+ + g-) / 2``, which cancels the
    bias to second order. Costs two attention forwards and backwards more per layer in
    the backward. Needs ``rounding="dithered"``; meant with ``nonlinear_bits=4``."""

    recompute_affine: bool = True
    """Stop saving a tensor that is an affine function of another saved tensor (a
    LayerNorm's output beside its normalised input) and rebuild it in the backward from
    the stored one (``passes.affine``): one tensor's bytes fewer, a few elementwise ops
    more in the backward. Adaptive bits count its elements in the budget of the one
    that carries it."""

    recompute_projections: bool = True
    """Also stop saving a tensor that a matmul by a parameter computes from another saved
    tensor (attention's value, from the normalised input the QKV projection's weight
    gradient keeps) and rebuild it in the backward (``passes.affine``): that tensor's
    bytes fewer, for the matmul again in the backward (with a fused QKV projection, the
    value's columns of it, ``passes.narrow``). Only tensors the backward reads linearly,
    at no more bits than the one they are rebuilt from; query and key keep their stored
    copies."""

    offload: bool = False
    """Keep the compressed blobs in CPU memory between forward and backward (GACT's L3),
    through torch's activation-offloading pass; on a CPU-only machine it changes nothing."""

    def __post_init__(self) -> None:
        for name in ("save_derivatives", "recompute_attention", "recompute_affine", "recompute_projections",
                     "debias_attention", "offload"):
            _check_type(name, getattr(self, name), bool)
        if self.offload and not _compat.has_activation_offloading():
            raise ValueError(
                f"offload=True (level L3) drives torch's activation-offloading pass, which torch "
                f"{torch.__version__} lacks: it needs torch 2.10 or later"
            )


@dataclass(frozen=True, kw_only=True, slots=True)
class CompileConfig:
    """How the rewritten graphs are compiled."""

    compiler: str = "auto"
    """'inductor' compiles the rewritten graphs with Inductor; 'eager' runs them as
    Python (seconds to compile); 'auto' picks Inductor, or the eager path on the CPU when
    GACT_FX_COMPILER=eager or no C++ compiler works."""

    lowering: str = "auto"
    """How compression reaches the compiled code: 'op' (opaque gact:: ops; Triton kernels
    on CUDA, the C++ codec on the CPU), 'aten' (plain aten ops Inductor fuses into the
    neighbouring kernels; needs compiler='inductor'), 'triton' (gact's Triton kernels as
    kernels Inductor launches itself, without a custom op's host work around each; CUDA),
    or 'auto' (the ops). 'aten' and 'triton' need bits fixed at compile time and no
    rotation; 'aten' also needs stochastic rounding."""

    partitioner: str = "min_cut"
    """Which stock partitioner decides what is saved before gact compresses it:
    'min_cut' (Inductor's; recomputes cheap ops) or 'default' (saves everything used)."""

    def __post_init__(self) -> None:
        if self.compiler not in COMPILERS:
            raise ValueError(f"compiler must be one of {COMPILERS}, got {self.compiler!r}")
        if self.lowering not in LOWERINGS:
            raise ValueError(f"lowering must be one of {LOWERINGS}, got {self.lowering!r}")
        if self.lowering == "aten" and self.compiler == "eager":
            raise ValueError("lowering='aten' is for Inductor to fuse; it needs compiler='inductor' or 'auto'")
        if self.partitioner not in PARTITIONERS:
            raise ValueError(f"partitioner must be one of {PARTITIONERS}, got {self.partitioner!r}")


SECTIONS = {"core": CoreConfig, "adaptive": AdaptiveConfig, "passes": PassesConfig, "compile": CompileConfig}
# Each flat option name (what ``torch.compile(options=...)`` takes) and the section that holds it.
SECTION_OF = {f.name: section for section, cls in SECTIONS.items() for f in dataclasses.fields(cls)}


@dataclass(frozen=True, kw_only=True, slots=True)
class GactConfig:
    """Options of the gact backend, by concern. Every field has a safe default."""

    core: CoreConfig = field(default_factory=CoreConfig)
    adaptive: AdaptiveConfig = field(default_factory=AdaptiveConfig)
    passes: PassesConfig = field(default_factory=PassesConfig)
    compile: CompileConfig = field(default_factory=CompileConfig)

    def __post_init__(self) -> None:
        for section, cls in SECTIONS.items():
            if type(getattr(self, section)) is not cls:
                raise ValueError(f"GactConfig.{section} must be a {cls.__name__}, got {getattr(self, section)!r}")
        traced = self.compile.lowering in ("aten", "triton")
        if traced and self.adaptive.avg_bits is not None:
            raise ValueError(f"lowering={self.compile.lowering!r} needs bits fixed at compile time; adaptive bits "
                             "(avg_bits) use lowering='op'")
        for name in ("rotation", "nonlinear_rotation"):
            if traced and getattr(self.core, name):
                raise ValueError(f"lowering={self.compile.lowering!r} writes plain blobs in traced code; {name} needs "
                                 "lowering='op' or 'auto'")
        if self.compile.lowering == "aten" and self.core.rounding != "stochastic":
            raise ValueError(f"lowering='aten' writes plain blobs in traced code: pass rounding='stochastic' with it "
                             f"(rounding={self.core.rounding!r} needs lowering='op', 'auto' or 'triton')")
        if self.passes.debias_attention and not self.passes.recompute_attention:
            raise ValueError("debias_attention=True evaluates each attention backward at its recomputed output; it "
                             "needs recompute_attention=True")
        if not self.passes.recompute_attention and self.core.nonlinear_bits < 8:
            raise ValueError(f"nonlinear_bits={self.core.nonlinear_bits} rounds attention's query and key below 8 bits; "
                             "with recompute_attention=False the backward exponentiates their scores against the "
                             "logsumexp of the exact ones, and on sharp attention the gradient overflows. Keep "
                             "recompute_attention=True, or nonlinear_bits at 8 or more")
        if self.passes.debias_attention and self.core.rounding != "dithered":
            raise ValueError("debias_attention=True cancels the bias of query and key stored with dithered rounding, "
                             f"whose noise the decoder can draw again; it needs rounding='dithered', got "
                             f"rounding={self.core.rounding!r}")

    @property
    def enabled(self) -> bool:
        return self.core.enabled

    @property
    def is_adaptive(self) -> bool:
        return self.core.enabled and self.adaptive.avg_bits is not None

    @property
    def initial_bits(self) -> int:
        """Width of every float compression before any allocation: ``bits``, or in
        adaptive mode the widest supported width within the ``avg_bits`` budget."""
        if not self.is_adaptive:
            return self.core.bits
        return max((b for b in fmt.QUANTIZED_BITS if b <= self.adaptive.avg_bits), default=1)

    @classmethod
    def from_options(cls, options: Mapping[str, Any] | None = None, **more: Any) -> GactConfig:
        """Build from flat option names (a ``torch.compile`` options dict); unknown names are an error.

        ``level`` names one of ``LEVELS``, which builds the config (passing it together
        with an option it sets is an error).
        """
        merged = {**(options or {}), **more}
        unknown = sorted(set(merged) - set(SECTION_OF) - {"level"})
        if unknown:
            raise ValueError(f"unknown gact option(s) {unknown}; allowed options are {sorted({*SECTION_OF, 'level'})}")
        level = merged.pop("level", None)
        if level is not None:
            if level not in LEVELS:
                raise ValueError(f"level must be one of {list(LEVELS)}, got {level!r}")
            return LEVELS[level](**merged)
        if merged.get("avg_bits") is not None and "bits" in merged:
            raise ValueError("avg_bits makes the bits adaptive; do not also pass bits")
        return cls(**{section: cls_(**_section_options(section, merged)) for section, cls_ in SECTIONS.items()})

    def replace(self, **changes: Any) -> GactConfig:
        """This config with some flat-named options changed."""
        unknown = sorted(set(changes) - set(SECTION_OF))
        if unknown:
            raise ValueError(f"unknown gact option(s) {unknown}")
        return dataclasses.replace(self, **{
            section: dataclasses.replace(getattr(self, section), **_section_options(section, changes))
            for section in SECTIONS if _section_options(section, changes)
        })

    def updated(self, options: Mapping[str, Any]) -> GactConfig:
        """This config with ``options`` (as ``from_options`` takes them) on top.

        A ``level`` replaces all the options a level sets; ``bits``
        on an adaptive config makes it uniform.
        """
        given = GactConfig.from_options(options).as_dict()  # validates names, values and clashes
        names = set(options) - {"level"}
        if "level" in options:
            names |= LEVEL_FIELDS
        if "bits" in options:
            names.add("avg_bits")
        return self.replace(**{name: given[name] for name in names})

    def as_dict(self) -> dict[str, Any]:
        """The flat options."""
        return {name: getattr(getattr(self, section), name) for name, section in SECTION_OF.items()}


@dataclass(frozen=True)
class Level:
    """One of GACT's presets, a constructor of configs: ``LEVELS["L2.2"](group_size=64)``."""

    name: str
    sets: Mapping[str, Any]  # the options it fixes (a subset of ``LEVEL_FIELDS``)
    summary: str

    def __call__(self, **options: Any) -> GactConfig:
        """The config of this level, with ``options`` (flat names) for everything it does not set."""
        clash = sorted(LEVEL_FIELDS & set(options))
        if clash:
            raise ValueError(f"level={self.name!r} means {dict(self.sets)}; do not also pass {clash}")
        return GactConfig.from_options({**options, **self.sets})


# GACT's names. L0: off; L1.x: uniform bits; L2.x: adaptive at an average number of bits.
LEVELS = {level.name: level for level in (
    Level("L0", {"enabled": False}, "compression off"),
    Level("L1", {"bits": 4}, "4 bits"),
    Level("L1.1", {"bits": 8}, "8 bits"),
    Level("L1.2", {"bits": 2}, "2 bits"),
    Level("L2", {"avg_bits": 4.0}, "adaptive, 4 bits on average"),
    Level("L2.1", {"avg_bits": 3.0}, "adaptive, 3 bits on average"),
    Level("L2.2", {"avg_bits": 2.0}, "adaptive, 2 bits on average"),
    Level("L3", {"avg_bits": 4.0, "offload": True}, "L2, with the compressed blobs kept in CPU memory"),
)}
LEVEL_FIELDS = frozenset({"enabled", "bits", "avg_bits", "offload"})


def _section_options(section: str, flat: Mapping[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in flat.items() if SECTION_OF.get(name) == section}


def _check_type(name: str, value: Any, expected: type) -> None:
    # bool is an int subclass: reject True where a number is wanted and 1 where a flag is.
    if type(value) is not expected:
        raise ValueError(f"{name} must be {expected.__name__}, got {value!r}")
