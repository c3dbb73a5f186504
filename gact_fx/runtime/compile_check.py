"""Compile recorded Triton launches for real GPU targets, on any machine, and read their SASS.

The Triton interpreter (``TRITON_INTERPRET=1``, how the kernels' semantics are tested on
a CPU) accepts code that compiled Triton refuses. This compiles each ``Launch`` that
``runtime.launches`` recorded with ``triton.compile(ASTSource(...), target=GPUTarget(
"cuda", capability, 32))``: the Triton wheel carries ptxas, so no GPU is needed. With
``cuobjdump`` (also in the wheel) it reads the machine code back and counts what the
GPU-speed budget is about: instructions, barriers, registers, spills, and the width of
global loads and stores.

It must run in a process without ``TRITON_INTERPRET`` (under the interpreter ``@triton.jit``
gives interpreted functions, which do not compile)::

    python -m gact_fx.runtime.compile_check launches.json --arch 80 90 [--sass]

reads a JSON list of launches (``Launch.as_json``) and prints one JSON result per
launch and target.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import functools
import importlib
import importlib.util
import json
import logging
import os
import pathlib
import re
import struct
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass

from .launches import Launch

log = logging.getLogger(__name__)

ARCHES = (80, 90)  # the data-centre GPUs users train on: A100 (sm_80) and H100/H200 (sm_90)
_INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")


@dataclass(frozen=True)
class SassStats:
    """What the machine code of one kernel variant holds (static counts, each instruction once)."""

    instructions: int  # SASS instructions, NOPs left out
    barriers: int  # BAR.SYNC and friends: layout conversions through shared memory
    registers: int
    spills: int  # local-memory loads and stores (register spills)
    shared_bytes: int
    global_loads: dict[str, int]  # width in bits -> count
    global_stores: dict[str, int]
    loops: bool  # a backward branch other than the final self-loop: static counts undercount

    def per_element(self, threads: int, elements: int) -> float:
        """Instructions each element costs, for a program of ``threads`` over ``elements``."""
        return self.instructions * threads / elements


@dataclass(frozen=True)
class CompileResult:
    launch: Launch
    arch: int
    ok: bool
    error: str = ""
    sass: SassStats | None = None

    def as_json(self) -> dict:
        data = dataclasses.asdict(self)
        data["launch"] = self.launch.as_json()
        return data


def kernel_function(launch: Launch):
    """The ``@triton.jit`` function a launch names (``module.function``)."""
    module, _, name = launch.kernel.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _source(launch: Launch):
    from triton.compiler import ASTSource

    from triton.backends.nvidia.compiler import CUDABackend

    fn = kernel_function(launch)
    names = [name for name, _ in launch.signature]
    attrs = {(names.index(name),): CUDABackend.parse_attr("D") for name in launch.divisible}
    return ASTSource(fn, dict(launch.signature), dict(launch.constants), attrs)


def compile_launch(launch: Launch, arch: int):
    """The Triton ``CompiledKernel`` of a launch for ``sm_<arch>`` (raises what Triton raises)."""
    import triton
    from triton.backends.compiler import GPUTarget

    options = {"num_warps": launch.num_warps, "enable_fp_fusion": launch.fp_fusion}
    return triton.compile(_source(launch), target=GPUTarget("cuda", arch, 32), options=options)


def cuobjdump() -> pathlib.Path | None:
    import triton

    path = pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return path if path.exists() else None


def _load_store_width(opcode: str) -> str:
    for width in ("128", "64", "U16", "S16", "U8", "S8"):
        if f".{width}" in opcode:
            return {"U16": "16", "S16": "16", "U8": "8", "S8": "8"}.get(width, width)
    return "32"


def parse_sass(sass: str, resources: str) -> SassStats:
    """Counts from ``cuobjdump -sass`` and ``cuobjdump -res-usage`` output of one kernel."""
    opcodes, branches = [], []
    for match in _INSTRUCTION.finditer(sass):
        address, opcode, operands = int(match.group(1), 16), match.group(3), match.group(4)
        if opcode.startswith("NOP"):
            continue
        opcodes.append(opcode)
        if opcode.startswith("BRA"):
            target = re.search(r"0x([0-9a-f]+)", operands)
            if target:
                branches.append((address, int(target.group(1), 16)))
    loops = any(target < address for address, target in branches)  # (the final self-loop: target == address)
    count = Counter()
    loads, stores = Counter(), Counter()
    for opcode in opcodes:
        if opcode.startswith("BAR"):
            count["barriers"] += 1
        if opcode.startswith(("LDL", "STL")):
            count["spills"] += 1
        if opcode.startswith("LDG"):
            loads[_load_store_width(opcode)] += 1
        if opcode.startswith("STG"):
            stores[_load_store_width(opcode)] += 1
    registers = re.search(r"REG:(\d+)", resources)
    shared = re.search(r"SHARED:(\d+)", resources)
    return SassStats(
        instructions=len(opcodes), barriers=count["barriers"], registers=int(registers.group(1)) if registers else -1,
        spills=count["spills"], shared_bytes=int(shared.group(1)) if shared else -1,
        global_loads=dict(loads), global_stores=dict(stores), loops=loops,
    )


def _disassemble(cubin: bytes, *flags: str) -> str | None:
    tool = cuobjdump()
    if tool is None:
        return None
    with tempfile.TemporaryDirectory() as directory:
        path = pathlib.Path(directory) / "kernel.cubin"
        path.write_bytes(cubin)
        return subprocess.run([str(tool), *flags, str(path)], capture_output=True, text=True, check=True).stdout


def sass_stats(cubin: bytes) -> SassStats | None:
    sass = _disassemble(cubin, "-sass")
    return None if sass is None else parse_sass(sass, _disassemble(cubin, "-res-usage"))


def _instructions(cubin: bytes) -> str | None:
    sass = _disassemble(cubin, "-sass")
    return None if sass is None else "\n".join(m.group(0) for m in _INSTRUCTION.finditer(sass))


def machine_code(launch: Launch, arch: int) -> str | None:
    """A launch's SASS for ``sm_<arch>``, its instructions alone (``None`` without cuobjdump)."""
    return _instructions(compile_launch(launch, arch).asm["cubin"])


