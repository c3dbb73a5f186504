"""Recognising views from op schemas and walking alias chains back to their storage root."""

import operator

import torch

from gact_fx.passes.views import alias_path, foreign_inputs, view_parent

from .graphs import aliases_pair, linear_relu_pair

aten = torch.ops.aten


def node(gm, name):
    return next(n for n in gm.graph.nodes if n.name == name)


def test_views_are_recognised_from_the_op_schema():
    fw, *_ = aliases_pair()
    assert view_parent(node(fw, "t")) is node(fw, "sin")
    assert view_parent(node(fw, "split")) is node(fw, "sin")
    assert view_parent(node(fw, "getitem")) is node(fw, "split")
    assert view_parent(node(fw, "sin")) is None
    assert view_parent(node(fw, "mul")) is None


def test_alias_path_walks_back_to_the_storage_root():
    fw, *_ = aliases_pair()
    path = alias_path(node(fw, "getitem"))
    assert path.root is node(fw, "sin")
    assert [n.name for n in path.chain] == ["split", "getitem"]
    assert path.is_view
    assert not alias_path(node(fw, "sin")).is_view


def test_a_view_of_a_placeholder_has_the_placeholder_as_root():
    fw, *_ = linear_relu_pair()
    path = alias_path(node(fw, "t"))
    assert path.root.op == "placeholder" and path.root.name == "w"


def test_foreign_inputs_are_what_a_replay_needs_besides_the_chain():
    fw, *_ = aliases_pair()
    assert foreign_inputs(alias_path(node(fw, "getitem"))) == []
    assert operator.getitem is node(fw, "getitem").target
