"""Gradients through the gact backend against the same compile path without gact.

32 bits must be bit-identical, 8 bits within 2e-2 (norm of the whole gradient), and
2 bits unbiased: the mean over 16 rounding seeds at least 2.5x closer to the baseline
than a single draw (sqrt(16) = 4x for a purely unbiased estimator). Both sides take the
compile path ``GACT_FX_COMPILER`` names: CI runs this file under Inductor too.
"""

import pytest
import torch

import gact_fx
import gact_fx.partitioner
from gact_fx.passes.rewrite import apply_plan

from .helpers import baseline_backend, compiled_grads, floor_ratio, model_case, relative_error

MODELS = ["mlp", "block", "conv", "bert"]

pytestmark = pytest.mark.compat


def gact_backend(bits, compiler="auto"):
    """``compiler="auto"`` takes GACT_FX_COMPILER's path: eager in the default run, Inductor in
    CI's compat run under Inductor (.ci/compat); the baseline takes the same path."""
    return gact_fx.backend(bits=bits, compiler=compiler)


def compressed(backend) -> int:
    (record,) = backend.records  # one graph: no silent graph break, no fallback
    return len(record.compressions)


@pytest.fixture
def one_thread():
    """Inductor's CPU reductions, split over threads, differ from run to run (BERT's gradient
    in a few ulps, the baseline against itself): on one thread its kernels are reproducible."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("name", MODELS)
def test_32_bits_is_bit_identical(name, one_thread):
    model, inputs = model_case(name)
    (expected,), _ = compiled_grads(model, inputs, baseline_backend("auto"))
    backend = gact_backend(32)
    (got,), _ = compiled_grads(model, inputs, backend)
    assert compressed(backend) > 0
    assert torch.equal(got, expected)


@pytest.mark.parametrize("name", MODELS)
def test_8_bits_is_within_2e_2(name):
    model, inputs = model_case(name)
    (expected,), _ = compiled_grads(model, inputs, baseline_backend("auto"))
    backend = gact_backend(8)
    (got,), _ = compiled_grads(model, inputs, backend)
    assert compressed(backend) > 0
    assert 0 < relative_error(got, expected) < 2e-2


@pytest.mark.parametrize("name", MODELS)
def test_2_bits_is_unbiased(name):
    model, inputs = model_case(name)
    (expected,), _ = compiled_grads(model, inputs, baseline_backend("auto"))
    backend = gact_backend(2)
    draws, _ = compiled_grads(model, inputs, backend, steps=16)
    assert compressed(backend) > 0
    assert floor_ratio(draws, expected) <= 1.6  # a single draw's error at least 2.5x the mean's



def test_masks_as_bytes_under_inductor_give_the_gradient_of_bool_masks(monkeypatch):
    # Under Inductor on the CPU, ReLU masks reach the op as bytes and the backward as floats
    # (passes.rewrite: Inductor's bool stores are slow). The path is lossless: the same
    # sites draw the same noise, so the gradient is the bool path's, bit for bit.
    model, inputs = model_case("conv")
    backend = gact_backend(8, compiler="inductor")
    (got,), _ = compiled_grads(model, inputs, backend)
    forward, backward = backend.records[0].code_after
    assert forward.count("torch.uint8") == 2 and backward.count("gact.unpack_mask") == 2  # both hoisted ReLU masks
    monkeypatch.setattr(
        gact_fx.partitioner, "apply_plan", lambda *args, **kwargs: apply_plan(*args, **{**kwargs, "masks_as_bytes": False})
    )
    as_bools = gact_backend(8, compiler="inductor")
    (expected,), _ = compiled_grads(model, inputs, as_bools)
    assert "gact.unpack_mask" not in as_bools.records[0].code_after[1]
    assert torch.equal(got, expected)


def test_convolutional_intermediates_go_channels_last_under_inductor_and_stay_exact():
    # On the CPU Inductor lays a convolutional graph out channels-last; the plan encodes its
    # 4-D intermediates in that order and decodes them into it (graph inputs keep theirs).
    model, inputs = model_case("conv")
    (expected,), _ = compiled_grads(model, inputs, baseline_backend("inductor"))
    backend = gact_fx.backend(bits=32, compiler="inductor", feature_groups=False)  # groups in the layout's own order
    (got,), _ = compiled_grads(model, inputs, backend)
    forward = backend.records[0].code_after[0]
    assert "quantize.default(primals_3, 32, 256, [0, 1, 2, 3]" in forward  # the image: a graph input
    assert forward.count("[0, 2, 3, 1]") >= 2  # the convolutions' outputs
    assert torch.equal(got, expected)