_INDUCTOR_COPIES = tempfile.TemporaryDirectory(prefix="gact_inductor_copies_")  # removed at exit


@functools.cache
def _inductor_module(kernel: str) -> str:
    """The name of a module holding Inductor's copy of ``kernel`` (``module.function``), imported."""
    from .. import _compat

    module, _, name = kernel.rpartition(".")
    copy = f"gact_inductor_copy_{name}"
    path = pathlib.Path(_INDUCTOR_COPIES.name) / f"{copy}.py"
    source = _compat.inductor_triton_source(getattr(importlib.import_module(module), name))
    path.write_text("import triton\nimport triton.language as tl\n\n@triton.jit\n" + source)
    spec = importlib.util.spec_from_file_location(copy, path)
    sys.modules[copy] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sys.modules[copy])
    return copy


def inductors_copy(launch: Launch) -> Launch:
    """The launch as Inductor makes it where ``lowering="triton"`` traced it: of the copy of
    the kernel's source Inductor writes into its own module (the kernel and what it calls),
    with Triton's default multiply-add fusion, and each Python float argument typed fp64, as
    Inductor types it on CUDA."""
    name = launch.kernel.rpartition(".")[2]
    signature = tuple((argument, "fp64" if kind == "fp32" else kind) for argument, kind in launch.signature)
    return dataclasses.replace(launch, kernel=f"{_inductor_module(launch.kernel)}.{name}", signature=signature,
                               fp_fusion=True)


