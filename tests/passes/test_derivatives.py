"""Saving an elementwise nonlinearity's derivative instead of its input (``passes.derivatives``)."""

import pytest
import torch
from torch import nn

from ..helpers import floor_ratio, gact_draws
from ..helpers import one_gact_step as compiled_step
from ..helpers import relative_error
from ..helpers import squared_loss_grad as exact_grad


class MLP(nn.Module):
    def __init__(self, activation):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(32, 128), nn.Linear(128, 32)
        self.activation = activation

    def forward(self, x):
        return self.fc2(self.activation(self.fc1(x)))


class GatedMLP(nn.Module):
    """Llama's MLP: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self):
        super().__init__()
        self.gate, self.up, self.down = nn.Linear(32, 128), nn.Linear(32, 128), nn.Linear(128, 32)

    def forward(self, x):
        return self.down(nn.functional.silu(self.gate(x)) * self.up(x))


class HeadMLP(nn.Module):
    """BERT's masked-LM head before the decoder: ``norm(gelu(fc1(x)))``, then ``fc2``."""

    def __init__(self):
        super().__init__()
        self.fc1, self.norm, self.fc2 = nn.Linear(32, 128), nn.LayerNorm(128), nn.Linear(128, 32)

    def forward(self, x):
        return self.fc2(self.norm(nn.functional.gelu(self.fc1(x))))


def mean_over_floor(model, x, **options) -> float:
    """The error of the mean gradient over 64 rounding seeds, against the averaging floor
    (one draw's error / 8): about 1 when the gradient is unbiased."""
    exact = exact_grad(model, x)
    return floor_ratio(gact_draws(model, x, 64, **options), exact)


@pytest.fixture
def x():
    return torch.randn(256, 32, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("compiler", ["eager", "inductor"])
def test_gelu_saves_its_derivative_and_no_more_elements(x, compiler):
    torch.manual_seed(0)
    model = MLP(nn.GELU())
    on, grad = compiled_step(model, x, compiler, bits=8)
    off, _ = compiled_step(model, x, compiler, bits=8, save_derivatives=False)
    assert {c.label: c.use for c in off}["fc1:linear"] == "smooth"
    labels = {c.label: c.use for c in on}
    assert "fc1:linear" not in labels and labels["fc1:linear'"] == "linear"
    assert sum(c.numel for c in on) == sum(c.numel for c in off)
    assert relative_error(grad, exact_grad(model, x)) < 2e-2


def test_silu_s_two_factors_become_one_tensor(x):
    torch.manual_seed(0)
    model = MLP(nn.SiLU())
    on, grad = compiled_step(model, x, bits=8)
    off, _ = compiled_step(model, x, bits=8, save_derivatives=False)
    assert [c.label for c in on if c.label.endswith("'")] == ["fc1:linear'"]
    assert sum(c.numel for c in on) == sum(c.numel for c in off)
    assert all(c.use == "linear" for c in on)
    assert relative_error(grad, exact_grad(model, x)) < 2e-2


def test_a_gated_mlp_saves_both_of_its_factors_linearly(x):
    torch.manual_seed(0)
    model = GatedMLP()
    # without the derivatives the up projection's output could be rebuilt from the input
    on, grad = compiled_step(model, x, bits=8, recompute_projections=False)
    off, _ = compiled_step(model, x, bits=8, save_derivatives=False, recompute_projections=False)
    assert sum(c.numel for c in on) == sum(c.numel for c in off)
    assert any(c.use != "linear" for c in off) and all(c.use == "linear" for c in on)
    assert relative_error(grad, exact_grad(model, x)) < 2e-2


def test_a_value_also_needed_linearly_stays_saved(x):
    # tanh's backward reads its output y through 1 - y*y, but fc2 needs y itself: saving
    # the factor too would add a tensor
    torch.manual_seed(0)
    on, _ = compiled_step(MLP(nn.Tanh()), x, bits=8)
    assert not [c.label for c in on if c.label.endswith("'")]
    assert {c.label: c.use for c in on}["activation:tanh"] == "smooth"  # 1 - y*y: y times itself


def test_at_coarse_bits_tanh_saves_its_derivative_for_one_tensor_more(x):
    # at 2 bits 1 - y*y from a rounded y is biased: the factor moves to the forward
    # although fc2 still needs y, and the mean over seeds reaches the floor
    torch.manual_seed(0)
    model = MLP(nn.Tanh())
    on, _ = compiled_step(model, x, bits=2)
    off, _ = compiled_step(model, x, bits=2, save_derivatives=False)
    assert {c.label: c.use for c in on if c.label.startswith("activation")} == {
        "activation:tanh": "linear", "activation:tanh'": "linear"}
    assert sum(c.numel for c in on) == sum(c.numel for c in off) + 256 * 128
    only_tanh = {"bits": 2, "overrides": {"activation:tanh*": 2, "*": 32}}
    for rounding in ("dithered", "stochastic"):
        assert mean_over_floor(model, x, **only_tanh, rounding=rounding) <= 1.5
    # dithering halves the variance, and with it this bias: stochastic rounding shows it plainly
    assert mean_over_floor(model, x, **only_tanh, save_derivatives=False, rounding="stochastic") > 2


def test_nothing_moves_at_32_bits(x):
    torch.manual_seed(0)
    model = MLP(nn.GELU())
    on, grad = compiled_step(model, x, bits=32)
    assert not [c for c in on if c.label.endswith("'")]
    off, same = compiled_step(model, x, enabled=False)
    assert torch.equal(grad, same)


def test_an_override_naming_the_input_applies_to_its_derivative(x):
    torch.manual_seed(0)
    on, _ = compiled_step(MLP(nn.GELU()), x, bits=2, overrides={"fc1:linear": 8})
    assert {c.label: c.bits for c in on}["fc1:linear'"] == 8


def test_the_mean_gradient_over_seeds_reaches_the_floor_at_2_bits(x):
    # one compressed tensor, GELU's: without the pass the mean stays away from the floor
    torch.manual_seed(0)
    model = MLP(nn.GELU())
    only_fc1 = {"bits": 2, "overrides": {"fc1:linear": 2, "*": 32}}
    assert mean_over_floor(model, x, **only_fc1) <= 1.5
    assert mean_over_floor(model, x, **only_fc1, save_derivatives=False) > 2


def test_a_gelu_before_a_layernorm_saves_its_derivative_and_output_for_one_tensor_more(x):
    # the backward rebuilds both gelu'(h) and the LayerNorm's input gelu(h) from h: both
    # move to the forward, h goes, and the mean over seeds reaches the floor at 2 bits
    torch.manual_seed(0)
    model = HeadMLP()
    on, grad = compiled_step(model, x, bits=2)
    off, _ = compiled_step(model, x, bits=2, save_derivatives=False)
    assert {c.label: c.use for c in off}["fc1:linear"] == "smooth"
    assert "fc1:linear" not in {c.label for c in on}
    assert [c.use for c in on if c.label.startswith("fc1:linear'")] == ["smooth", "linear"]  # gelu(h), gelu'(h)
    assert sum(c.numel for c in on) <= sum(c.numel for c in off) + 256 * 128
    only_fc1 = {"bits": 2, "overrides": {"fc1:linear*": 2, "*": 32}}
    assert mean_over_floor(model, x, **only_fc1) <= 1.5
    assert mean_over_floor(model, x, **only_fc1, save_derivatives=False) > 2
