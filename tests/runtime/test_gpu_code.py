"""The GPU kernels' machine code fits the memory-speed budget: read on the CPU.

Every kernel variant the CUDA path launches for a large tensor is compiled for sm_90 and
read back (``gact_fx.bench.static_kernels``): instructions per element on the quantize
and dequantize kernels' plain path and the masks' whole code, against the budget an H100
allows (45 an element for fp32, 24 for 16-bit; 11 per byte moved for masks), with no
register spills, and the same code whether or not Triton may fuse multiply-adds.
Counts belong to one compiler: this checks the Triton that ``constraints.txt`` pins, and
skips (saying so) under another.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

if importlib.util.find_spec("triton") is None:
    pytest.skip("Triton is not installed (pip install 'gact-fx[triton]')", allow_module_level=True)

import triton  # noqa: E402

CONSTRAINTS = pathlib.Path(__file__).resolve().parents[2] / "constraints.txt"
BUDGET = {"float32": 45.0, "bfloat16": 24.0, "float16": 24.0}  # issue 32's targets, per element


def without_interpreter(*arguments: str, extra: dict | None = None, timeout: int = 600, cwd=None):
    """``python *arguments`` in a process without ``TRITON_INTERPRET`` (so ``@triton.jit`` gives
    kernels that compile), with ``extra`` environment variables."""
    environment = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | (extra or {})
    return subprocess.run([sys.executable, *arguments], capture_output=True, text=True, env=environment,
                          timeout=timeout, cwd=cwd)


# The start of every script below that needs a GPU's target without a GPU: the launcher's view
# of an H100, enough for Triton to lower and compile a kernel (and Inductor to write its
# code), never to run one.
STAND_IN_H100 = r"""
import torch
from triton.backends.compiler import GPUTarget
from triton.runtime import driver

class H100:
    def get_current_device(self): return 0
    def get_current_stream(self, device=None): return 0
    def get_current_target(self): return GPUTarget("cuda", 90, 32)
    def get_active_torch_device(self): return torch.device("cpu")

driver.set_active(H100())
"""


def pinned_triton() -> str | None:
    found = re.search(r"^triton==([\d.]+)", CONSTRAINTS.read_text(), flags=re.M) if CONSTRAINTS.exists() else None
    return found.group(1) if found else None


# Compiling every variant for sm_90 and reading it back with cuobjdump is the longest setup
# in the suite: the tests that read its table are marked slow (CI runs them, and so should
# anyone who changes a kernel: `make test-slow`).
@pytest.fixture(scope="module")
def variants():
    if triton.__version__ != pinned_triton():
        pytest.skip(f"instruction counts are checked on the pinned Triton {pinned_triton()}, not {triton.__version__}")
    done = without_interpreter("-m", "gact_fx.bench.static_kernels", timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.mark.slow
def test_every_variant_compiles_without_spills(variants):
    kernels = {row["kernel"].rpartition("(")[2].rstrip(")") for row in variants}
    assert kernels == {"encode_chunked_kernel", "decode_chunked_kernel", "encode_features_kernel",
                       "decode_features_kernel", "pack_mask_kernel", "unpack_mask_kernel"}
    # dtypes x widths x (quantize, dequantize, each plain and dithered) x (contiguous, feature) + masks
    assert len(variants) == 3 * 5 * 8 + 3
    for row in variants:
        assert not row["error"] and row["sass"] is not None, row
        assert row["sass"]["spills"] == 0, row["kernel"]


@pytest.mark.slow
def test_no_variant_depends_on_multiply_add_fusion(variants):
    """The format rounds ``a * b + c`` twice. gact launches with Triton's fusion off, but a
    launch by another (Inductor's of a ``wrap_triton`` kernel) gets Triton's default, on:
    the machine code, hence the blob, must be the same either way."""
    fused = [f"{row['kernel']} {row['dtype']} {row['bits']}" for row in variants if row["fusion_independent"] is not True]
    assert not fused, "\n".join(fused)


@pytest.mark.slow
def test_inductor_launches_the_same_machine_code_where_the_kernels_are_traced(variants):
    """With ``lowering="triton"`` Inductor compiles its own copy of each kernel's source (the
    kernel and what it calls, written into its module) and launches it with fusion on: that
    copy must compile to gact's own machine code, so write the same blob."""
    different = [f"{row['kernel']} {row['dtype']} {row['bits']}" for row in variants if row["same_from_inductor"] is not True]
    assert not different, "\n".join(different)


