"""The compression plan on hand-made graphs: what is compressed, skipped, aliased, and its bytes."""

import itertools

import torch

from gact_fx.passes.plan import BitsChoice, BitsSource, assign_bits, layout_of, plan_compression
from gact_fx.passes.saved import find_saved
from gact_fx.runtime import format as fmt

from .graphs import Builder, aliases_pair, linear_relu_pair, plan_options

aten = torch.ops.aten


def plan_for(pair, **options):
    fw, bw, num_out, static, _ = pair
    saved = find_saved(fw, bw, num_out, static)
    return saved, plan_compression(saved, plan_options(**options), allocate_slot=itertools.count(10).__next__)


def test_activations_are_compressed_and_parameters_skipped():
    saved, plan = plan_for(linear_relu_pair())
    assert [c.name for c in plan.compressions] == ["x", "relu"]
    assert [c.slot for c in plan.compressions] == [10, 11]
    (skip,) = plan.skips
    assert saved.values[skip.position].node.name == "t" and "parameter" in skip.reason


def test_bytes_follow_the_format():
    _, plan = plan_for(linear_relu_pair(), bits=2)
    relu = plan.compressions[1]
    assert relu.bytes_before == 32 * 64 * 4
    assert relu.bytes_after == fmt.float_blob_nbytes(32 * 64, 2, 64, 4, dithered=True)


def test_inputs_can_be_left_alone():
    _, plan = plan_for(linear_relu_pair(), compress_inputs=False)
    assert [c.name for c in plan.compressions] == ["relu"]
    assert any("compress_inputs=False" in s.reason for s in plan.skips)


def test_small_tensors_stay_full_precision_with_a_reason():
    _, plan = plan_for(linear_relu_pair(), min_numel=10_000)
    assert plan.compressions == ()
    assert sum("< min_numel=10000" in s.reason for s in plan.skips) == 2


def test_disabled_plans_nothing():
    _, plan = plan_for(linear_relu_pair(), enabled=False)
    assert plan.compressions == () and all(s.reason for s in plan.skips)


def test_aliases_share_one_compression_of_their_root():
    saved, plan = plan_for(aliases_pair())
    sin, output = plan.compressions
    assert sin.name == "sin"
    chains = {saved.values[m.position].node.name: [n.name for n in m.chain] for m in sin.members}
    assert chains == {"sin": [], "t": ["t"], "getitem": ["split", "getitem"]}
    assert sin.bytes_before == 32 * 64 * 4  # the storage once, not three times
    # The backward saves a view of the output: the caller keeps only its loss, so the
    # backward's is the only reference: the output is compressed, its view replayed.
    assert output.name == "mul" and [n.name for n in output.members[0].chain] == ["t_1"]


def test_saved_outputs_can_be_left_as_the_callers_copy():
    saved, plan = plan_for(aliases_pair(), compress_outputs=False)
    assert [c.name for c in plan.compressions] == ["sin"]
    output_view = next(s for s in plan.skips if saved.values[s.position].node.name == "t_1")
    assert "compress_outputs=False" in output_view.reason and output_view.bytes == 32 * 64 * 4


def test_a_lone_slice_is_compressed_instead_of_its_larger_root():
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode()
    f = Builder(mode)
    x = f.input("x", torch.randn(64, 64))
    h = f(aten.sin.default, x)
    half = f(aten.slice.Tensor, h, 1, 0, 8)
    fw = f.output(f(aten.cos.default, x), half)
    b = Builder(mode)
    bhalf = b.input("slice", torch.randn(64, 8))
    tangent = b.input("tangents_1", torch.randn(64, 64))
    bw = b.output(b(aten.add.Tensor, tangent, b(aten.sum.default, bhalf)))
    saved, plan = plan_for((fw, bw, 1, [], None))
    (only,) = plan.compressions
    assert only.source.target is aten.slice.Tensor and only.members[0].chain == ()
    assert not layout_of(only.source.meta["val"]).dense  # compressed compactly


def test_integer_tensors_pass_through():
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode()
    f = Builder(mode)
    x = f.input("x", torch.randn(64, 64))
    idx = f(aten.argmax.default, x, 1)
    fw = f.output(f(aten.cos.default, x), idx)
    b = Builder(mode)
    bidx = b.input("argmax", torch.zeros(64, dtype=torch.long))
    tangent = b.input("tangents_1", torch.randn(64, 64))
    bw = b.output(b(aten.add.Tensor, tangent, b(aten.sum.default, bidx)))
    _, plan = plan_for((fw, bw, 1, [], None))
    assert plan.compressions == () and "int64 passes through" in plan.skips[0].reason


def test_compressions_are_labelled_and_bits_assigned_by_label():
    _, plan = plan_for(linear_relu_pair(), label_prefix="g1/")
    assert [c.label for c in plan.compressions] == ["g1/input", "g1/relu"]
    plan = assign_bits(plan, lambda c: BitsChoice(2 if c.label.endswith("relu") else c.bits, "test", BitsSource.UNIFORM))
    assert {c.name: c.bits for c in plan.compressions} == {"x": 8, "relu": 2}
    assert plan.compressions[1].bytes_after == fmt.float_blob_nbytes(32 * 64, 2, 64, 4, dithered=True)


def test_an_exponential_use_raises_the_bits_to_the_floor_unless_overridden():
    from gact_fx.passes.uses import Use, UseClass

    saved, _ = plan_for(linear_relu_pair())
    x = next(v.position for v in saved.values if v.node.name == "x")
    uses = {x: UseClass(Use.EXPONENTIAL, "exp")}
    plan = plan_compression(saved, plan_options(2),
                            allocate_slot=itertools.count().__next__, uses=uses)
    uniform = assign_bits(plan, lambda c: BitsChoice(c.bits, "uniform", BitsSource.UNIFORM))
    assert {c.name: c.bits for c in uniform.compressions} == {"x": 8, "relu": 2}
    assert "at least 8 bits: exponential use, exp" in uniform.compressions[0].bits_reason
    assert [c.bits_source for c in uniform.compressions] == [BitsSource.FLOOR, BitsSource.UNIFORM]
    chosen = assign_bits(plan, lambda c: BitsChoice(2, "the user's", BitsSource.OVERRIDE))
    assert {c.name: c.bits for c in chosen.compressions} == {"x": 2, "relu": 2}
