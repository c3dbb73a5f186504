"""A rebuilt value runs its fused QKV projection for the value's columns only (``passes.narrow``)."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import gact_fx
from gact_fx.passes import affine
from gact_fx.passes.narrow import find_narrowing
from gact_fx.runtime.ops import blob_nbytes

from ..helpers import (HFWrapper, baseline_backend, compiled_grads, dynamic_batch_steps, one_graph_step,
                       relative_error, squared_loss_grad, tiny_gpt2)


def fused_heads(qkv, heads):  # the char GPT's and timm's layout
    b, t, n = qkv.shape
    return qkv.view(b, t, 3, heads, n // 3 // heads).permute(2, 0, 3, 1, 4).unbind(0)


def split_columns(qkv, heads):  # nanoGPT's and GPT-2's
    b, t, n = qkv.shape
    return [z.view(b, t, heads, n // 3 // heads).transpose(1, 2) for z in qkv.split(n // 3, dim=2)]


def unbind_then_transpose(qkv, heads):  # ModernBERT's
    b, t, n = qkv.shape
    return [z.transpose(1, 2) for z in qkv.view(b, t, 3, -1, n // 3 // heads).unbind(dim=-3)]


def interleaved_heads(qkv, heads):  # GPT-NeoX's: each head's query, key and value side by side
    b, t, n = qkv.shape
    return qkv.view(b, t, heads, n // heads).transpose(1, 2).split(n // 3 // heads, dim=-1)


class Attention(nn.Module):
    def __init__(self, layout, dim: int = 64, heads: int = 4):
        super().__init__()
        self.layout, self.heads = layout, heads
        self.ln, self.qkv, self.proj = nn.LayerNorm(dim), nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x):
        q, k, v = self.layout(self.qkv(self.ln(x)), self.heads)
        return x + self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).flatten(2))


X = torch.randn(8, 32, 64, generator=torch.Generator().manual_seed(1))
# the output columns each layout's rebuilt value reads: the value's third, one range or a range per head
LAYOUTS = {
    "fused heads": (fused_heads, ((128, 192),)),
    "split columns": (split_columns, ((128, 192),)),
    "unbind, then transpose": (unbind_then_transpose, ((128, 192),)),
    "interleaved heads": (interleaved_heads, ((32, 48), (80, 96), (128, 144), (176, 192))),
}


def attention(layout):
    def make():
        torch.manual_seed(0)
        return Attention(layout)
    return make


def spy_on_narrowing(monkeypatch, narrow: bool = True) -> list:
    """The column range of each narrowing found from now on (``None`` where none is);
    ``narrow=False``: the rebuilds run whole."""
    found = []

    def spy(carrier, chain):
        narrowing = find_narrowing(carrier, chain) if narrow else None
        found.append(narrowing and narrowing.spans)
        return narrowing

    monkeypatch.setattr(affine, "find_narrowing", spy)
    return found


def step(make, monkeypatch, narrow: bool):
    """The report, the gradient, and the column range of each narrowing found."""
    found = spy_on_narrowing(monkeypatch, narrow)
    gact_fx.manual_seed(0)
    report, grad = one_graph_step(make, X, bits=8, recompute_projections=True)
    return report, grad, found


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_value_is_rebuilt_from_its_own_columns_and_the_gradient_is_the_whole_rebuilds(layout, monkeypatch):
    make, columns = attention(LAYOUTS[layout][0]), LAYOUTS[layout][1]
    report, narrowed, found = step(make, monkeypatch, narrow=True)
    assert found == [columns]  # one rebuild through the projection: the value
    _, whole, _ = step(make, monkeypatch, narrow=False)
    torch.testing.assert_close(narrowed, whole, rtol=1e-5, atol=1e-6)  # the same rounding draws
    assert relative_error(narrowed, squared_loss_grad(make(), X)) < 2e-2
    stored = one_graph_step(make, X, bits=8, recompute_projections=False)[0]  # the value stored
    value_blob = blob_nbytes(X.numel(), X.dtype, 8, 256, dithered=True)
    assert report.activation_bytes_after == stored.activation_bytes_after - value_blob


def test_a_dynamic_batch_narrows_without_specialising_it(monkeypatch):
    found = spy_on_narrowing(monkeypatch)
    dynamic_batch_steps(attention(split_columns), X, bits=8, recompute_projections=True)
    assert found == [((128, 192),)]


def test_transformers_gpt2s_values_are_rebuilt_from_their_columns(monkeypatch):
    found = spy_on_narrowing(monkeypatch)
    torch.manual_seed(0)
    model = tiny_gpt2()
    tokens = torch.randint(0, 128, (4, 32), generator=torch.Generator().manual_seed(0))
    (exact,), _ = compiled_grads(model, (tokens,), baseline_backend())
    torch._dynamo.reset()
    backend = gact_fx.backend(compiler="eager", bits=8, recompute_projections=True)
    (grad,), _ = compiled_grads(model, (tokens,), backend)
    assert found == [((128, 192),)] * 2  # each layer's value: the last third of c_attn's columns
    assert len([r for r in backend.report().rows if r.stored.startswith("rebuilt") and len(r.shape) == 4]) == 2
    assert relative_error(grad, exact) < 2e-2


def test_transformers_gpt_neoxs_interleaved_values_are_rebuilt_from_their_columns(monkeypatch):
    from transformers import GPTNeoXConfig, GPTNeoXModel

    found = spy_on_narrowing(monkeypatch)
    torch.manual_seed(0)
    config = GPTNeoXConfig(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=128, max_position_embeddings=64, attn_implementation="sdpa")
    model = HFWrapper(GPTNeoXModel(config))
    tokens = torch.randint(0, 128, (4, 32), generator=torch.Generator().manual_seed(0))
    (exact,), _ = compiled_grads(model, (tokens,), baseline_backend())
    torch._dynamo.reset()
    backend = gact_fx.backend(compiler="eager", bits=8, recompute_projections=True)
    (grad,), _ = compiled_grads(model, (tokens,), backend)
    # each layer's value: the last 16 of each head's 48 columns of query_key_value
    assert found == [((32, 48), (80, 96), (128, 144), (176, 192))] * 2
    assert len([r for r in backend.report().rows if r.stored.startswith("rebuilt") and len(r.shape) == 4]) == 2
    assert relative_error(grad, exact) < 2e-2
