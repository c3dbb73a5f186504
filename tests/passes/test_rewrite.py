"""The rewrite on hand-made forward/backward pairs: placement of quantize/dequantize and the gradients it gives."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from gact_fx.passes.hoist import hoist_comparisons
from gact_fx.passes.plan import plan_compression
from gact_fx.passes.rewrite import DEQUANTIZE, QUANTIZE, UNPACK_MASK, apply_plan
from gact_fx.passes.saved import find_saved, output_node

from ..runtime.sites import new_slot

aten = torch.ops.aten
from .graphs import Builder, aliases_pair, linear_relu_pair, plan_options, run_pair


def rewritten(pair, bits, hoist=False, masks_as_bytes=False):
    fw, bw, num_out, static, inputs = pair
    saved = find_saved(fw, bw, num_out, static)
    if hoist and hoist_comparisons(fw, bw, saved):
        saved = find_saved(fw, bw, num_out, static)
    options = plan_options(bits)
    plan = plan_compression(saved, options, allocate_slot=new_slot)
    apply_plan(fw, bw, saved, plan, masks_as_bytes=masks_as_bytes)
    return fw, bw, plan


def count(gm, target):
    return sum(1 for n in gm.graph.nodes if n.target is target)


@pytest.mark.parametrize("make_pair", [linear_relu_pair, aliases_pair])
def test_32_bits_gives_identical_gradients(make_pair):
    pair = make_pair()
    fw, bw, num_out, _, inputs = pair
    tangent = torch.randn(fw(*inputs)[0].shape)
    expected = run_pair(fw, bw, num_out, inputs, [tangent])
    fw, bw, _ = rewritten(make_pair(), 32)
    outputs, grads = run_pair(fw, bw, num_out, inputs, [tangent])
    assert all(torch.equal(a, b) for a, b in zip(outputs, expected[0]))
    assert all(torch.equal(a, b) for a, b in zip(grads, expected[1]))


def relative_errors(hoist):
    fw, bw, num_out, _, inputs = linear_relu_pair()
    tangent = torch.randn(32, 64, generator=torch.Generator().manual_seed(0))
    _, expected = run_pair(fw, bw, num_out, inputs, [tangent])
    fw, bw, _ = rewritten(linear_relu_pair(), 8, hoist=hoist)
    _, grads = run_pair(fw, bw, num_out, inputs, [tangent])
    return [((v - r).norm() / r.norm()).item() for v, r in zip(grads, expected)]


def test_8_bits_stays_close_once_masks_are_hoisted():
    assert max(relative_errors(hoist=True)) < 1e-2


def test_8_bits_without_hoisting_flips_relu_masks():
    # Why masks are hoisted: rebuilt from a quantized ReLU output, the mask flips near 0.
    assert max(relative_errors(hoist=False)) > 2 * max(relative_errors(hoist=True))


def test_quantize_follows_the_last_forward_use_and_dequantize_precedes_the_first_use():
    fw, bw, plan = rewritten(linear_relu_pair(), 8)
    assert count(fw, QUANTIZE) == 2 and count(bw, DEQUANTIZE) == 2
    order = {node: index for index, node in enumerate(fw.graph.nodes)}
    for node in fw.graph.find_nodes(op="call_function", target=QUANTIZE):
        producer = node.args[0]
        uses = [u for u in producer.users if u is not node and u.op != "output"]
        assert uses  # (each source here has a forward use besides being saved)
        assert node.prev is max(uses, key=order.__getitem__)
        assert node.meta["gact"]["role"] == "quantize" and node.meta["val"].dtype == torch.uint8
    for node in bw.graph.find_nodes(op="call_function", target=DEQUANTIZE):
        assert node.next in node.users  # decoded right where it is first needed
        assert node.meta["val"].dtype == torch.float32
    assert [n.name for n in bw.graph.find_nodes(op="placeholder")] == [
        "gact_blob_x", "t", "gact_blob_relu", "tangents_1",
    ]


def test_aliases_become_one_blob_and_views_are_replayed():
    fw, bw, plan = rewritten(aliases_pair(), 8)
    saved_outputs = list(output_node(fw).args[0][1:])
    assert [n.name for n in saved_outputs] == ["gact_blob_sin", "gact_blob_mul"]  # the output's view: its root
    replays = [n for n in bw.graph.nodes if n.meta.get("gact", {}).get("role") == "replay"]
    assert sorted(n.target.__name__ for n in replays) == ["getitem", "split.Tensor", "t.default", "t.default"]
    assert all("val" in n.meta for n in bw.graph.nodes if n.op != "output")


def test_cpu_masks_reach_the_op_as_bytes_and_the_backward_as_floats():
    # Inductor's CPU kernels store and load bools ten times slower than bytes and floats
    # (see passes.rewrite): the mask is converted on its way in and tested on its way out.
    fw, bw, num_out, _, inputs = linear_relu_pair()
    tangent = torch.randn(32, 64, generator=torch.Generator().manual_seed(2))
    expected = run_pair(fw, bw, num_out, inputs, [tangent])
    fw, bw, plan = rewritten(linear_relu_pair(), 32, hoist=True, masks_as_bytes=True)
    read = [n.args[0] for n in fw.graph.find_nodes(op="call_function", target=QUANTIZE)]
    assert [n.meta["val"].dtype for n in read] == [torch.float32, torch.uint8]  # x, and the hoisted mask
    as_bytes = read[1]
    words = as_bytes.args[0]
    assert words.meta["val"].dtype == torch.int32 and words.args[0].meta["val"].dtype == torch.bool
    (unpacked,) = bw.graph.find_nodes(op="call_function", target=UNPACK_MASK)
    assert unpacked.meta["val"].dtype == torch.float32 and count(bw, DEQUANTIZE) == 1
    (test,) = unpacked.users
    assert test.target is torch.ops.aten.ne.Scalar and test.meta["val"].dtype == torch.bool
    outputs, grads = run_pair(fw, bw, num_out, inputs, [tangent])
    assert all(torch.equal(a, b) for a, b in zip(outputs, expected[0]))
    assert all(torch.equal(a, b) for a, b in zip(grads, expected[1]))


def masked_input_pair():
    """``out = where(mask, x, 0) * 3`` with a bool ``mask`` input, saved for the backward."""
    mode = FakeTensorMode()
    x, mask = torch.randn(16, 300), torch.rand(16, 300) > 0.4
    f = Builder(mode)
    fx_, fmask = f.input("x", x), f.input("mask", mask)
    out = f(aten.mul.Tensor, f(aten.where.ScalarOther, fmask, fx_, 0.0), 3.0)
    fw = f.output(out, fmask)
    b = Builder(mode)
    bmask, tangent = b.input("mask", mask), b.input("tangents_1", torch.randn(16, 300))
    bw = b.output(b(aten.where.ScalarOther, bmask, b(aten.mul.Tensor, tangent, 3.0), 0.0), None)
    return fw, bw, 1, [], (x, mask)


def test_a_mask_input_reaches_the_op_as_it_is_and_the_backward_as_floats():
    fw, bw, num_out, _, inputs = masked_input_pair()
    tangent = torch.randn(16, 300, generator=torch.Generator().manual_seed(3))
    expected = run_pair(fw, bw, num_out, inputs, [tangent])
    fw, bw, _ = rewritten(masked_input_pair(), 8, masks_as_bytes=True)
    (read,) = [n.args[0] for n in fw.graph.find_nodes(op="call_function", target=QUANTIZE)]
    assert read.op == "placeholder" and read.meta["val"].dtype == torch.bool  # no kernel added to load bools
    assert count(bw, UNPACK_MASK) == 1
    outputs, grads = run_pair(fw, bw, num_out, inputs, [tangent])
    assert torch.equal(outputs[0], expected[0][0]) and torch.equal(grads[0], expected[1][0])
