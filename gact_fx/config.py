"""The one frozen dataclass of gact options, and its validation.

Everything a user can set (``torch.compile(..., options={...})``, ``gact_fx.backend(...)``,
``gact_fx.compress(...)``) lands here; a wrong name or value is a ``ValueError`` that
says what is allowed, raised when the model is compiled.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .runtime import format as fmt

COMPILERS = ("auto", "inductor", "eager")
PARTITIONERS = ("min_cut", "default")


@dataclass(frozen=True, kw_only=True, slots=True)
class GactConfig:
    """Options of the gact backend. Every field has a safe default."""

    enabled: bool = True
    """False compiles through the same path with no compression (the baseline)."""

    bits: int = 8
    """Bits per element for every compressed floating-point activation: 1, 2, 4, 8,
    or 32 (pass-through: stored as is, the rewrite still runs)."""

    group_size: int = 256
    """Elements sharing one fp32 min and scale; a multiple of 8."""

    min_numel: int = 4096
    """Saved tensors with fewer elements stay in full precision (too small to matter)."""

    compiler: str = "auto"
    """'inductor' compiles the rewritten graphs with Inductor; 'eager' runs them as
    Python (seconds to compile); 'auto' picks Inductor on CUDA and eager on CPU."""

    partitioner: str = "min_cut"
    """Which stock partitioner decides what is saved before gact compresses it:
    'min_cut' (Inductor's; recomputes cheap ops) or 'default' (saves everything used)."""

    compress_inputs: bool = True
    """Also compress saved non-parameter graph inputs: the activations that cross a
    graph break into this graph."""

    def __post_init__(self) -> None:
        _check_type("enabled", self.enabled, bool)
        _check_type("compress_inputs", self.compress_inputs, bool)
        for name in ("bits", "group_size", "min_numel"):
            _check_type(name, getattr(self, name), int)
        fmt.check_bits(self.bits)
        fmt.check_group_size(self.group_size)
        if self.min_numel < 0:
            raise ValueError(f"min_numel must be >= 0, got {self.min_numel}")
        if self.compiler not in COMPILERS:
            raise ValueError(f"compiler must be one of {COMPILERS}, got {self.compiler!r}")
        if self.partitioner not in PARTITIONERS:
            raise ValueError(f"partitioner must be one of {PARTITIONERS}, got {self.partitioner!r}")

    @classmethod
    def from_options(cls, options: Mapping[str, Any] | None = None, **overrides: Any) -> GactConfig:
        """Build from a ``torch.compile`` options dict; unknown names are an error."""
        merged = {**(options or {}), **overrides}
        allowed = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(merged) - allowed)
        if unknown:
            raise ValueError(
                f"unknown gact option(s) {unknown}; allowed options are {sorted(allowed)}"
            )
        return cls(**merged)

    def replace(self, **changes: Any) -> GactConfig:
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _check_type(name: str, value: Any, expected: type) -> None:
    # bool is an int subclass: reject True where a number is wanted and 1 where a flag is.
    if type(value) is not expected:
        raise ValueError(f"{name} must be {expected.__name__}, got {value!r}")
