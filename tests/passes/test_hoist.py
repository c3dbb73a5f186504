"""Hoisting tangent-free comparisons (ReLU masks and recomputed cones) into the forward."""

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from gact_fx.passes.hoist import hoist_comparisons
from gact_fx.passes.saved import find_saved, output_node

from .graphs import Builder, linear_relu_pair, run_pair

aten = torch.ops.aten


def targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def test_relu_mask_moves_to_the_forward_and_the_output_is_no_longer_saved():
    fw, bw, num_out, static, inputs = linear_relu_pair()
    tangent = torch.randn(32, 64)
    _, expected = run_pair(fw, bw, num_out, inputs, [tangent])
    saved = find_saved(fw, bw, num_out, static)
    assert hoist_comparisons(fw, bw, saved) == 1
    assert aten.le.Scalar not in targets(bw) and aten.le.Scalar in targets(fw)
    saved_names = [n.name for n in output_node(fw).args[0][num_out:]]
    assert "relu" not in saved_names  # only the mask needed it
    mask = output_node(fw).args[0][-1]
    assert mask.meta["val"].dtype == torch.bool and mask.meta["gact"]["role"] == "hoisted_mask"
    _, grads = run_pair(fw, bw, num_out, inputs, [tangent])
    assert all(torch.equal(a, b) for a, b in zip(grads, expected))


def recompute_pair():
    """Backward recomputes ``2 * y + 1`` from saved ``y`` to build a mask, and uses ``y``."""
    mode = FakeTensorMode()
    f = Builder(mode)
    x = f.input("x", torch.randn(16, 32))
    y = f(aten.sin.default, x)
    fw = f.output(f(aten.cos.default, y), y)
    b = Builder(mode)
    by = b.input("sin", torch.randn(16, 32))
    tangent = b.input("tangents_1", torch.randn(16, 32))
    recomputed = b(aten.add.Tensor, b(aten.mul.Tensor, by, 2.0), 1.0)
    masked = b(aten.where.ScalarSelf, b(aten.gt.Scalar, recomputed, 0.5), 0.0, tangent)
    tangent_mask = b(aten.le.Scalar, tangent, 0.0)  # depends on a tangent: must stay
    bw = b.output(b(aten.add.Tensor, b(aten.mul.Tensor, masked, by), tangent_mask))
    return fw, bw, 1, [], (torch.randn(16, 32),)


def test_a_recomputed_comparison_is_hoisted_with_its_cone():
    fw, bw, num_out, static, inputs = recompute_pair()
    tangent = torch.randn(16, 32)
    _, expected = run_pair(fw, bw, num_out, inputs, [tangent])
    assert hoist_comparisons(fw, bw, find_saved(fw, bw, num_out, static)) == 1
    assert aten.gt.Scalar in targets(fw) and aten.gt.Scalar not in targets(bw)
    assert aten.le.Scalar in targets(bw)  # the tangent comparison stayed
    saved_names = [n.name for n in output_node(fw).args[0][num_out:]]
    assert saved_names[0] == "sin"  # still used by the multiply
    _, grads = run_pair(fw, bw, num_out, inputs, [tangent])
    assert all(torch.equal(a, b) for a, b in zip(grads, expected))


def test_nothing_to_hoist_leaves_the_graphs_alone():
    mode = FakeTensorMode()
    f = Builder(mode)
    x = f.input("x", torch.randn(8, 8))
    y = f(aten.sin.default, x)
    fw = f.output(f(aten.cos.default, y), y)
    b = Builder(mode)
    by = b.input("sin", torch.randn(8, 8))
    tangent = b.input("tangents_1", torch.randn(8, 8))
    bw = b.output(b(aten.mul.Tensor, tangent, by))
    code = (fw.code, bw.code)
    assert hoist_comparisons(fw, bw, find_saved(fw, bw, 1, [])) == 0
    assert (fw.code, bw.code) == code


def test_the_hoisted_cone_sits_right_after_what_it_reads():
    # Inserted before the forward's output, the exact ``sin`` would stay alive to the end
    # of the forward just to be compared there.
    fw, bw, num_out, static, inputs = recompute_pair()
    hoist_comparisons(fw, bw, find_saved(fw, bw, num_out, static))
    fw.graph.lint()
    order = [n.target for n in fw.graph.nodes if n.op == "call_function"]
    assert order == [aten.sin.default, aten.mul.Tensor, aten.add.Tensor, aten.gt.Scalar, aten.cos.default]


def test_a_comparison_of_values_kept_exact_is_left_alone():
    fw, bw, num_out, static, inputs = recompute_pair()
    saved = find_saved(fw, bw, num_out, static)
    assert hoist_comparisons(fw, bw, saved, quantized=set()) == 0  # e.g. 32 bits, or too small
    assert aten.gt.Scalar in targets(bw)
    assert hoist_comparisons(fw, bw, saved, quantized={0}) == 1
