"""Cancelling the bias of rounded query and key in an attention backward (``passes.debias``)."""

import pytest
import torch

import gact_fx
from gact_fx.runtime import format as fmt
from gact_fx.runtime import kernels, noise
from gact_fx.runtime.ops import REDRAW_SALT, redither

from ..helpers import gact_draws, relative_error
from ..helpers import one_gact_step as one_step
from ..helpers import squared_loss_grad as exact_grad
from ..runtime.sites import REGISTRY
from .test_attention import Attention

DITHERED_4_BITS = {"bits": 4, "nonlinear_bits": 4, "rounding": "dithered"}


@pytest.fixture
def x():
    return torch.randn(8, 64, 32, generator=torch.Generator().manual_seed(0))


def mean_over_floor(model, x, draws, **options) -> tuple[float, float]:
    """One draw's error, and the error of the mean of ``draws`` over the averaging floor."""
    grads = gact_draws(model, x, draws, **options)
    exact = exact_grad(model, x)
    single = sum(relative_error(g, exact) for g in grads) / draws
    return single, relative_error(torch.stack(grads).mean(0), exact) / (single / draws**0.5)


@pytest.mark.compat  # the pass reads aten's SDPA schemas and rewrites FX graphs: both move
def test_the_mean_gradient_of_4_bit_query_and_key_reaches_the_averaging_floor(x):
    # sharp attention (as training makes it) at 4 bits: the softmax's curvature biases the
    # plain gradient well past the floor; the debiased one sits on it, for a little more noise
    torch.manual_seed(0)
    model = Attention(sharpness=3.0)
    plain_error, plain = mean_over_floor(model, x, 64, **DITHERED_4_BITS)
    debiased_error, debiased = mean_over_floor(model, x, 64, debias_attention=True, **DITHERED_4_BITS)
    assert plain > 1.5
    assert debiased < 1.2
    assert debiased_error < 1.3 * plain_error


@pytest.mark.compat
def test_the_backward_runs_each_attention_at_three_points_in_one_graph(x):
    torch.manual_seed(0)
    model = Attention()
    backend = gact_fx.backend(compiler="eager", min_numel=0, debias_attention=True, **DITHERED_4_BITS)
    counters = torch._dynamo.utils.counters
    counters.clear()
    torch._dynamo.reset()
    torch.compile(model, backend=backend, fullgraph=True)(x).pow(2).sum().backward()
    assert counters["stats"]["unique_graphs"] == 1
    backward = backend.report().records[0].code_after[1]
    assert backward.count("flash_attention_for_cpu_backward.default(") == 3
    assert backward.count("gact.redither.default(") == 2  # query and key; value enters linearly
    assert "debias attention" in [run.name for run in backend.report().records[0].passes]


def test_nothing_changes_at_32_bits(x):
    torch.manual_seed(0)
    model = Attention()
    _, grad = one_step(model, x, bits=32, rounding="dithered", debias_attention=True)
    _, baseline = one_step(model, x, enabled=False)
    assert torch.equal(grad, baseline)


@pytest.mark.compat
@pytest.mark.parametrize("compiler", ["eager", "inductor"])
def test_8_bits_stay_close_to_the_exact_gradient(x, compiler):
    torch.manual_seed(0)
    model = Attention(sharpness=2.0)
    _, grad = one_step(model, x, compiler, bits=8, rounding="dithered", debias_attention=True)
    assert relative_error(grad, exact_grad(model, x)) < 2e-2


def test_stochastic_rounding_is_refused_by_name():
    with pytest.raises(ValueError, match="debias_attention=True .* needs rounding='dithered'"):
        gact_fx.backend(debias_attention=True, bits=4, rounding="stochastic")


def test_redither_changes_only_the_kept_key_and_so_only_the_noise():
    site = REGISTRY.new_site()
    site.dithered = True
    x = torch.randn(3000)
    blob = kernels.encode(x, 3, 256, key=noise.key_of(5, 6), dithered=True)
    again = redither(blob, [x.numel()], 256, site.slot)
    start = fmt.key_offset(x.numel(), 3, 256) + fmt.KEY_BYTES // 2
    changed = (again != blob).nonzero().flatten().tolist()
    assert changed == list(range(start, start + 4))
    assert torch.equal(again[start : start + 4], blob[start : start + 4] ^ REDRAW_SALT)
    first, second = (kernels.decode(b, x.numel(), x.dtype, 256, dithered=True) for b in (blob, again))
    step = (x.max() - x.min()) / 7  # the largest step any group can have
    assert 0 < (first - second).abs().max() <= step * 1.01  # other noise over the same codes
    plain_site = REGISTRY.new_site()
    assert torch.equal(redither(blob, [x.numel()], 256, plain_site.slot), blob)  # a site that does not dither


def test_redither_passes_opcheck():
    site = REGISTRY.new_site()
    site.dithered = True
    blob = kernels.encode(torch.randn(1000), 4, 256, key=noise.key_of(1, 2), dithered=True)
    torch.library.opcheck(torch.ops.gact.redither.default, (blob, [1000], 256, site.slot))


def test_only_query_and_key_left_biased_are_warned_about(x, caplog):
    torch.manual_seed(0)
    with caplog.at_level("WARNING", logger="gact_fx"):
        one_step(Attention(), x, **DITHERED_4_BITS)
    assert "reads through an exponential" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="gact_fx"):
        one_step(Attention(), x, debias_attention=True, **DITHERED_4_BITS)
    assert "reads through an exponential" not in caplog.text


def test_debiasing_without_the_recomputed_output_is_refused_by_name():
    with pytest.raises(ValueError, match="needs recompute_attention=True"):
        gact_fx.backend(debias_attention=True, recompute_attention=False, rounding="dithered")
