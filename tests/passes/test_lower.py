"""The aten and Triton lowerings: gact:: ops replaced by plain aten ops that Inductor can
fuse, or by the Triton launches they make."""

import pytest
import torch

from gact_fx.passes.lower import KEYS, lower_ops
from gact_fx.passes.plan import plan_compression
from gact_fx.passes.rewrite import DEQUANTIZE, QUANTIZE, apply_plan
from gact_fx.passes.saved import find_saved
from gact_fx.runtime.format import RUNTIME_BITS
from gact_fx.runtime.registry import SlotRegistry, manual_seed

from .graphs import linear_relu_pair, plan_options, run_pair


def rewritten_pair(bits, lower: bool, lowering: str = "aten"):
    fw, bw, num_out, static, inputs = linear_relu_pair()
    saved = find_saved(fw, bw, num_out, static)
    registry = SlotRegistry()
    options = plan_options(bits)
    apply_plan(fw, bw, saved, plan_compression(saved, options, allocate_slot=lambda: registry.new_site().slot))
    if lower:
        assert lower_ops(fw, bw, num_out, lowering) == 2
    fw.sites = registry  # the sites live as long as their graphs, as a backend keeps them
    return fw, bw, num_out, inputs


def lowered_pair(bits):
    return rewritten_pair(bits, lower=True)


def test_no_opaque_codec_op_is_left():
    fw, bw, _, _ = lowered_pair(8)
    targets = [n.target for gm in (fw, bw) for n in gm.graph.nodes if n.op == "call_function"]
    assert QUANTIZE not in targets and DEQUANTIZE not in targets
    assert targets.count(KEYS) == 1  # one read of the noise counters per forward call, for every slot
    assert all("val" in n.meta for gm in (fw, bw) for n in gm.graph.nodes if n.op != "output")


@pytest.mark.parametrize("bits", [2, 3, 8])
def test_both_lowerings_write_the_same_blobs(bits):
    by_op = rewritten_pair(bits, lower=False)
    by_aten = rewritten_pair(bits, lower=True)
    blobs, inputs = [], by_op[3]
    for fw, _, num_out, _ in (by_op, by_aten):
        manual_seed(11)  # both registries' sites start their noise from the same counters
        blobs.append([t for t in fw(*inputs)[num_out:] if t.dtype == torch.uint8])
    assert len(blobs[0]) == 2 and all(torch.equal(a, b) for a, b in zip(*blobs))


def test_32_bits_round_trips_exactly_when_run_as_python():
    reference_fw, reference_bw, *_ = linear_relu_pair()
    fw, bw, num_out, inputs = lowered_pair(32)
    tangent = torch.randn(32, 64)
    expected = run_pair(reference_fw, reference_bw, num_out, inputs, [tangent])
    got = run_pair(fw, bw, num_out, inputs, [tangent])
    assert all(torch.equal(a, b) for a, b in zip(got[1], expected[1]))


def test_run_time_bits_are_refused():
    fw, bw, num_out, static, _ = linear_relu_pair()
    saved = find_saved(fw, bw, num_out, static)
    plan = plan_compression(saved, plan_options(8), allocate_slot=iter(range(2)).__next__)
    apply_plan(fw, bw, saved, plan)
    node = fw.graph.find_nodes(op="call_function", target=QUANTIZE)[0]
    node.update_arg(1, RUNTIME_BITS)
    with pytest.raises(ValueError, match="needs bits fixed at compile time"):
        lower_ops(fw, bw, num_out, "aten")


def test_the_triton_lowering_leaves_functional_launches_that_keep_their_traced_strides(monkeypatch):
    from gact_fx import _compat

    from ..runtime.traced_launches import jit_kernels_traced

    monkeypatch.setenv("GACT_FX_KERNELS", "triton")
    with jit_kernels_traced():
        fw, bw, _, _ = rewritten_pair(2, lower=True, lowering="triton")
    in_place, functional = _compat.wrapped_triton_launches()
    nodes = [n for gm in (fw, bw) for n in gm.graph.nodes if n.op == "call_function"]
    assert not [n for n in nodes if n.target in (QUANTIZE, DEQUANTIZE, in_place)]
    launches = [n for n in nodes if n.target is functional]
    assert len(launches) >= 4 and sum(n.target is KEYS for n in nodes) == 1  # encode and decode, each tensor
    for launch in launches:
        _, traced = _compat.eager_input_vals(launch)  # Inductor requires these strides exactly
        for name, value in launch.kwargs["kwargs"].items():
            if isinstance(value, torch.fx.Node):
                assert traced["kwargs"][name].stride() == value.meta["val"].stride()
        assert all(isinstance(launch.meta["val"][name], torch.Tensor) for name in launch.kwargs["tensors_to_clone"])
