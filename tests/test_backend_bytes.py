"""Saved bytes, measured at run time through autograd's saved-tensor hooks.

The prediction is recomputed here from the report's shapes with the packed format's
arithmetic (``runtime.format``), independently of the plan's own byte bookkeeping.
"""

import pytest
import torch

import gact_fx
from gact_fx.measure import saved_activation_bytes
from gact_fx.runtime import format as fmt

from .helpers import baseline_backend, compiled_grads, model_case


def format_prediction(report) -> int:
    """Bytes the rows' kept tensors and blobs take, from shapes, dtypes and bits alone."""
    total = 0
    for row in report.rows:
        if not row.is_activation or row.stored_numel == 0:
            continue  # not an activation, or an alias counted on another row
        numel = row.stored_numel
        dtype = getattr(torch, row.dtype)
        if row.bits is None:
            total += numel * dtype.itemsize
        elif dtype == torch.bool:
            total += fmt.bool_blob_nbytes(numel)
        else:
            total += fmt.float_blob_nbytes(numel, row.bits, 256, dtype.itemsize)
    return total


def measured_bytes(name, backend):
    model, inputs = model_case(name)
    _, compiled = compiled_grads(model, inputs, backend)
    return saved_activation_bytes(compiled, *inputs)


@pytest.mark.parametrize("name", ["block", "bert"])
def test_2_bits_saves_at_least_9x_and_matches_the_format(name):
    # 14x at 2 bits everywhere; attention's query and key at 8 bits (their exponential use) cost the rest
    baseline = measured_bytes(name, baseline_backend())
    backend = gact_fx.backend(bits=2)
    measured = measured_bytes(name, backend)
    report = backend.report()
    assert baseline / measured >= 9, f"{baseline} -> {measured} bytes"
    assert {r.bits for r in report.rows if r.use == "exponential" and r.stored == "compressed"} == {8}
    assert measured == pytest.approx(format_prediction(report), rel=0.05)
    assert report.activation_bytes_before == pytest.approx(baseline, rel=0.05)
    # The physical limit: nothing beats (b + 0.125) / 32 of fp32 at b bits.
    assert measured >= baseline * fmt.ideal_ratio(2) * 0.99


@pytest.mark.parametrize("name", ["mlp", "conv"])
@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_measured_bytes_match_the_prediction(name, bits):
    backend = gact_fx.backend(bits=bits)
    measured = measured_bytes(name, backend)
    assert measured == pytest.approx(format_prediction(backend.report()), rel=0.05)
    assert measured == backend.report().activation_bytes_after


@pytest.mark.parametrize("options", [dict(bits=2), dict(avg_bits=2)], ids=["uniform", "adaptive"])
def test_the_memory_timeline_counts_blobs_at_their_size(options):
    # With run-time bits a blob's length is unbacked; its shape says nothing of its size.
    model, inputs = model_case("block")
    backend = gact_fx.backend(**options)
    torch.compile(model, backend=backend, fullgraph=True)(*inputs)
    (record,) = backend.records
    assert record.timeline.forward[-1] == record.activation_bytes_after
    assert record.baseline_timeline.forward[-1] == record.activation_bytes_before


def test_a_saved_copy_of_a_weight_in_another_layout_is_counted_as_a_weight_copy():
    # Inductor re-lays convolution weights out after partitioning: the backward then holds
    # a copy that no graph shows. The meter tells it from activations by value.
    from gact_fx.measure import saved_bytes_by_kind

    class Layout(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(64, 32))

        def forward(self, x):
            copy = self.weight.t().contiguous().t()  # the same values, column-major
            return (x @ copy).square().sum()

    x = torch.randn(16, 64, requires_grad=True)
    activations, copies = saved_bytes_by_kind(Layout(), x)
    assert copies == 64 * 32 * 4
    assert activations == x.numel() * 4 + 16 * 32 * 4  # x for the matmul, its output for the square
