"""Hostile and odd inputs through the gact backend: each gives a right answer or a clear error."""

import copy
import logging

import pytest
import torch
import torch.nn as nn

import gact_fx

from .helpers import MLP, ConvBlock, baseline_backend, flat_grad, model_case, projection_loss, relative_error


def grads(model, inputs, backend, loss=projection_loss):
    model = copy.deepcopy(model)
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    torch.manual_seed(0)
    loss(compiled(*inputs)).backward()
    return flat_grad(model)


def compressed_grads(model, inputs, backend, loss=projection_loss):
    """``grads``, after checking that the backend did compress something (else the test proves nothing)."""
    result = grads(model, inputs, backend, loss)
    report = backend.report()
    assert report.activation_bytes_after < report.activation_bytes_before
    return result


@pytest.mark.parametrize("bits", [8, 2])
def test_non_finite_activations_are_never_hidden(bits):
    model, (x,) = model_case("mlp")
    poisoned = x.clone()
    poisoned[3, 5] = float("nan")
    assert not torch.isfinite(grads(model, (poisoned,), baseline_backend())).all()
    assert not torch.isfinite(compressed_grads(model, (poisoned,), gact_fx.backend(bits=bits))).all()
    assert torch.isfinite(compressed_grads(model, (x,), gact_fx.backend(bits=bits))).all()  # and a finite step stays finite


@pytest.mark.parametrize("rounding", ["stochastic", "dithered"])
@pytest.mark.parametrize("dtype,magnitude", [(torch.float32, 1e30), (torch.bfloat16, 1e30), (torch.float16, 3e3)])
def test_huge_magnitudes_stay_finite(dtype, magnitude, rounding):
    model = nn.Sequential(nn.Linear(64, 256), nn.Tanh(), nn.Linear(256, 8)).to(dtype)
    x = (torch.rand(64, 64) * 2 - 1).to(dtype) * magnitude  # saved as the first Linear's input
    loss = lambda out: out.float().sum()  # noqa: E731
    expected = grads(model, (x,), baseline_backend(), loss)
    got = compressed_grads(model, (x,), gact_fx.backend(bits=8, min_numel=0, rounding=rounding), loss)
    assert torch.isfinite(expected).all() and torch.isfinite(got).all()
    if rounding == "stochastic":
        # the saturated tanh's outputs sit at their group's ends, which stochastic rounding
        # decodes exactly: 1 - y*y stays 0. Dithered decoding moves every value by up to half
        # a step, ends included, and the huge inputs multiply that into the first weight's
        # gradient (finite, but not small).
        assert relative_error(got.float(), expected.float()) < 5e-2


def test_constant_activations_are_exact():
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 8))
    with torch.no_grad():
        model[0].bias.fill_(-1e3)  # every ReLU output is 0: constant groups
    x = torch.randn(64, 64)
    assert torch.equal(compressed_grads(model, (x,), gact_fx.backend(bits=1, min_numel=0)),
                       grads(model, (x,), baseline_backend()))


@pytest.mark.parametrize("batch", [0, 1])
def test_zero_size_and_one_element_tensors(batch):
    model = nn.Sequential(nn.Linear(1, 1), nn.Tanh(), nn.Linear(1, 1))
    x = torch.randn(batch, 1)
    expected = grads(model, (x,), baseline_backend(), lambda out: out.sum())
    backend = gact_fx.backend(bits=2, min_numel=0)
    got = grads(model, (x,), backend, lambda out: out.sum())
    # a one-element tensor is compressed (its blob outweighs it); a zero-size one passes through
    assert (backend.report().num_compressed > 0) == (batch == 1)
    assert torch.isfinite(got).all() and got.shape == expected.shape
    if batch == 0:
        assert torch.equal(got, expected)  # nothing to round


def test_non_contiguous_and_channels_last_inputs():
    model, (x,) = model_case("mlp")
    transposed = x.t().contiguous().t()  # same values, column-major
    assert not transposed.is_contiguous()
    assert torch.equal(grads(model, (transposed,), gact_fx.backend(bits=32)), grads(model, (transposed,), baseline_backend()))
    conv = ConvBlock().to(memory_format=torch.channels_last)
    images = torch.randn(8, 3, 16, 16).to(memory_format=torch.channels_last)
    expected = grads(conv, (images,), baseline_backend())
    assert torch.equal(grads(conv, (images,), gact_fx.backend(bits=32, min_numel=0)), expected)
    assert relative_error(compressed_grads(conv, (images,), gact_fx.backend(bits=8)), expected) < 2e-2


def test_double_backward_is_a_clear_error():
    model = torch.compile(MLP(), backend=gact_fx.backend(bits=8))
    x = torch.randn(8, 64, requires_grad=True)
    with pytest.raises(RuntimeError, match="does not currently support double backward"):
        (grad,) = torch.autograd.grad(model(x).sum(), x, create_graph=True)
        grad.sum().backward()


def test_retain_graph_and_a_second_backward():
    model, (x,) = model_case("mlp")
    for backend in (baseline_backend(), gact_fx.backend(bits=8)):
        torch._dynamo.reset()
        copy_ = copy.deepcopy(model)
        loss = projection_loss(torch.compile(copy_, backend=backend)(x))
        loss.backward(retain_graph=True)
        first = flat_grad(copy_).clone()
        loss.backward()  # the same blobs decoded again
        assert torch.equal(flat_grad(copy_), 2 * first)


def test_inference_mode():
    model, (x,) = model_case("mlp")
    compiled = torch.compile(model, backend=gact_fx.backend(bits=2))
    with torch.inference_mode():
        assert compiled(x).shape == (64, 10)


def test_a_model_that_saves_only_integers(caplog):
    model = nn.Embedding(1000, 64)
    indices = torch.randint(0, 1000, (32, 128))
    backend = gact_fx.backend(bits=2)
    with caplog.at_level(logging.INFO, logger="gact_fx"):
        got = grads(model, (indices,), backend)
    # Same graphs (nothing compressed), but the CPU embedding backward adds duplicate
    # indices in parallel, in no fixed order: equal up to float reassociation.
    torch.testing.assert_close(got, grads(model, (indices,), baseline_backend()), rtol=1e-5, atol=1e-5)
    assert backend.report().num_compressed == 0
    assert any("nothing compressed" in m and "int64 passes through" in m for m in caplog.messages)
