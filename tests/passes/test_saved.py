"""Finding and classifying the saved values of a partitioned forward/backward pair."""

import pytest
import torch

from gact_fx.passes.saved import SavedKind, find_saved

from .graphs import Builder, aliases_pair, linear_relu_pair


def kinds(saved):
    return {v.node.name: v.kind for v in saved.values}


def test_inputs_parameters_and_intermediates_are_told_apart():
    fw, bw, num_out, static, _ = linear_relu_pair()
    saved = find_saved(fw, bw, num_out, static)
    assert kinds(saved) == {
        "x": SavedKind.GRAPH_INPUT,
        "t": SavedKind.VIEW_OF_PARAMETER,
        "relu": SavedKind.INTERMEDIATE,
    }
    assert [v.bw_placeholder.name for v in saved.values] == ["x", "t", "relu"]


def test_views_and_outputs_are_classified_by_their_root():
    fw, bw, num_out, static, _ = aliases_pair()
    saved = find_saved(fw, bw, num_out, static)
    assert kinds(saved) == {
        "sin": SavedKind.INTERMEDIATE,
        "t": SavedKind.INTERMEDIATE,
        "getitem": SavedKind.INTERMEDIATE,
        "t_1": SavedKind.VIEW_OF_OUTPUT,
    }
    roots = {v.node.name: v.path.root.name for v in saved.values}
    assert roots["t"] == roots["getitem"] == "sin"


def test_without_static_indices_a_parameter_is_a_plain_input():
    fw, bw, num_out, _, _ = linear_relu_pair()
    assert kinds(find_saved(fw, bw, num_out, []))["t"] is SavedKind.VIEW_OF_INPUT


def test_saved_symints_come_last_in_forward_and_first_in_backward():
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    mode = FakeTensorMode(shape_env=ShapeEnv())
    f = Builder(mode)
    x = f.input("x", torch.randn(4, 8))
    n = f.input("n", mode.shape_env.create_unbacked_symint())
    y = f(torch.ops.aten.cos.default, x)
    fw = f.output(y, x, n)
    b = Builder(mode)
    bn = b.input("n", mode.shape_env.create_unbacked_symint())
    bx = b.input("x", torch.randn(4, 8))
    tangent = b.input("tangents_1", torch.randn(4, 8))
    bw = b.output(b(torch.ops.aten.mul.Tensor, tangent, bx))
    assert bn.op == "placeholder"
    saved = find_saved(fw, bw, 1, [])
    assert [(v.node.name, v.kind) for v in saved.values] == [("x", SavedKind.GRAPH_INPUT), ("n", SavedKind.SYMINT)]


def test_a_broken_pairing_is_an_error_not_a_wrong_gradient():
    fw, bw, num_out, static, _ = linear_relu_pair()
    first, second = bw.graph.find_nodes(op="placeholder")[:2]
    first.name, first.meta["val"] = "renamed", second.meta["val"]  # another name and another shape
    with pytest.raises(RuntimeError, match="does not match backward placeholder"):
        find_saved(fw, bw, num_out, static)


def test_a_renamed_placeholder_of_the_same_value_still_pairs():
    # RNG functionalization renames saved RNG states in the backward (rng_state_output_N).
    fw, bw, num_out, static, _ = linear_relu_pair()
    bw.graph.find_nodes(op="placeholder")[0].name = "rng_state_output_0"
    assert [v.bw_placeholder.name for v in find_saved(fw, bw, num_out, static).values][0] == "rng_state_output_0"
