"""Dithered rounding (``rounding="dithered"``): the same codes, the same noise subtracted when
decoding. Unbiased, half the variance of stochastic rounding, 8 more bytes a tensor."""

import pytest
import torch

import gact_fx
from gact_fx.runtime import format as fmt
from gact_fx.runtime import kernels, noise
from gact_fx.runtime.reference import scale_of, unpack_group_words

from .helpers import baseline_backend, compiled_grads, model_case, relative_error

WIDTHS = (1, 2, 3, 4, 8)


def round_trip(x, bits, key, dithered, group_size=256):
    blob = kernels.encode(x, bits, group_size, key=key, dithered=dithered)
    return blob, kernels.decode(blob, x.numel(), x.dtype, group_size, dithered=dithered)


@pytest.mark.parametrize("bits", WIDTHS)
def test_a_dithered_blob_is_the_stochastic_one_with_its_key(bits):
    x = torch.randn(1000) * 3
    key = noise.key_of(0x1234, 0xFEDCBA98)
    plain, _ = round_trip(x, bits, key, dithered=False)
    dithered, _ = round_trip(x, bits, key, dithered=True)
    assert dithered.numel() == plain.numel() + fmt.KEY_BYTES
    assert dithered.numel() == fmt.float_blob_nbytes(x.numel(), bits, 256, 4, dithered=True)
    assert fmt.bits_from_blob_nbytes(dithered.numel()) == bits
    codes_end = fmt.key_offset(x.numel(), bits, 256)
    assert torch.equal(dithered[:codes_end], plain[:codes_end])  # the same metadata and codes
    stored = dithered[codes_end : codes_end + fmt.KEY_BYTES].view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    assert stored.tolist() == key.tolist()


def test_32_bits_and_masks_are_untouched_by_dithering():
    x = torch.randn(300)
    blob, back = round_trip(x, 32, noise.key_of(1, 2), dithered=True)
    assert blob.numel() == fmt.float_blob_nbytes(300, 32, 256, 4) and torch.equal(back, x)
    mask = torch.rand(300) > 0.5
    blob = kernels.encode(mask, 1, 256, key=noise.key_of(1, 2), dithered=True)
    assert blob.numel() == fmt.bool_blob_nbytes(300)
    assert torch.equal(kernels.decode(blob, 300, torch.bool, 256, dithered=True), mask)


@pytest.mark.parametrize("bits", [2, 3, 4])
def test_dithered_error_is_one_step_squared_over_12_and_unbiased(bits):
    torch.manual_seed(0)
    x = torch.rand(4096)  # values spread over each group's range
    draws = 64
    stochastic, dithered = [], []
    for index in range(draws):
        key = noise.key_of(index, 77)
        stochastic.append(round_trip(x, bits, key, dithered=False)[1])
        blob, back = round_trip(x, bits, key, dithered=True)
        dithered.append(back)
    word, _ = unpack_group_words(blob[: fmt.num_groups(4096, 256) * fmt.METADATA_BYTES_PER_GROUP])
    step = scale_of(word.abs(), torch.tensor(2**bits - 1))
    expected = float((step**2 / 12).mean())
    variance = float(torch.stack([(d - x) ** 2 for d in dithered]).mean())
    assert variance == pytest.approx(expected, rel=0.05)
    stochastic_variance = float(torch.stack([(d - x) ** 2 for d in stochastic]).mean())
    assert 0.4 < variance / stochastic_variance < 0.6  # about scale**2 / 6 on average for stochastic rounding
    bias = float(((torch.stack(dithered).mean(0) - x) ** 2).mean())
    assert bias < 1.5 * variance / draws  # the mean's error is the averaging floor's


def test_special_values_and_nan_keep_their_meaning_when_dithered():
    x = torch.randn(1024)  # one special kind a group (two kinds poison theirs)
    x[3], x[300], x[600], x[900] = float("inf"), -torch.finfo(torch.float32).max, float("-inf"), float("nan")
    _, back = round_trip(x, 4, noise.key_of(5, 6), dithered=True)
    assert back[3] == float("inf") and back[300] == -torch.finfo(torch.float32).max and back[600] == float("-inf")
    assert back[768:].isnan().all() and not back[:768].isnan().any()
    ordinary = torch.ones(1024, dtype=torch.bool)
    ordinary[[3, 300, 600]] = False
    ordinary[768:] = False
    assert (back[ordinary] - x[ordinary]).abs().max() < 3  # the rest decode as usual


