"""The saved-tensor hooks of ``compress(..., fallback="hooks")`` around a fused attention."""

import torch

from gact_fx.hooks import ATTENTION_FLOOR, HookCompressor
from gact_fx.runtime.registry import SlotRegistry

from .helpers import flat_grad, relative_error, squared_loss_grad
from .passes.test_attention import Attention


def hook_step(model, x, compressor):
    model.zero_grad()
    with compressor.active():
        out = model(x)
    out.pow(2).sum().backward()
    return flat_grad(model)


def test_a_fused_attention_is_saved_at_its_floor_with_its_logsumexp_exact():
    # its backward rebuilds the softmax from query, key and logsumexp: at 2 bits, rounded
    # apart, the gradient of sharp attention overflowed to inf
    torch.manual_seed(0)
    model = Attention(sharpness=6.0)
    x = torch.randn(8, 64, 32, generator=torch.Generator().manual_seed(0))
    exact = squared_loss_grad(model, x)
    registry = SlotRegistry()
    compressor = HookCompressor(model, registry=registry, bits=2, group_size=256, min_numel=0)
    assert compressor.attention_bits == ATTENTION_FLOOR
    grads = [hook_step(model, x, compressor) for _ in range(3)]
    assert all(torch.isfinite(g).all() for g in grads)
    assert max(relative_error(g, exact) for g in grads) < 0.5  # measured 0.27
    rounded = compressor.last_step

    exact_attention = HookCompressor(model, registry=registry, bits=2, group_size=256, min_numel=0, nonlinear_bits=32)
    hook_step(model, x, exact_attention)
    # query, key, value and output kept as they are; the logsumexp was already
    assert exact_attention.last_step.kept == rounded.kept + 4
    assert exact_attention.last_step.packed == rounded.packed - 4
    assert compressor.attention_shapes is None  # nothing left watching after the forward