@pytest.mark.slow
def test_every_variant_fits_the_memory_speed_budget(variants):
    over = []
    for row in variants:
        budget = row["budget"] if "mask" in row["kernel"] else BUDGET[row["dtype"]]
        count = row["instructions_per_element"]
        if count > budget:
            over.append(f"{row['kernel']} {row['dtype']} {row['bits']} bits: {count:.1f} > {budget:.0f}")
    assert not over, "\n".join(over)


@pytest.mark.slow
def test_the_decodes_count_their_plain_path_and_hold_the_special_values_branch(variants):
    decodes = [row for row in variants if "dequantize" in row["kernel"]]
    assert len(decodes) == 3 * 5 * 4
    for row in decodes:
        assert row["plain"] is not None, row["kernel"]
        assert row["sass"]["instructions"] > row["plain"]["instructions"], (row["kernel"], row["dtype"], row["bits"])


@pytest.mark.slow
def test_a_dithered_quantize_costs_its_plain_twin_per_element(variants):
    """Its key is program 0's one store (``finish_blob``), left out of the per-element count
    with the general path; the full kernel (its registers, spills) holds it."""
    plain = {(row["kernel"], row["dtype"], row["bits"]): row for row in variants if "dithered" not in row["kernel"]}
    quantizes = [row for row in variants if "dithered" in row["kernel"] and "dequantize" not in row["kernel"]]
    assert len(quantizes) == 3 * 5 * 2
    for row in quantizes:
        twin = plain[(row["kernel"].replace(", dithered", ""), row["dtype"], row["bits"])]
        assert row["instructions_per_element"] == twin["instructions_per_element"], row["kernel"]
        assert row["sass"]["instructions"] > twin["sass"]["instructions"], row["kernel"]  # the key's store is there


def test_the_size_of_a_program_reaches_every_launch_the_block_size_table_compiles():
    import torch

    from gact_fx.bench.static_kernels import _elements, record_launches
    from gact_fx.runtime.program_sizes import elements_per_program

    own = record_launches((torch.bfloat16, torch.float32), (2, 8))
    for size in (2048, 4096):
        with elements_per_program(size, size):
            launches = record_launches((torch.bfloat16, torch.float32), (2, 8))
        kernels = {what for what, _, _ in launches.values() if "mask" not in what}
        assert len(kernels) == 8  # (quantize, dequantize, each plain and dithered) x (contiguous, feature)
        assert {_elements(launch) for launch, (what, _, _) in launches.items() if "mask" not in what} == {size}
    assert record_launches((torch.bfloat16, torch.float32), (2, 8)) == own  # the kernels' own sizes again


def test_each_kernel_launches_at_its_own_size():
    import torch

    from gact_fx.bench.static_kernels import _elements, record_launches
    from gact_fx.runtime.program_sizes import OWN_ELEMENTS_PER_PROGRAM, program_kind, role_flags

    seen = {}
    for launch, (what, dtype, bits) in record_launches((torch.bfloat16, torch.float32), (2, 8)).items():
        if "mask" not in what:
            role = what.removesuffix(", dithered")
            kind = program_kind(4 if dtype == "float32" else 2, bits, **role_flags(role))
            seen.setdefault((role, kind), set()).add(_elements(launch))
    assert seen == {kernel: {size} for kernel, size in OWN_ELEMENTS_PER_PROGRAM.items()}


