"""The pass pipeline: every enabled pass runs once, in order, and leaves a record."""

import gact_fx
from gact_fx.passes.pipeline import SECTION_PASSES
from gact_fx.viz.render import render_text

from ..helpers import compiled_grads, model_case

STAGES = ["plan", "rewrite"]


def test_each_enabled_pass_and_stage_leaves_a_record_in_order():
    model, inputs = model_case("block")
    backend = gact_fx.backend(bits=2, recompute_projections=True)  # the one section pass off by default
    compiled_grads(model, inputs, backend)
    (record,) = backend.records
    assert [run.name for run in record.passes] == [p.name for p in SECTION_PASSES] + STAGES
    affine = next(run for run in record.passes if run.name == "recompute affine")
    # the LayerNorm outputs it rebuilds are no longer saved in full precision
    assert affine.changed and affine.bytes_after < affine.bytes_before
    projections = next(run for run in record.passes if run.name == "recompute projections")
    assert projections.changed  # attention's value: a view of the QKV output, whose storage query still holds
    unchanged = [run for run in record.passes if run.bytes_before is not None and not run.changed]
    assert all(run.bytes_after == run.bytes_before for run in unchanged)
    assert sum(run.seconds for run in record.passes) <= record.pass_seconds
    assert "recompute affine (" in render_text(backend.report())


def test_switched_off_passes_leave_no_record_and_off_runs_none():
    model, inputs = model_case("block")
    backend = gact_fx.backend(bits=2, recompute_affine=False, save_derivatives=False)
    compiled_grads(model, inputs, backend)
    names = [run.name for run in backend.records[0].passes]
    assert "recompute affine" not in names and "hoist derivatives" not in names and "hoist exponentials" in names
    off = gact_fx.backend(enabled=False)
    compiled_grads(model, inputs, off)
    assert [run.name for run in off.records[0].passes] == STAGES
