"""Recomputing a fused attention's output and logsumexp in its backward (``passes.attention``)."""

import pytest
import torch
from torch import nn

import gact_fx

from ..helpers import floor_ratio, gact_draws, relative_error
from ..helpers import one_gact_step as one_step
from ..helpers import squared_loss_grad as exact_grad


class Attention(nn.Module):
    """Causal self-attention; ``sharpness`` scales the query and key weights, as training does."""

    def __init__(self, dim=32, heads=2, sharpness=1.0):
        super().__init__()
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.heads = heads
        with torch.no_grad():
            self.qkv.weight[: 2 * dim] *= sharpness

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


@pytest.fixture
def x():
    return torch.randn(8, 64, 32, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("compiler", ["eager", "inductor"])
def test_the_logsumexp_is_no_longer_saved_and_value_stays_linear(x, compiler):
    torch.manual_seed(0)
    model = Attention()
    stored_value = {"recompute_projections": False}  # the value's row, not its rebuild
    on, grad = one_step(model, x, compiler, bits=8, **stored_value)
    off, _ = one_step(model, x, compiler, bits=8, recompute_attention=False, exact_statistics=False, **stored_value)
    # off: q, k, the logsumexp (exponential), v, the output (linear); on: no logsumexp
    assert sorted(c.use for c in off).count("exponential") == 3
    assert [c.use for c in on].count("exponential") == 2
    assert {c.label: c.use for c in on}["qkv:linear[2]"] == "linear"
    assert sum(c.numel for c in on) == sum(c.numel for c in off) - x.shape[0] * 2 * x.shape[1]
    assert relative_error(grad, exact_grad(model, x)) < 2e-2


def test_nothing_changes_at_32_bits(x):
    torch.manual_seed(0)
    model = Attention()
    on, grad = one_step(model, x, bits=32)
    off, same = one_step(model, x, bits=32, recompute_attention=False)
    assert [c.label for c in on] == [c.label for c in off]
    _, baseline = one_step(model, x, enabled=False)
    assert torch.equal(grad, baseline) and torch.equal(same, baseline)


def test_a_consistent_output_lowers_the_error_of_sharp_attention_at_2_bits(x):
    # value and output rounded apart break D = rowsum(grad_out * out); q and k multiply it
    torch.manual_seed(0)
    model = Attention(sharpness=3.0)
    exact = exact_grad(model, x)

    def mean_error(**options):
        errors = [relative_error(g, exact) for g in gact_draws(model, x, 8, bits=2, **options)]
        return sum(errors) / len(errors)

    assert mean_error() < 0.8 * mean_error(recompute_attention=False)


def test_a_logsumexp_rounded_apart_from_query_and_key_biases_the_gradient(x):
    # what recomputing it removes: exp(q k^T - lse) with lse's own rounding has rows that do
    # not sum to 1, and exp of a zero-mean error has a mean above 1. Everything else exact.
    torch.manual_seed(0)
    model = Attention(sharpness=2.0)
    lse_alone = {"bits": 32, "recompute_attention": False, "exact_statistics": False,
                 "overrides": {"scaled_dot_product_attention": 2, "*": 32}}
    assert floor_ratio(gact_draws(model, x, 16, **lse_alone), exact_grad(model, x)) > 2.5


def test_without_the_recomputation_the_saved_logsumexp_is_kept_exact(x):
    torch.manual_seed(0)
    backend = gact_fx.backend(compiler="eager", bits=2, min_numel=0, recompute_attention=False)
    torch.compile(Attention(), backend=backend, fullgraph=True)(x).pow(2).sum().backward()
    (row,) = [r for r in backend.report().rows if r.bits is None and "row statistic" in r.stored]
    assert "scaled_dot_product" in row.stored
    assert row.bytes_after == row.bytes_before == x.shape[0] * 2 * x.shape[1] * 4


@pytest.mark.parametrize("variant", ["flash_attention", "flash_attention_for_cpu", "efficient_attention",
                                     "cudnn_attention", "fused_attention_overrideable"])
def test_every_sdpa_backward_finds_its_forward_and_its_arguments(variant):
    # the GPU variants cannot run here: check that the forward is called on the
    # backward's own query, key, value, mask and flags, and asks for the logsumexp
    from gact_fx.passes.attention import forward_call, sdpa_forward_of

    backward = getattr(torch.ops.aten, f"_scaled_dot_product_{variant}_backward").default
    node = type("Node", (), {"target": backward})()
    forward = sdpa_forward_of(node)
    assert forward is getattr(torch.ops.aten, f"_scaled_dot_product_{variant}").default
    bound = {a.name: f"<{a.name}>" for a in backward._schema.arguments}
    args, kwargs = forward_call(forward, bound)
    called = dict(zip((a.name for a in forward._schema.arguments), args)) | kwargs
    for name in ("query", "key", "value", "dropout_p", "is_causal", "scale"):
        assert called[name] == f"<{name}>"
    mask = {"attn_bias", "attn_mask"} & called.keys()
    assert all(called[name] in ("<attn_bias>", "<attn_mask>") for name in mask)
    assert called.get("compute_log_sumexp", True) is True and called.get("return_debug_mask", False) is False
