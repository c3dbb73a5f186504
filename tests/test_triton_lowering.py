"""``lowering="triton"``: gact's Triton kernels traced into the graphs, as launches Inductor sees.

Without a GPU the traced launches run under the interpreter (``runtime.traced_launches``),
the graph being the one a GPU would get. The blobs are the op path's, so the gradients
are too, bit for bit.
"""

from __future__ import annotations

import contextlib
import copy
import re

import pytest
import torch

import gact_fx

from .helpers import compiled_grads, flat_grad, model_case, projection_loss

pytestmark = pytest.mark.compat  # it leans on how torch traces and launches a user's Triton kernel

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    from .runtime.traced_launches import jit_kernels_traced


@pytest.fixture
def device(monkeypatch):
    monkeypatch.setenv("GACT_FX_KERNELS", "triton")
    return "cuda" if ON_GPU else "cpu"


def traced_launches_run():
    """Where the traced launches run: on the GPU, or under the interpreter."""
    return contextlib.nullcontext() if ON_GPU else jit_kernels_traced()


def _traced_kernels(backend) -> list[str]:
    """The kernels the graphs launch, by name, in order (forward, then backward)."""
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table

    indices = [int(i) for record in backend.records for code in record.code_after
               for i in re.findall(r"triton_kernel_wrapper_functional\(kernel_idx = (\d+)", code)]
    return [kernel_side_table.get_kernel(i).fn.fn.__name__ for i in indices]


# the 10x and 12x levels' fixed-width parts: dithered blobs (with their key), query and key
# decoded again under other noise, the value rebuilt from its projection's input
_DITHERED = {"rounding": "dithered", "nonlinear_bits": 4, "debias_attention": True, "recompute_projections": True}


@pytest.mark.parametrize("name, dtype, options", [("mlp", torch.float32, {}), ("block", torch.bfloat16, {}),
                                                  ("block", torch.float32, _DITHERED)],
                         ids=["mlp", "block-bf16", "block-dithered"])
def test_the_triton_lowering_writes_the_ops_blobs(device, name, dtype, options):
    model, inputs = model_case(name)
    model = model.to(device, dtype)
    inputs = tuple(i.to(device, dtype) if i.is_floating_point() else i.to(device) for i in inputs)
    (expected,), _ = compiled_grads(model, inputs, gact_fx.backend(bits=2, compiler="eager", lowering="op",
                                                                   **options))
    traced = gact_fx.backend(bits=2, compiler="eager", lowering="triton", **options)
    with traced_launches_run():
        (got,), _ = compiled_grads(model, inputs, traced)
    assert torch.equal(got, expected)
    forward, backward = traced.records[0].code_after
    assert "gact.quantize" not in forward and "gact.dequantize" not in backward
    kernels = _traced_kernels(traced)
    assert kernels.count("encode_chunked_kernel") + kernels.count("encode_features_kernel") == sum(
        c.is_float for c in traced.records[0].compressions)
    if name == "block":  # groups along features, read and written in place
        assert {"encode_features_kernel", "decode_features_kernel"} <= set(kernels)
    if options:
        assert traced.records[0].debiased_slots and "gact.redither" in backward


@pytest.mark.slow
def test_dynamic_sizes_stay_symbolic_and_the_blobs_stay_the_ops(device):
    """One graph for every batch whose token counts fill the same groups, as the ops' graph."""
    from torch._dynamo.utils import counters

    model, _ = model_case("block")
    model = model.to(device)

    def gradients(lowering):
        trained = copy.deepcopy(model)
        compiled = torch.compile(trained, backend=gact_fx.backend(bits=2, compiler="eager", lowering=lowering),
                                 dynamic=True, fullgraph=True)
        draws = []
        for batch in (8, 16):  # tokens: multiples of 256, so the same groups each time
            torch.manual_seed(batch)
            trained.zero_grad(set_to_none=True)
            projection_loss(compiled(torch.randn(batch, 32, 64, device=device))).backward()
            draws.append(flat_grad(trained))
        return draws

    expected = gradients("op")
    counters.clear()
    with traced_launches_run():
        got = gradients("triton")
    assert counters["stats"]["unique_graphs"] == 1
    assert all(torch.equal(g, e) for g, e in zip(got, expected))


def test_the_triton_lowering_refuses_what_it_cannot_do(monkeypatch):
    with pytest.raises(ValueError, match="needs bits fixed at compile time"):
        gact_fx.backend(lowering="triton", avg_bits=2)
    with pytest.raises(ValueError, match="rotation needs lowering='op'"):
        gact_fx.backend(lowering="triton", rotation=32)
    monkeypatch.setenv("GACT_FX_KERNELS", "cpu")  # the C++ codec serves these tensors, not Triton
    model, inputs = model_case("mlp")
    with pytest.raises(Exception, match="lowering='triton' launches gact's Triton kernels"):
        compiled_grads(model, inputs, gact_fx.backend(bits=2, compiler="eager", lowering="triton"))
