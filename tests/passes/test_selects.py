"""Saved selects between two constants are rebuilt from their bool mask (``passes.selects``)."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import gact_fx
from gact_fx.passes.saved import find_saved
from gact_fx.passes.selects import rebuild_selects
from gact_fx.runtime import format as fmt

from ..helpers import flat_grad, relative_error
from .graphs import Builder, FakeTensorMode, aten

pytestmark = pytest.mark.compat


class PaddedAttention(nn.Module):
    """One attention layer over a padded batch: a bool key-padding mask, expanded over queries."""

    def __init__(self, dim: int = 32, heads: int = 2):
        super().__init__()
        self.heads = heads
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x, keep):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        mask = keep[:, None, None, :].expand(b, 1, t, t)
        attention = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out(attention.transpose(1, 2).reshape(b, t, d))


def select_pair(constant_branch: bool = True):
    """``out = x * where(expand(keep), 0.3, -1.7)`` (or ``where(expand(keep), x, -1.7)``): saves the select."""
    mode = FakeTensorMode()
    x, keep = torch.randn(4, 16, 32), torch.rand(4, 16) > 0.3
    f = Builder(mode)
    fx_, fkeep = f.input("x", x), f.input("keep", keep)
    condition = f(aten.expand.default, f(aten.unsqueeze.default, fkeep, 2), [4, 16, 32])
    if_true = f(aten.scalar_tensor.default, 0.3) if constant_branch else fx_
    select = f(aten.where.self, condition, if_true, f(aten.scalar_tensor.default, -1.7))
    fw = f.output(f(aten.mul.Tensor, fx_, select), select)

    b = Builder(mode)
    bselect, tangent = b.input("where", torch.randn(4, 16, 32)), b.input("tangents_1", torch.randn(4, 16, 32))
    bw = b.output(b(aten.mul.Tensor, tangent, bselect), None)
    return fw, bw, (x, keep)


def _padded(batch=4, tokens=16, dim=32):
    torch.manual_seed(0)
    x = torch.randn(batch, tokens, dim)
    keep = torch.ones(batch, tokens, dtype=torch.bool)
    keep[1, 10:] = False
    keep[3, 5:] = False
    return x, keep


def _run(model, x, keep, **options):
    torch._dynamo.reset()
    model.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_()
    backend = gact_fx.backend(compiler="eager", min_numel=0, **options)
    torch.compile(model, backend=backend, fullgraph=True)(x, keep).square().sum().backward()
    return torch.cat([x.grad.flatten(), flat_grad(model)]), backend.report()


def _eager(model, x, keep):
    model.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_()
    model(x, keep).square().sum().backward()
    return torch.cat([x.grad.flatten(), flat_grad(model)])


def test_a_select_of_two_constants_is_rebuilt_bit_for_bit_from_its_bool_mask():
    fw, bw, (x, keep) = select_pair()
    reference_bw = torch.fx.GraphModule(bw, bw.graph.__deepcopy__())
    assert rebuild_selects(fw, bw, find_saved(fw, bw, 1)) == 1
    assert [v.node.name for v in find_saved(fw, bw, 1).tensors] == ["keep"]  # before its expand
    rebuilt = [n for n in bw.graph.nodes if n.meta.get("gact", {}).get("role") == "rebuilt"]
    assert [n.target for n in rebuilt] == [aten.where.self]
    tangent = torch.randn(4, 16, 32)
    select = torch.where(keep[:, :, None].expand(4, 16, 32), 0.3, -1.7)
    out, saved_keep = fw(x, keep)
    assert torch.equal(bw(saved_keep, tangent)[0], reference_bw(select, tangent)[0])


def test_a_select_with_a_tensor_branch_or_kept_exact_is_not_rebuilt():
    fw, bw, _ = select_pair(constant_branch=False)
    assert rebuild_selects(fw, bw, find_saved(fw, bw, 1)) == 0
    fw, bw, _ = select_pair()
    assert rebuild_selects(fw, bw, find_saved(fw, bw, 1), quantized=set()) == 0


def test_an_attention_masks_select_is_stored_as_its_one_bit_mask():
    x, keep = _padded()
    model = PaddedAttention()
    exact = _eager(model, x, keep)
    grad, report = _run(model, x, keep, bits=8)
    assert relative_error(grad, exact) < 2e-2
    (select,) = [r for r in report.rows if r.producer == "where.self"]
    assert select.shape == (4, 1, 16, 16) and select.bytes_after == 0
    assert select.stored.startswith("rebuilt in the backward from ")
    (mask,) = [r for r in report.rows if r.dtype == "bool"]
    assert mask.shape == (4, 16) and mask.bits == 1 and mask.bytes_after == fmt.bool_blob_nbytes(keep.numel())


def test_at_32_bits_the_attention_mask_is_saved_as_the_stock_partition_saves_it():
    x, keep = _padded()
    _, report = _run(PaddedAttention(), x, keep, bits=32)
    assert not [r for r in report.rows if r.stored.startswith("rebuilt")]
    (select,) = [r for r in report.rows if r.producer == "where.self"]
    assert select.bits == 32 and select.dtype == "float32" and select.bytes_after > 0


def test_under_dynamic_shapes_the_rebuilt_mask_follows_the_batch():
    x, keep = _padded()
    model = PaddedAttention()
    torch._dynamo.reset()
    backend = gact_fx.backend(compiler="eager", min_numel=0, bits=8)
    compiled = torch.compile(model, backend=backend, fullgraph=True, dynamic=True)
    for batch in (4, 3):
        model.zero_grad(set_to_none=True)
        inputs = x[:batch].clone().requires_grad_()
        compiled(inputs, keep[:batch]).square().sum().backward()
        got = torch.cat([inputs.grad.flatten(), flat_grad(model)])
        assert relative_error(got, _eager(model, x[:batch], keep[:batch])) < 2e-2
    assert [r for r in backend.report().rows if r.stored.startswith("rebuilt in the backward from ")]
