"""Mixed precision: autocast bf16/fp16 activations compress from there; GradScaler sees the same infs."""

import copy

import pytest
import torch

import gact_fx
from gact_fx.runtime import format as fmt

from .helpers import baseline_backend, flat_grad, model_case, projection_loss, relative_error


def autocast_grads(model, x, backend, dtype):
    model = copy.deepcopy(model)
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    with torch.autocast("cpu", dtype=dtype):
        output = compiled(x)
    projection_loss(output).backward()
    return flat_grad(model)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_activations_compress_in_their_own_dtype(dtype):
    model, (x,) = model_case("block")
    expected = autocast_grads(model, x, baseline_backend(), dtype)
    assert torch.equal(autocast_grads(model, x, gact_fx.backend(bits=32), dtype), expected)
    backend = gact_fx.backend(bits=8)
    assert relative_error(autocast_grads(model, x, backend, dtype), expected) < 2e-2
    half = [r for r in backend.report().rows if r.stored == "compressed" and r.dtype == str(dtype).removeprefix("torch.")]
    assert half  # saved in low precision, compressed from there, with fp32 metadata:
    assert all(r.bytes_after == fmt.float_blob_nbytes(r.stored_numel, 8, 256, 2, dithered=True) for r in half)


def scaler_run(model, batches, backend):
    model = copy.deepcopy(model)
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**14, growth_interval=1)  # overflows, then alternates
    history = []
    for x in batches:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.float16):
            output = compiled(x)
        scaler.scale(projection_loss(output)).backward()
        scaler.unscale_(optimizer)
        found_inf = sum(v.item() for v in scaler._found_inf_per_device(optimizer).values())
        scaler.step(optimizer)
        scaler.update()
        history.append((found_inf > 0, scaler.get_scale()))
    return history


def test_grad_scaler_sees_the_same_overflows():
    model, (x,) = model_case("block")
    batches = [x] * 8
    expected = scaler_run(model, batches, baseline_backend())
    assert any(found for found, _ in expected) and not all(found for found, _ in expected)  # both kinds of step
    assert scaler_run(model, batches, gact_fx.backend(bits=8)) == expected
