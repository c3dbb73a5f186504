"""The Hadamard rotation option (runtime.rotation): orthogonal, applied where it divides, same bytes, unbiased gradients."""

import pytest
import torch

import gact_fx
from gact_fx.runtime import rotation

from .helpers import baseline_backend, compiled_grads, model_case, one_gact_step, relative_error, squared_loss_grad
from .passes.test_attention import Attention
from .passes.test_debias import mean_over_floor


@pytest.mark.parametrize("block", rotation.BLOCKS)
def test_the_rotation_is_orthogonal_and_comes_back(block):
    matrix = rotation.rotation_matrix(block, torch.device("cpu"))
    assert torch.allclose(matrix @ matrix.T, torch.eye(block), atol=1e-6)
    assert (matrix[:, 0] > 0).any() and (matrix[:, 0] < 0).any()  # random signs: the plain H's first column is all +
    x = torch.randn(3, 5, 2 * block)
    rotated = rotation.rotate(x, block)
    assert rotated.shape == x.shape and not torch.allclose(rotated, x)
    assert torch.allclose(rotation.unrotate_(rotated.clone(), block), x, atol=1e-5)
    columns = torch.randn(2 * block, 7).t()  # a decoded tensor in another layout keeps it
    back = rotation.unrotate_(columns.clone(), block)
    assert back.stride() == columns.stride()


def test_only_lossy_float_tensors_whose_innermost_dimension_it_divides_are_rotated():
    assert rotation.rotates((4, 64), torch.float32, 2, 32)
    assert rotation.rotates((4, 64), torch.bfloat16, 8, 64)
    assert not rotation.rotates((4, 48), torch.float32, 2, 32)
    assert not rotation.rotates((4, 64), torch.bool, 1, 32)
    assert not rotation.rotates((4, 64), torch.float32, 32, 32)
    assert not rotation.rotates((4, 64), torch.float32, 2, 0)
    with pytest.raises(ValueError, match=r"rotation must be 0 \(off\) or one of"):
        gact_fx.backend(rotation=24)
    with pytest.raises(ValueError, match="rotation needs lowering='op'"):
        gact_fx.backend(rotation=32, lowering="aten")


def test_rotated_8_bit_gradients_match_fp32_at_the_same_bytes():
    model, inputs = model_case("block")
    (exact,), _ = compiled_grads(model, inputs, baseline_backend())
    plain, rotated = gact_fx.backend(bits=8, compiler="eager"), gact_fx.backend(bits=8, rotation=32, compiler="eager")
    (plain_grad,), _ = compiled_grads(model, inputs, plain)
    (rotated_grad,), _ = compiled_grads(model, inputs, rotated)
    assert relative_error(rotated_grad, exact) < 2e-2
    assert rotated_grad.isfinite().all() and not torch.equal(rotated_grad, plain_grad)
    assert rotated.report().activation_bytes_after == plain.report().activation_bytes_after
    floats = [c for c in rotated.records[0].compressions if c.is_float]
    assert {c.rotation for c in floats} == {0, 32}  # the block's 64-wide tensors rotate, its 16-wide heads do not
    assert all(c.rotation == 0 for c in rotated.records[0].compressions if not c.is_float)
    rows = {row.label: row.groups for row in rotated.report().rows if row.stored == "compressed"}
    assert rows["gelu"] == "feature, Hadamard 32" and rows["qkv:linear[0]"] == "feature"  # what the viewer shows
    by_label = {c.label: c.rotation for c in floats}
    assert by_label["gelu"] == 32 and by_label["proj:linear"] == 32 and by_label["qkv:linear[0]"] == 0


def test_32_bits_stay_bit_exact_with_rotation_on():
    model, inputs = model_case("block")
    (exact,), _ = compiled_grads(model, inputs, baseline_backend())
    (passed,), _ = compiled_grads(model, inputs, gact_fx.backend(bits=32, rotation=32, compiler="eager"))
    assert torch.equal(passed, exact)
    backend = gact_fx.backend(bits=2, rotation=32, overrides={"gelu": 32}, compiler="eager")
    compiled_grads(model, inputs, backend)
    rotations = {c.label: c.rotation for c in backend.records[0].compressions}
    assert rotations["gelu"] == 0 and rotations["proj:linear"] == 32  # stored as is: nothing to rotate


def test_adaptive_bits_probe_rotated_tensors():
    model, inputs = model_case("block")
    backend = gact_fx.backend(level="L2.2", rotation=32, probe_tensors=100, compiler="eager")
    draws, _ = compiled_grads(model, inputs, backend, steps=3)
    assert all(d.isfinite().all() for d in draws)
    sensitivities = [t.sensitivity for t in backend.controller.regions[0].tensors]
    assert sensitivities and all(s is not None and s >= 0 for s in sensitivities)


def outlier_attention():
    """Sharp causal attention whose query and key carry one outlier dimension a head."""
    torch.manual_seed(0)
    model = Attention(sharpness=2.0)
    with torch.no_grad():
        for head in range(model.heads):
            model.qkv.weight[head * 16 + 3] *= 6  # the query's
            model.qkv.weight[32 + head * 16 + 3] *= 6  # the key's
    return model, torch.randn(8, 64, 32, generator=torch.Generator().manual_seed(0))


def test_nonlinear_rotation_rotates_only_query_and_key():
    model, x = outlier_attention()
    compressions, _ = one_gact_step(model, x, bits=4, nonlinear_bits=4, nonlinear_rotation=16, recompute_projections=False)
    assert {(c.use, c.rotation) for c in compressions} == {("exponential", 16), ("linear", 0)}
    assert [c.use for c in compressions].count("exponential") == 2


@pytest.mark.parametrize("rounding", ["stochastic", "dithered"])
def test_nonlinear_rotation_shrinks_the_noise_of_query_and_key_with_outliers(rounding):
    model, x = outlier_attention()
    options = {"bits": 4, "nonlinear_bits": 4, "rounding": rounding, "debias_attention": rounding == "dithered"}
    plain_error, plain_bias = mean_over_floor(model, x, 32, **options)
    rotated_error, rotated_bias = mean_over_floor(model, x, 32, nonlinear_rotation=16, **options)
    # measured: one draw 0.171 -> 0.096 stochastic, 0.157 -> 0.071 debiased; the mean
    # over the floor 2.88 -> 1.56 and 1.62 -> 0.97
    assert rotated_error < 0.7 * plain_error
    assert rotated_bias < plain_bias
    if rounding == "dithered":
        assert rotated_bias < 1.3


def test_nonlinear_rotation_keeps_8_bits_close_and_32_bits_exact():
    model, x = outlier_attention()
    exact = squared_loss_grad(model, x)
    _, grad = one_gact_step(model, x, bits=8, nonlinear_rotation=16)
    assert relative_error(grad, exact) < 2e-2
    compressions, grad = one_gact_step(model, x, bits=32, nonlinear_rotation=16)
    assert all(c.rotation == 0 for c in compressions)
    _, baseline = one_gact_step(model, x, enabled=False)
    assert torch.equal(grad, baseline)
