"""The aten lowering: gact:: ops replaced by plain aten ops that Inductor can fuse."""

import itertools

import pytest
import torch

from gact_fx.passes.lower_aten import SEEDS, lower_to_aten
from gact_fx.passes.plan import PlanOptions, plan_compression
from gact_fx.passes.rewrite import DEQUANTIZE, QUANTIZE, apply_plan
from gact_fx.passes.saved import find_saved
from gact_fx.runtime.table import RUNTIME_BITS

from .graphs import linear_relu_pair, run_pair


def lowered_pair(bits):
    fw, bw, num_out, static, inputs = linear_relu_pair()
    saved = find_saved(fw, bw, num_out, static)
    plan = plan_compression(saved, PlanOptions(bits=bits, group_size=64, min_numel=0, compress_inputs=True), allocate_slot=itertools.count().__next__)
    apply_plan(fw, bw, saved, plan)
    assert lower_to_aten(fw, bw, num_out) == 2
    return fw, bw, num_out, inputs


def test_no_opaque_codec_op_is_left():
    fw, bw, _, _ = lowered_pair(8)
    targets = [n.target for gm in (fw, bw) for n in gm.graph.nodes if n.op == "call_function"]
    assert QUANTIZE not in targets and DEQUANTIZE not in targets
    assert targets.count(SEEDS) == 1  # one seed draw per forward call, for every slot
    assert torch.ops.prims.inductor_random.default in targets
    assert all("val" in n.meta for gm in (fw, bw) for n in gm.graph.nodes if n.op != "output")


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
    plan = plan_compression(saved, PlanOptions(bits=8, group_size=64, min_numel=0, compress_inputs=True), allocate_slot=itertools.count().__next__)
    apply_plan(fw, bw, saved, plan)
    node = fw.graph.find_nodes(op="call_function", target=QUANTIZE)[0]
    node.update_arg(1, RUNTIME_BITS)
    with pytest.raises(ValueError, match="needs bits fixed at compile time"):
        lower_to_aten(fw, bw, num_out)