WARM_CACHE_SCRIPT = STAND_IN_H100 + r"""
import os, pathlib
from gact_fx.bench.static_kernels import record_launches
from gact_fx.runtime import warm_cache
from gact_fx.runtime.compile_check import kernel_function
from gact_fx.runtime.launches import TRITON_TYPES

torch_types = {name: dtype for dtype, name in TRITON_TYPES.items()}
cache = pathlib.Path(os.environ["TRITON_CACHE_DIR"])

def launched(launch):
    # the launcher's own path, on real tensors: whatever it finds in the cache it does not compile again
    arguments = warm_cache.stand_in_arguments(launch)
    for name, kind in launch.signature:
        if kind.startswith("*"):
            tensor = torch.zeros(64, dtype=torch_types[kind[1:]])
            arguments[name] = tensor if name in launch.divisible else tensor[1:]
    function = kernel_function(launch)
    function.device_caches.clear()  # no kernel kept in memory: the disk cache or a compile
    before = sum(1 for _ in cache.rglob("*"))
    function.warmup(**arguments, grid=(1,), num_warps=launch.num_warps, enable_fp_fusion=launch.fp_fusion)
    return sum(1 for _ in cache.rglob("*")) - before

launches = list(record_launches((torch.bfloat16,), (2,)))  # quantize and dequantize, contiguous and feature-major
report = warm_cache.warm(launches[:2], workers=1)
assert (report["launches"], report["failed"]) == (2, 0), report
print([launched(launch) for launch in launches[:3]])
"""


ROUNDING_SCRIPT = r"""
import json, re, torch
from gact_fx.bench.static_kernels import record_launches
from gact_fx.runtime.compile_check import machine_code

found = {}
for launch, (what, dtype, bits) in record_launches((torch.bfloat16,), (2,)).items():
    if what.startswith("dequantize"):
        for arch in (80, 90):
            sass = machine_code(launch, arch)
            found[f"{what} sm_{arch}"] = [len(re.findall(r"F2FP\.BF16\.(F32\.)?PACK_AB", sass)), sass.count("0x7fc0")]
print(json.dumps(found))
"""


def test_bfloat16_decodes_round_in_hardware():
    """Compiled, a decode rounds to bfloat16 with ``cvt.rn`` (F2FP: two values an instruction),
    not by hand as under the interpreter (whose canonical NaN, 0x7FC0, would show)."""
    done = without_interpreter("-c", ROUNDING_SCRIPT)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(found) == 4 * 2
    for variant, (packs, canonical_nans) in found.items():
        assert packs > 0 and canonical_nans == 0, (variant, packs, canonical_nans)


WRITES_SCRIPT = STAND_IN_H100 + r"""
import json
from torch._higher_order_ops.triton_kernel_wrap import identify_accessed_tensors
from gact_fx.bench.static_kernels import record_launches
from gact_fx.runtime import warm_cache
from gact_fx.runtime.compile_check import kernel_function
from gact_fx.runtime.launches import TRITON_TYPES

torch_types = {name: dtype for dtype, name in TRITON_TYPES.items()}
writes = {}
for launch in record_launches((torch.bfloat16, torch.float32), (2, 8)):
    arguments = warm_cache.stand_in_arguments(launch)
    for name, kind in launch.signature:
        if kind.startswith("*"):
            arguments[name] = torch.zeros(64, dtype=torch_types[kind[1:]])
    constants = dict(launch.constants)
    if "FROM_STATE" in constants:  # as the Triton lowering launches it: an explicit key, no counter
        constants.update(FROM_STATE=False, ADVANCE=False)
    arguments.update(constants)
    accesses = identify_accessed_tensors(kernel_function(launch), arguments, {})
    written = sorted(d.name for d in accesses.read_writes.writes if isinstance(arguments.get(d.name), torch.Tensor))
    writes.setdefault(launch.kernel.rpartition(".")[2], set()).add(tuple(written))
print(json.dumps({kernel: sorted(found) for kernel, found in writes.items()}))
"""


