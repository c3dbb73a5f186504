"""The GPU kernels' machine code, read on any machine: instructions per element against the
memory-speed budget, with registers, spills, barriers and access widths.

Each kernel variant the CUDA path launches for a large tensor (every width and dtype,
contiguous and feature-major groups of 256, masks) is recorded without running
(``runtime.launches.LaunchRecorder(run=False)``), compiled for sm_90
(``runtime.compile_check``) and read back with cuobjdump. The quantize and dequantize
kernels branch per program into a general path for groups holding special values or NaN;
their instructions per element are counted on the plain path alone, compiled with that
branch left out (``GENERAL=False``); registers and spills are the full kernel's. A dithered
quantize's key is written once, by program 0 (``triton_common.finish_blob``): a static
count would charge it to every program, so the plain path is compiled without it
(``KEYED=False``) and a dithered quantize counts as its plain twin does.

The budget (a static model, not a measurement): an H100 issues about 3.3e13 thread
instructions a second and copies about 3.0 TB/s, so a kernel moving B bytes an element
stays memory-bound up to about 11 x B instructions an element (45 for fp32 quantize, 24
for 16-bit). The predicted share of copy bandwidth is ``min(1, 11 x B / instructions)``:
an upper bound, not a speed. The issue rate assumes enough warps to hide every latency;
the warps an SM holds at once (from the registers a thread takes) say how far a kernel is
from that, and the GPU suite's kernel table is what measures it.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import os
import sys
from dataclasses import asdict, dataclass

import torch

from ..runtime import format as fmt
from ..runtime.compile_check import SassStats, check, independent_of_fusion, same_as_inductors_launch
from ..runtime.launches import Launch, LaunchRecorder

INSTRUCTIONS_PER_BYTE = 11.0  # ~3.3e13 thread instructions / s over ~3.0e12 bytes / s (H100)
# An H100 SM's limits on what it holds at once (CUDA occupancy rules for compute capability 9.0).
SM_REGISTERS, SM_WARPS, SM_PROGRAMS, REGISTER_GRANULE = 65536, 64, 32, 8
GROUP = 256
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
WIDTHS = (1, 2, 3, 4, 8)
TOKENS, FEATURES = 4096, 1024  # a [tokens, features] activation: programs full, as a real one's


@dataclass(frozen=True)
class Variant:
    """One kernel variant, what it moves, and what its machine code holds."""

    kernel: str
    dtype: str
    bits: int | str
    bytes_per_element: float
    elements_per_program: int
    threads: int
    sass: SassStats | None  # the full kernel's
    plain: SassStats | None  # the plain path's (quantize), else the full kernel's
    error: str = ""
    fusion_independent: bool | None = None  # the same machine code with Triton's multiply-add fusion on
    same_from_inductor: bool | None = None  # Inductor's launch (lowering="triton") compiles to the same code

    @property
    def instructions_per_element(self) -> float | None:
        stats = self.plain or self.sass
        return None if stats is None else stats.instructions * self.threads / self.elements_per_program

    @property
    def resident_warps(self) -> int | None:
        """Warps an H100 SM holds at once, as the registers a thread takes allow (shared memory,
        the other limit, is not counted)."""
        if self.sass is None:
            return None
        registers = -(-max(self.sass.registers, 1) // REGISTER_GRANULE) * REGISTER_GRANULE
        warps = self.threads // 32
        programs = min(SM_PROGRAMS, SM_REGISTERS // (registers * self.threads), SM_WARPS // warps)
        return programs * warps

    @property
    def budget(self) -> float:
        return INSTRUCTIONS_PER_BYTE * self.bytes_per_element

    @property
    def predicted_share(self) -> float | None:
        per = self.instructions_per_element
        return None if per is None else min(1.0, self.budget / per)


def record_launches(dtypes=DTYPES, widths=WIDTHS) -> dict[Launch, tuple[str, str, int | str]]:
    """The launches of every variant, with (what it is, dtype, bits), recorded without running."""
    from ..runtime import triton_kernels as tk

    state = torch.zeros(3, dtype=torch.int64)  # a site's state: keyed by it and counted in it, as in training
    recorded = {}
    for dtype in dtypes:
        name = str(dtype).removeprefix("torch.")
        x = torch.zeros(TOKENS * FEATURES, dtype=dtype)
        matrix = x.view(TOKENS, FEATURES)
        for bits in widths:
            blob = torch.zeros(fmt.float_blob_nbytes(x.numel(), bits, GROUP, x.element_size()), dtype=torch.uint8)
            keyed = torch.zeros(fmt.float_blob_nbytes(x.numel(), bits, GROUP, x.element_size(), True), dtype=torch.uint8)
            calls = {
                "quantize": lambda: tk.quantize(x, bits, GROUP, state=state, count=True),
                "dequantize": lambda: tk.dequantize(blob, x.numel(), dtype, GROUP),
                "quantize, feature groups": lambda: tk.quantize_transposed(matrix, bits, GROUP, state=state, count=True),
                "dequantize, feature groups": lambda: tk.dequantize_transposed(blob, TOKENS, FEATURES, dtype, GROUP),
                "quantize, dithered": lambda: tk.quantize(x, bits, GROUP, state=state, count=True, dithered=True),
                "quantize, feature groups, dithered": lambda: tk.quantize_transposed(
                    matrix, bits, GROUP, state=state, count=True, dithered=True),
                "dequantize, dithered": lambda: tk.dequantize(keyed, x.numel(), dtype, GROUP, dithered=True),
                "dequantize, feature groups, dithered": lambda: tk.dequantize_transposed(
                    keyed, TOKENS, FEATURES, dtype, GROUP, dithered=True),
            }
            for what, call in calls.items():
                with LaunchRecorder(run=False) as recorder:
                    call()
                recorded.update({launch: (what, name, bits) for launch in recorder.launches})
    mask = torch.zeros(TOKENS * FEATURES, dtype=torch.bool)
    blob = torch.zeros(fmt.bool_blob_nbytes(mask.numel()), dtype=torch.uint8)
    for what, dtype, call in (("pack mask", "bool", lambda: tk.pack_mask(mask)),
                              ("unpack mask", "float32", lambda: tk.unpack_mask(blob, mask.numel(), torch.float32)),
                              ("unpack mask", "bool", lambda: tk.unpack_mask(blob, mask.numel(), torch.bool))):
        with LaunchRecorder(run=False) as recorder:
            call()
        recorded.update({launch: (what, dtype, 1) for launch in recorder.launches})
    return recorded


def _moved(what: str, dtype: str, bits: int) -> float:
    if what == "pack mask":
        return 1.125
    itemsize = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    if what == "unpack mask":
        return 0.125 + itemsize
    return itemsize + bits / 8 + fmt.METADATA_BYTES_PER_GROUP / GROUP


def _elements(launch: Launch) -> int:
    constants = dict(launch.constants)
    if "WORDS" in constants:
        return constants["WORDS"] * 32
    return constants["BLOCK"] * constants["GROUP"]


def _compile(item: tuple[Launch, tuple, int]) -> Variant:
    launch, (what, dtype, bits), arch = item
    full = check(launch, arch, read_sass=True)
    plain = None
    if "GENERAL" in dict(launch.constants):
        plain_launch = dataclasses.replace(
            launch, constants=tuple((k, False if k in ("GENERAL", "KEYED") else v) for k, v in launch.constants))
        plain = check(plain_launch, arch, read_sass=True).sass
    fusion = independent_of_fusion(launch, arch) if full.ok else None
    inductor = same_as_inductors_launch(launch, arch) if full.ok else None
    return Variant(f"{what} ({launch.kernel.rpartition('.')[2]})", dtype, bits, _moved(what, dtype, bits),
                   _elements(launch), launch.num_warps * 32, full.sass, plain, full.error, fusion, inductor)


def static_table(arch: int = 90, *, dtypes=DTYPES, widths=WIDTHS, jobs: int | None = None) -> list[Variant]:
    """Compile and read every variant (in a process without ``TRITON_INTERPRET``)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("the static kernel report compiles for a GPU: unset TRITON_INTERPRET")
    items = [(launch, what, arch) for launch, what in record_launches(dtypes, widths).items()]
    with concurrent.futures.ProcessPoolExecutor(max(1, jobs or os.cpu_count() or 1)) as pool:
        return list(pool.map(_compile, items))