def text_sections(cubin: bytes) -> bytes:
    """The machine code in an ELF cubin: its ``.text.*`` sections, in the file's order.
    Two compiles of one kernel differ elsewhere (the line table names the source file), so
    equal machine code is compared here, where reading it back takes a disassembler's run."""
    if cubin[:4] != b"\x7fELF" or cubin[4] != 2 or cubin[5] != 1:
        raise ValueError("not a little-endian ELF64 cubin")
    (table,) = struct.unpack_from("<Q", cubin, 0x28)
    entry_size, count, names_index = struct.unpack_from("<HHH", cubin, 0x3A)

    def section(index: int) -> tuple[int, int, int]:  # name offset, file offset, size
        name, _, _, _, offset, size = struct.unpack_from("<IIQQQQ", cubin, table + index * entry_size)
        return name, offset, size

    _, names_offset, _ = section(names_index)
    found = []
    for index in range(count):
        name, offset, size = section(index)
        name = cubin[names_offset + name:cubin.index(b"\0", names_offset + name)]
        if name.startswith(b".text."):
            found.append(cubin[offset:offset + size])
    return b"".join(found)


def same_machine_code(first: Launch, second: Launch, arch: int) -> bool | None:
    """Whether two launches compile to the same instructions for ``sm_<arch>`` (None where
    they differ in bytes and there is no cuobjdump to say whether in instructions)."""
    one, other = (compile_launch(launch, arch).asm["cubin"] for launch in (first, second))
    if text_sections(one) == text_sections(other):
        return True
    code = _instructions(one)
    return None if code is None else code == _instructions(other)


def same_as_inductors_launch(launch: Launch, arch: int) -> bool | None:
    """Whether Inductor's launch of the kernel (``inductors_copy``) compiles to gact's own
    launch's machine code, so writes the same blob (False, logged, where Inductor's launch
    does not compile)."""
    try:
        return same_machine_code(launch, inductors_copy(launch), arch)
    except Exception as error:  # Triton's own error types vary between releases
        log.warning("Inductor's launch of %s does not compile: %s", launch.describe(), str(error).strip()[-500:])
        return False


def independent_of_fusion(launch: Launch, arch: int) -> bool | None:
    """Whether ``launch`` compiles to the same machine code when Triton may fuse a multiply
    and an add into one rounding (its default, and what a launch by Inductor gets) as when
    it may not (gact's own launches): the format rounds them apart, so the blob must not
    depend on it (``triton_common.mul``)."""
    return same_machine_code(launch, dataclasses.replace(launch, fp_fusion=not launch.fp_fusion), arch)


def check(launch: Launch, arch: int, *, read_sass: bool = False) -> CompileResult:
    try:
        compiled = compile_launch(launch, arch)
    except Exception as error:  # reported, launch by launch: one failure must not hide the others
        message = f"{type(error).__name__}: {error}".strip()
        return CompileResult(launch, arch, ok=False, error=message[-2000:])  # Triton's cause comes last
    stats = sass_stats(compiled.asm["cubin"]) if read_sass else None
    return CompileResult(launch, arch, ok=True, sass=stats)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gact_fx.runtime.compile_check", description=__doc__.splitlines()[0])
    parser.add_argument("launches", help="JSON file: a list of recorded launches")
    parser.add_argument("--arch", type=int, nargs="+", default=list(ARCHES), help="compute capabilities, e.g. 80 90")
    parser.add_argument("--sass", action="store_true", help="also read the machine code (cuobjdump)")
    parser.add_argument("--jobs", type=int, help="compiles at once (default: one a core)")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("compile_check: unset TRITON_INTERPRET: interpreted kernels do not compile", file=sys.stderr)
        return 2
    launches = [Launch.from_json(item) for item in json.loads(pathlib.Path(args.launches).read_text())]
    jobs = [(launch, arch) for launch in launches for arch in args.arch]
    failed = 0
    workers = max(1, min(args.jobs or os.cpu_count() or 1, len(jobs)))
    with concurrent.futures.ProcessPoolExecutor(workers) as pool:  # each compile is single-threaded
        for result in pool.map(_check_job, jobs, [args.sass] * len(jobs)):
            failed += not result.ok
            print(json.dumps(result.as_json()), flush=True)
    return 1 if failed else 0


def _check_job(job: tuple[Launch, int], read_sass: bool) -> CompileResult:
    launch, arch = job
    return check(launch, arch, read_sass=read_sass)


if __name__ == "__main__":
    raise SystemExit(main())