def test_bfloat16_tensors_dither_too():
    x = torch.randn(2048, dtype=torch.bfloat16)
    errors = {}
    for dithered in (False, True):
        draws = [round_trip(x, 2, noise.key_of(k, 3), dithered)[1].float() for k in range(32)]
        errors[dithered] = float(torch.stack([(d - x.float()) ** 2 for d in draws]).mean())
        assert all(d.dtype == torch.float32 for d in draws)
    assert errors[True] < 0.7 * errors[False]


def test_a_dithering_backend_halves_the_rounding_variance_at_the_same_width():
    model, inputs = model_case("block")
    (exact,), _ = compiled_grads(model, inputs, baseline_backend())
    errors, backends = {}, {}
    for rounding in ("stochastic", "dithered"):
        backends[rounding] = backend = gact_fx.backend(bits=2, rounding=rounding, compiler="eager")
        draws, _ = compiled_grads(model, inputs, backend, steps=8)
        errors[rounding] = sum(relative_error(d, exact) ** 2 for d in draws) / len(draws)
        assert all(d.isfinite().all() for d in draws)
    assert errors["dithered"] < 0.7 * errors["stochastic"]  # 0.5 in expectation
    floats = [c for c in backends["dithered"].records[0].compressions if c.is_float and c.bits != 32]
    assert floats and all(c.dithered for c in floats)
    added = backends["dithered"].report().activation_bytes_after - backends["stochastic"].report().activation_bytes_after
    assert added == fmt.KEY_BYTES * len(floats)


def test_dithered_8_bits_match_fp32_and_32_bits_stay_bit_exact_under_inductor():
    model, inputs = model_case("block")
    (exact,), _ = compiled_grads(model, inputs, baseline_backend("inductor"))
    (eight,), _ = compiled_grads(model, inputs, gact_fx.backend(bits=8, rounding="dithered", compiler="inductor"))
    assert relative_error(eight, exact) < 2e-2
    (passed,), _ = compiled_grads(model, inputs, gact_fx.backend(bits=32, rounding="dithered", compiler="inductor"))
    assert torch.equal(passed, exact)


def test_adaptive_bits_probe_dithered_tensors():
    model, inputs = model_case("block")
    backend = gact_fx.backend(level="L2.2", rounding="dithered", probe_tensors=100, compiler="eager")
    draws, _ = compiled_grads(model, inputs, backend, steps=3)
    assert all(d.isfinite().all() for d in draws)
    sensitivities = [t.sensitivity for t in backend.controller.regions[0].tensors]
    assert sensitivities and all(s is not None and s >= 0 for s in sensitivities)


def test_compress_takes_the_rounding_and_bad_values_are_refused():
    model, inputs = model_case("block")
    compressed = gact_fx.compress(model, bits=2, rounding="dithered", compiler="eager")
    compressed(*inputs).pow(2).mean().backward()
    assert all(p.grad is not None and p.grad.isfinite().all() for p in model.parameters())
    with pytest.raises(ValueError, match=r"rounding must be one of \('stochastic', 'dithered'\)"):
        gact_fx.backend(rounding="nearest")
    with pytest.raises(ValueError, match="rounding='dithered' needs lowering='op'"):
        gact_fx.backend(rounding="dithered", lowering="aten")


def test_the_default_stores_3_bits_dithered_and_rebuilds_attentions_value():
    model, inputs = model_case("block")
    backend = gact_fx.backend()
    compiled_grads(model, inputs, backend)
    rows = backend.report().rows
    compressed = [r for r in rows if r.stored == "compressed"]
    assert compressed and all(r.dithered for r in compressed)
    assert {r.label: r.bits for r in compressed if r.bits != 3} == {"qkv:linear[0]": 8, "qkv:linear[1]": 8}  # floors
    assert all(r.bytes_after == fmt.float_blob_nbytes(r.stored_numel, r.bits, 256, 4, dithered=True) for r in compressed)
    (value,) = [r for r in rows if r.label == "qkv:linear[2]"]
    assert value.stored.startswith("rebuilt in the backward from ")