def block_size_table(sizes, arch: int = 90, *, dtypes=DTYPES, widths=WIDTHS,
                     jobs: int | None = None) -> list[Variant]:
    """``static_table`` at each of ``sizes`` elements a program (both kinds of
    ``program_sizes.elements_per_program``), less the mask kernels, whose size is their own."""
    from ..runtime.program_sizes import elements_per_program

    rows = []
    for size in sizes:
        with elements_per_program(size, size):
            rows += [r for r in static_table(arch, dtypes=dtypes, widths=widths, jobs=jobs) if "mask" not in r.kernel]
    return rows


def block_size_markdown(rows: list[Variant], arch: int = 90) -> str:
    """What a program's size trades: registers (so warps an SM holds) against the fixed
    instructions each program pays."""
    lines = [f"Compiled for sm_{arch}, groups of {GROUP}; each kernel at several sizes of a program (elements); "
             "instructions per element on the plain path; warps / SM from the registers (of 64). A static "
             "model: the GPU suite's sweep of the same sizes measures which is fastest.\n",
             "| kernel | dtype | bits | elements a program | registers | warps / SM | instructions / element | budget |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    order = sorted(rows, key=lambda r: (r.kernel, r.dtype, str(r.bits), r.elements_per_program))
    for r in order:
        if r.sass is None:
            lines.append(f"| {r.kernel} | {r.dtype} | {r.bits} | {r.elements_per_program} | {r.error[:80]} | | | |")
            continue
        lines.append(f"| {r.kernel} | {r.dtype} | {r.bits} | {r.elements_per_program} | {r.sass.registers} | "
                     f"{r.resident_warps} | {r.instructions_per_element:.1f} | {r.budget:.0f} |")
    return "\n".join(lines)


def static_markdown(rows: list[Variant], arch: int = 90) -> str:
    lines = [f"Compiled for sm_{arch}, groups of {GROUP}, read with cuobjdump; instructions per element on the "
             "plain path (quantize, dequantize) against the memory-speed budget (11 x bytes moved); the share of copy "
             "bandwidth is that model's bound, not a measurement; warps / SM: how many an H100 SM holds at once "
             "with these registers (of 64). " + _fusion_note(rows) + "\n",
             "| kernel | dtype | bits | elements a program | bytes / element | instructions / element | budget | "
             "predicted share of copy | registers | warps / SM | spills | barriers (plain) | loads (bits: count) | "
             "stores (bits: count) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if r.sass is None:
            lines.append(f"| {r.kernel} | {r.dtype} | {r.bits} | {r.elements_per_program} | | {r.error[:80]} "
                         "| | | | | | | | |")
            continue
        plain = r.plain or r.sass
        widths = lambda counts: ", ".join(f"{w}: {n}" for w, n in sorted(counts.items(), key=lambda i: int(i[0])))  # noqa: E731
        lines.append(
            f"| {r.kernel} | {r.dtype} | {r.bits} | {r.elements_per_program} | {r.bytes_per_element:.2f} | "
            f"{r.instructions_per_element:.1f} | "
            f"{r.budget:.0f} | {100 * r.predicted_share:.0f}% | {r.sass.registers} | {r.resident_warps} | {r.sass.spills} | "
            f"{plain.barriers} | {widths(plain.global_loads)} | {widths(plain.global_stores)} |")
    return "\n".join(lines)


def _fusion_note(rows: list[Variant]) -> str:
    same = sum(r.fusion_independent is True for r in rows)
    copied = sum(r.same_from_inductor is True for r in rows)
    return (f"{same} of {len(rows)} variants compile to the same machine code with Triton's multiply-add fusion "
            f"on (a launch by Inductor) as off (gact's own launches); {copied} of {len(rows)} do when compiled "
            "from the copy of their source Inductor writes for `lowering=\"triton\"`.")


def as_json(rows: list[Variant]) -> list[dict]:
    return [{**asdict(r), "instructions_per_element": r.instructions_per_element, "budget": r.budget,
             "predicted_share": r.predicted_share, "resident_warps": r.resident_warps} for r in rows]


def main(argv=None) -> int:
    """``python -m gact_fx.bench.static_kernels [--bits 3] [--dtypes bfloat16]``: JSON rows on stdout."""
    parser = argparse.ArgumentParser(prog="python -m gact_fx.bench.static_kernels")
    parser.add_argument("--bits", type=int, nargs="+", default=list(WIDTHS))
    parser.add_argument("--dtypes", nargs="+", default=[str(d).removeprefix("torch.") for d in DTYPES])
    parser.add_argument("--arch", type=int, default=90)
    args = parser.parse_args(argv)
    rows = static_table(args.arch, dtypes=[getattr(torch, d) for d in args.dtypes], widths=args.bits)
    json.dump(as_json(rows), sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