def test_inductor_finds_that_each_kernel_writes_its_output_alone():
    """Inductor reads which tensors a traced kernel writes from its Triton IR (and, where it
    cannot tell, takes every input as written, ordering the rest of the graph after it and
    treating activations as mutated). Each of gact's kernels, launched as the Triton
    lowering launches it, must be found to write its output alone."""
    done = without_interpreter("-c", WRITES_SCRIPT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "assuming every input is mutated" not in done.stderr
    writes = json.loads(done.stdout.strip().splitlines()[-1])
    assert writes == {"encode_chunked_kernel": [["blob_ptr"]], "encode_features_kernel": [["blob_ptr"]],
                      "decode_chunked_kernel": [["out_ptr"]], "decode_features_kernel": [["out_ptr"]],
                      "pack_mask_kernel": [["blob_ptr"]], "unpack_mask_kernel": [["out_ptr"]]}


INDUCTOR_CODE_SCRIPT = STAND_IN_H100 + r"""
import json, os, sys
os.environ["GACT_FX_KERNELS"] = "triton"
sys.path.insert(0, os.getcwd())
import gact_fx
from torch._inductor.graph import GraphLowering
from tests.helpers import compiled_grads, model_case

codes = []
GraphLowering.save_output_code = staticmethod(codes.append)
result = {}
for name, dynamic in (("mlp", False), ("block", False), ("block", True)):
    codes.clear()
    torch._dynamo.reset()
    model, inputs = model_case(name)
    backend = gact_fx.backend(bits=2, compiler="inductor", lowering="triton")
    try:
        compiled_grads(model, inputs, backend, dynamic=dynamic)
    except Exception:
        pass  # the kernels' compile, after Inductor wrote the forward's code: no GPU
    result[name + (", dynamic" if dynamic else "")] = {
        "forward": codes[0] if codes else "", "compressed": len(backend.records[0].compressions)}
print(json.dumps(result))
"""


def test_inductor_writes_the_triton_lowerings_launches_into_its_own_code():
    """On a stand-in sm_90 target Inductor lowers, schedules and writes the code of a
    forward the Triton lowering traced, static or with dynamic sizes: one read of the keys,
    each saved tensor's kernel launched from that code (no ``gact::`` op), reading its
    activation where the activation lies (on a real GPU the kernels then compile; here
    compiling them fails, as it should)."""
    done = without_interpreter("-c", INDUCTOR_CODE_SCRIPT, cwd=pathlib.Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-3000:]
    for name, found in json.loads(done.stdout.strip().splitlines()[-1]).items():
        forward = found["forward"]
        assert "def call(" in forward, (name, done.stderr[-2000:])
        assert "gact.quantize" not in forward and forward.count("torch.ops.gact.keys.default(") == 1
        launches = re.findall(r"\b(encode_\w+_kernel|pack_mask_kernel)_\d+\.run\((?:reinterpret_tensor\()?(\w+)", forward)
        assert len(launches) == found["compressed"], (name, launches)
        if name.endswith("dynamic"):  # sizes, and so the grids, computed from the batch at run time
            first = [line for line in forward.splitlines() if "_kernel_0.run(" in line]
            assert first and all("//" in line for line in first), first
        if name == "mlp":  # the matmuls' inputs are encoded from the buffers the matmuls read: no copy
            matmul_inputs = set(re.findall(r"extern_kernels\.addmm\(\w+, (\w+),", forward))
            encoded = {source for kernel, source in launches if kernel.startswith("encode")}
            assert len(matmul_inputs & encoded) >= 2, (matmul_inputs, encoded)


def test_a_launch_warmed_ahead_is_not_compiled_again(tmp_path):
    """``runtime.warm_cache`` compiles under the launcher's own cache key: the kernel a real
    launch then asks for is found on disk (no new cache entry), where an unwarmed one is compiled."""
    if triton.__version__ != pinned_triton():
        pytest.skip(f"checked on the pinned Triton {pinned_triton()}, not {triton.__version__}")
    done = without_interpreter("-c", WARM_CACHE_SCRIPT, extra={"TRITON_CACHE_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    new_entries = json.loads(done.stdout.strip().splitlines()[-1])
    assert new_entries[:2] == [0, 0] and new_entries[2] > 0, new_entries


def test_warming_in_a_pool_reports_each_launch_it_could_not_compile(tmp_path):
    """The pool's plumbing: launches travel to spawned workers and each failure comes back
    named. Here (no GPU, so no driver in the workers) every launch fails."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the workers would compile")
    script = ("import torch, json\nfrom gact_fx.bench.static_kernels import record_launches\n"
              "from gact_fx.runtime.warm_cache import warm\n"
              "print(json.dumps(warm(list(record_launches((torch.float32,), (2,)))[:2], workers=2)))\n")
    done = without_interpreter("-c", script, extra={"TRITON_CACHE_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert (report["launches"], report["failed"], report["unfinished"], report["workers"]) == (2, 2, 0, 2)
    assert all(failure.startswith(("encode_", "decode_")) for failure in report["failures"]), report


def test_warming_stops_at_its_limit_and_counts_what_it_left():
    import torch

    from gact_fx.bench.static_kernels import record_launches
    from gact_fx.runtime.warm_cache import warm

    launches = list(record_launches((torch.float32,), (2,)))
    report = warm(launches, workers=1, limit_s=0.0)  # past its limit before the first compile
    assert (report["launches"], report["unfinished"], report["failed"]) == (len(launches), len(launches), 0)


MACHINE_CODE_SCRIPT = r"""
import dataclasses, json, pathlib, sys, tempfile
directory = tempfile.mkdtemp()
pathlib.Path(directory, "toy_kernels.py").write_text('''
import triton
import triton.language as tl

@triton.jit
def multiply_add(a_ptr, b_ptr, c_ptr, out_ptr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offsets, tl.load(a_ptr + offsets) * tl.load(b_ptr + offsets) + tl.load(c_ptr + offsets))
''')
sys.path.insert(0, directory)
from gact_fx.runtime.compile_check import compile_launch, machine_code, same_machine_code, text_sections
from gact_fx.runtime.launches import Launch

pointers = tuple((name, "*fp32") for name in ("a_ptr", "b_ptr", "c_ptr", "out_ptr"))
apart = Launch("toy_kernels.multiply_add", pointers + (("BLOCK", "constexpr"),), (("BLOCK", 1024),),
               tuple(name for name, _ in pointers), 4, fp_fusion=False)
fused = dataclasses.replace(apart, fp_fusion=True)
code = machine_code(apart, 90)
print(json.dumps({
    "fusion": same_machine_code(apart, fused, 90), "again": same_machine_code(apart, apart, 90),
    "fused_has_ffma": "FFMA" in machine_code(fused, 90), "apart_has_ffma": "FFMA" in code,
    "text_instructions": len(text_sections(compile_launch(apart, 90).asm["cubin"])) // 16,
    "disassembled": code.count(";"),
}))
"""


def test_machine_code_compares_by_the_cubins_text_and_tells_a_fused_multiply_add_apart():
    """``compile_check.same_machine_code`` compares the cubins' ``.text`` sections (every
    instruction, 16 bytes each on sm_90), which is what lets the static report check each
    variant without a disassembler's run per comparison: it must still see a difference."""
    done = without_interpreter("-c", MACHINE_CODE_SCRIPT)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["fused_has_ffma"] and not found["apart_has_ffma"]
    assert found["fusion"] is False and found["again"] is True
    assert found["text_instructions"] == found["disassembled"] > 0
