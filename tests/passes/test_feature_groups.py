"""Groups along the tokens of one feature (``feature_groups``): ``passes.plan.feature_order``
picks the encoding order, ``passes.rewrite`` gives the backward its own layout back."""

import pytest
import torch
from torch import nn

from gact_fx.hooks import HookCompressor
from gact_fx.passes.plan import Layout, feature_order
from gact_fx.runtime import format as fmt
from gact_fx.runtime.registry import SlotRegistry

from ..helpers import flat_grad, gact_draws, relative_error
from ..helpers import one_gact_step as one_step
from ..helpers import squared_loss_grad as exact_grad


def layout(shape, perm):
    return Layout(tuple(shape), tuple(perm), dense=True, overlapping=False)


def test_the_innermost_dimension_goes_outermost():
    assert feature_order(layout((4, 128, 64), (0, 1, 2)), 256) == (2, 0, 1)
    assert feature_order(layout((4, 64, 128), (0, 2, 1)), 256) == (1, 0, 2)  # a transposed tensor's own order


@pytest.mark.parametrize("shape", [(), (4096,), (4, 64, 4), (2, 64, 64)], ids=["no dim", "one dim", "4 features", "128 tokens"])
def test_the_order_is_kept_where_feature_groups_would_not_help(shape):
    assert feature_order(layout(shape, range(len(shape))), 256) == tuple(range(len(shape)))


class Projection(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(64, 64), nn.Linear(64, 8)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


@pytest.fixture
def wide_ranges():
    """Tokens whose 64 features span two decades of scale, as trained activations do."""
    scale = torch.logspace(-1, 1, 64)[torch.randperm(64, generator=torch.Generator().manual_seed(1))]
    return torch.randn(8, 64, 64, generator=torch.Generator().manual_seed(0)) * scale


@pytest.mark.parametrize("compiler", ["eager", "inductor"])
def test_same_bytes_and_8_bit_gradients(wide_ranges, compiler):
    torch.manual_seed(0)
    model = Projection()
    on, grad = one_step(model, wide_ranges, compiler, bits=8, feature_groups=True)
    off, _ = one_step(model, wide_ranges, compiler, bits=8, feature_groups=False)
    assert {c.label: c.groups for c in on} == {"input": "feature", "relu": "feature", "le": "contiguous"}  # masks: lossless
    assert all(c.groups == "contiguous" for c in off)
    assert [c.bytes_after for c in on] == [c.bytes_after for c in off]
    assert on[0].bytes_after == fmt.float_blob_nbytes(wide_ranges.numel(), 8, 256, 4, dithered=True)
    assert relative_error(grad, exact_grad(model, wide_ranges)) < 2e-2


def test_bit_exact_at_32_bits(wide_ranges):
    torch.manual_seed(0)
    model = Projection()
    on, grad = one_step(model, wide_ranges, bits=32, feature_groups=True)
    _, baseline = one_step(model, wide_ranges, enabled=False)
    assert on and torch.equal(grad, baseline)


def test_the_aten_lowering_encodes_in_the_same_order(wide_ranges):
    torch.manual_seed(0)
    model = Projection()
    on, grad = one_step(model, wide_ranges, "inductor", bits=8, feature_groups=True, lowering="aten",
                       rounding="stochastic")
    assert on and relative_error(grad, exact_grad(model, wide_ranges)) < 2e-2


def test_per_feature_scales_cut_the_2_bit_error(wide_ranges):
    torch.manual_seed(0)
    model = Projection()
    exact = exact_grad(model, wide_ranges)

    def error(**options):
        draws = gact_draws(model, wide_ranges, 8, bits=2, **options)
        return sum(relative_error(d, exact) for d in draws) / len(draws)

    assert error(feature_groups=True) < 0.75 * error(feature_groups=False)  # measured: 0.58


def test_the_hook_fallback_groups_by_feature_too(wide_ranges):
    torch.manual_seed(0)
    model = Projection()
    exact = exact_grad(model, wide_ranges)

    def error(feature_groups):
        registry = SlotRegistry()  # held: the hooks name their site by slot only
        hooks = HookCompressor(model, registry=registry, bits=2, group_size=256, min_numel=0,
                               feature_groups=feature_groups)
        errors = []
        for _ in range(8):
            model.zero_grad(set_to_none=True)
            with hooks.active():
                model(wide_ranges).pow(2).sum().backward()
            errors.append(relative_error(flat_grad(model), exact))
        return sum(errors) / len(errors)

    assert error(True) < 0.75 * error(False)
