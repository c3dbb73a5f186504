"""How many elements a program of each Triton kernel holds.

Kept apart from the kernels (``runtime.triton_kernels``), which import Triton, so that the
bench can name the sizes its rows ran at on any machine.
"""

from __future__ import annotations

import contextlib

# Elements a program holds (4 warps), per kernel and ``program_kind``: the size the H100
# runs' sweeps found fastest (BENCHMARKS.md, "GPU suite: the second run" and "GPU suite"),
# where it keeps every width within the instruction budget and free of spills
# (``tests/runtime/test_gpu_code.py``); else the larger size before it. A small program
# takes fewer registers, so an SM holds more programs to hide a load's latency, but pays its
# fixed costs (the key, the plain-path test, each group's reciprocal) over fewer elements:
# the contiguous decode, with few such costs, runs fastest small. (The contiguous quantize
# ran fastest at 4096 elements, narrow and wide, but there its 16-bit plain path exceeds the
# budget and its fp32 1-bit spills: docs/gpu.md.)
OWN_ELEMENTS_PER_PROGRAM = {
    ("quantize", "narrow"): 8192, ("quantize", "wide"): 8192,
    ("dequantize", "wide"): 2048,
    ("quantize, feature groups", "narrow"): 16384, ("quantize, feature groups", "wide"): 8192,
    ("dequantize, feature groups", "narrow"): 16384, ("dequantize, feature groups", "wide"): 8192,
}

_SWEPT: dict[str, int] = {}  # inside ``elements_per_program``: its sizes, by ``program_kind``


@contextlib.contextmanager
def elements_per_program(narrow: int, wide: int):
    """Launch every kernel with ``narrow`` (16-bit inputs below 8 bits, feature-major 16-bit)
    or ``wide`` (the rest) elements a program inside the block: a knob for the GPU suite's
    sweep of block sizes, not for training."""
    for size in (narrow, wide):
        if size < 256 or size & (size - 1):
            raise ValueError(f"elements a program must be a power of two of at least 256, not {size}")
    saved = dict(_SWEPT)
    _SWEPT.update(narrow=narrow, wide=wide)
    try:
        yield
    finally:
        _SWEPT.clear()
        _SWEPT.update(saved)


def program_kind(itemsize: int, bits: int, *, feature_major: bool = False, decoding: bool = False) -> str:
    """Which of the two sizes ``elements_per_program`` gives a kernel takes: "narrow" for 16-bit
    elements below 8 bits or feature-major, else "wide". The contiguous decode takes "wide"
    whatever it writes: it holds fp32 values a thread."""
    if decoding and not feature_major:
        itemsize = 4
    return "narrow" if itemsize == 2 and (bits < 8 or feature_major) else "wide"


def kernel_role(*, feature_major: bool, decoding: bool) -> str:
    """The name a kernel goes by in ``OWN_ELEMENTS_PER_PROGRAM`` and the bench's tables."""
    return ("dequantize" if decoding else "quantize") + (", feature groups" if feature_major else "")


def role_flags(role: str) -> dict[str, bool]:
    """``kernel_role``'s arguments back from its name (a bench row's op)."""
    return {"feature_major": "feature groups" in role, "decoding": role.startswith("dequantize")}


def elements_in_a_program(itemsize: int, bits: int, *, feature_major: bool = False, decoding: bool = False) -> int:
    """Elements a program of this kernel holds: its own (``OWN_ELEMENTS_PER_PROGRAM``), or inside
    ``elements_per_program`` the size given for its ``program_kind``."""
    kind = program_kind(itemsize, bits, feature_major=feature_major, decoding=decoding)
    if _SWEPT:
        return _SWEPT[kind]
    return OWN_ELEMENTS_PER_PROGRAM[kernel_role(feature_major=feature_major, decoding=decoding), kind]


def sizes_text(sizes: dict[tuple[str, str], int]) -> str:
    """Sizes keyed as ``OWN_ELEMENTS_PER_PROGRAM`` in a line, in its order, each kernel's
    narrow/wide ("quantize 16384/8192, dequantize 2048, ..."; "-" where ``sizes`` has none)."""
    roles = dict.fromkeys(role for role, _ in OWN_ELEMENTS_PER_PROGRAM)
    return ", ".join(f"{role} " + "/".join(str(sizes.get((role, kind), "-")) for kind in ("narrow", "wide")
                                           if (role, kind) in OWN_ELEMENTS_PER_PROGRAM) for role in roles)


def own_sizes_text() -> str:
    """``OWN_ELEMENTS_PER_PROGRAM`` in a line (``sizes_text``)."""
    return sizes_text(OWN_ELEMENTS_PER_PROGRAM)
