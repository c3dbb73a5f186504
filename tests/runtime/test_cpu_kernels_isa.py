"""The CPU codec compiled for older x86 ISAs: still the reference's blob, bit for bit.

Inductor compiles the codec with ``-march=native``, so on an AVX-512 machine the suite
only exercises its sixteen-lane code as this CPU's extensions shape it. Here g++ builds the
same source for x86-64-v4 (AVX-512 without VBMI's byte permutes or BF16's conversions, where
the CPU can run it), x86-64-v3 (AVX2, the eight-lane code) and plain x86-64 (no AVX, no
F16C: the scalar half-float paths).
"""

import ctypes
import platform
import shutil
import subprocess

import pytest
import torch

from gact_fx import _compat
from gact_fx.runtime import cpu_kernels, noise
from gact_fx.runtime.reference import dequantize_reference

from .test_cpu_kernels import reference_blob, same_decode

if platform.machine() not in ("x86_64", "AMD64") or shutil.which("g++") is None:
    pytest.skip("needs an x86-64 machine with g++", allow_module_level=True)


@pytest.fixture(scope="module")
def libraries(tmp_path_factory):
    """(-march, source) -> the codec compiled for it (a path), built on first use."""
    built = {}

    def build(march, text):
        if (march, text) not in built:
            folder = tmp_path_factory.mktemp(march)
            source, library = folder / "codec.cpp", folder / "codec.so"
            source.write_text(text)
            flags = ["-O2", f"-march={march}", "-shared", "-fPIC", "-fopenmp", "-ffp-contract=off", "-std=c++20"]
            subprocess.run(["g++", *flags, str(source), "-o", str(library)], check=True, capture_output=True)
            built[march, text] = library
        return built[march, text]

    return build


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as info:
            return next((set(line.split(":", 1)[1].split()) for line in info if line.startswith("flags")), set())
    except OSError:
        return set()


AVX512_V4 = {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}


@pytest.fixture(params=["x86-64-v4", "x86-64-v3", "x86-64"])
def codec_for(request, libraries, monkeypatch):
    """``cpu_kernels`` with its library compiled for the parametrised -march."""
    if request.param == "x86-64-v4" and not AVX512_V4 <= _cpu_flags():
        pytest.skip("this CPU cannot run x86-64-v4 (AVX-512) code")
    monkeypatch.setattr(_compat, "compile_cpp_library", lambda source: ctypes.CDLL(str(libraries(request.param, source))))
    cpu_kernels.library.cache_clear()
    yield cpu_kernels
    cpu_kernels.library.cache_clear()  # the next caller compiles for this machine again


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_blobs_and_decodes_match_the_reference(codec_for, dtype):
    x = (torch.randn(3 * 256 + 77, generator=torch.Generator().manual_seed(5)) * 3).to(dtype)
    x[300] = float("inf")  # a flagged group
    for bits in (1, 2, 3, 4, 8):
        key = noise.key_of(11, bits)
        blob = codec_for.quantize(x, bits, 256, key=key)
        assert torch.equal(blob, reference_blob(x, bits, 256, key)), bits
        decoded = codec_for.dequantize(blob, x.numel(), dtype, 256)
        # NaN where a 1-bit group is poisoned
        assert same_decode(decoded, dequantize_reference(blob, x.numel(), dtype, 256)), bits
    mask = x.float() > 0
    assert torch.equal(codec_for.unpack_bool(codec_for.pack_bool(mask), mask.numel()), mask)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_feature_major_blobs_and_decodes_match_the_reference(codec_for, dtype):
    matrix = (torch.randn(512, 32, generator=torch.Generator().manual_seed(6)) * torch.logspace(-1, 1, 32)).to(dtype)
    matrix[7, 3] = float("inf")  # a flagged group
    for bits in (1, 2, 3, 4, 8):
        key = noise.key_of(13, bits)
        blob = codec_for.quantize_transposed(matrix, bits, 256, key=key)
        flat = matrix.t().reshape(-1)
        assert torch.equal(blob, reference_blob(flat, bits, 256, key)), bits
        decoded = codec_for.dequantize_transposed(blob, *matrix.shape, dtype, 256)
        expected = dequantize_reference(blob, flat.numel(), dtype, 256).view(matrix.shape[1], -1).t()
        assert same_decode(decoded, expected), bits
