"""GactConfig validation: defaults, and every bad option as a clear error at compile time."""

import pytest
import torch

import gact_fx
from gact_fx.config import LEVELS, SECTION_OF, CoreConfig, GactConfig


def test_defaults_are_valid_and_frozen():
    config = GactConfig()
    with pytest.raises(Exception):
        config.core.bits = 2
    with pytest.raises(Exception):
        config.core = CoreConfig(bits=2)
    assert GactConfig.from_options({"bits": 4}).core.bits == 4
    assert config == GactConfig.from_options({})


def test_the_default_is_3_bits_dithered_with_the_value_rebuilt_and_levels_keep_that_format():
    config = GactConfig()
    assert (config.core.bits, config.core.rounding, config.passes.recompute_projections) == (3, "dithered", True)
    for level in ("L1", "L1.1", "L1.2", "L2", "L2.1", "L2.2"):  # a level sets the width, not the format
        leveled = GactConfig.from_options({"level": level})
        assert (leveled.core.rounding, leveled.passes.recompute_projections) == ("dithered", True)
    assert GactConfig.from_options({"level": "L1"}).core.bits == 4


def test_flat_options_land_in_their_sections_and_come_back():
    options = {"bits": 2, "group_size": 64, "probe_tensors": 4, "recompute_affine": False, "partitioner": "default",
               "overrides": {"*ln*": 8}}
    config = GactConfig.from_options(options)
    assert (config.core.bits, config.core.group_size, config.core.overrides) == (2, 64, (("*ln*", 8),))
    assert config.adaptive.probe_tensors == 4 and config.adaptive.avg_bits is None and not config.is_adaptive
    assert config.passes.recompute_affine is False and config.compile.partitioner == "default"
    assert GactConfig.from_options(config.as_dict()) == config
    assert set(config.as_dict()) == set(SECTION_OF)
    assert config.replace(bits=4, compiler="eager") == GactConfig.from_options(options | {"bits": 4, "compiler": "eager"})
    with pytest.raises(ValueError, match=r"unknown gact option\(s\) \['bitz'\]"):
        config.replace(bitz=4)
    with pytest.raises(ValueError, match="GactConfig.core must be a CoreConfig"):
        GactConfig(core={"bits": 2})


def test_levels_are_constructors():
    assert LEVELS["L2.2"](group_size=64) == GactConfig.from_options({"level": "L2.2", "group_size": 64})
    config = LEVELS["L2.2"](group_size=64)
    assert (config.adaptive.avg_bits, config.core.group_size, config.core.feature_groups) == (2.0, 64, True)
    assert LEVELS["L1.2"]().core.bits == 2 and not LEVELS["L1.2"]().is_adaptive
    assert LEVELS["L0"]().enabled is False
    assert LEVELS["L3"]().passes.offload is True
    with pytest.raises(ValueError, match=r"level='L2.2' means \{'avg_bits': 2.0\}; do not also pass \['bits'\]"):
        LEVELS["L2.2"](bits=4)
    with pytest.raises(ValueError, match="level must be one of"):
        GactConfig.from_options(level="L9")


@pytest.mark.parametrize(
    "options,message",
    [
        ({"bits": 5}, "bits must be one of"),
        ({"bits": 16}, "bits must be one of"),
        ({"bits": 8.0}, "bits must be int"),
        ({"group_size": 12}, "multiple of 16"),
        ({"group_size": 8}, "multiple of 16"),
        ({"group_size": 0}, "multiple of 16"),
        ({"group_size": 8192}, "from 16 to 4096"),
        ({"min_numel": -1}, "min_numel must be >= 0"),
        ({"compiler": "tvm"}, "compiler must be one of"),
        ({"partitioner": "greedy"}, "partitioner must be one of"),
        ({"gradient_metric": "adam"}, "gradient_metric must be one of"),
        ({"enabled": 1}, "enabled must be bool"),
        ({"feature_groups": "yes"}, "feature_groups must be bool"),
        ({"exact_statistics": 0}, "exact_statistics must be bool"),
        ({"nonlinear_rotation": 24}, "nonlinear_rotation must be 0 \\(off\\) or one of"),
        ({"nonlinear_rotation": 32, "lowering": "aten"}, "nonlinear_rotation needs lowering='op'"),
        ({"nonlinear_bits": 4, "recompute_attention": False}, "nonlinear_bits=4 .* recompute_attention=False"),
        ({"bitz": 4}, r"unknown gact option\(s\) \['bitz'\]; allowed options are"),
    ],
)
def test_bad_options_are_clear_errors(options, message):
    with pytest.raises(ValueError, match=message):
        GactConfig.from_options(options)
    with pytest.raises(ValueError, match=message):
        gact_fx.backend(**options)


def test_bad_options_fail_at_compile_time_through_torch_compile():
    model = torch.nn.Linear(4, 4)
    compiled = torch.compile(model, backend="gact", options={"bits": 5})
    with pytest.raises(Exception, match="bits must be one of"):
        compiled(torch.randn(2, 4))


def test_options_on_top_of_a_config():
    adaptive = GactConfig.from_options({"level": "L2", "group_size": 128})
    assert adaptive.updated({"level": "L1.1"}) == GactConfig.from_options(bits=8, group_size=128)
    assert adaptive.updated({"bits": 2}).is_adaptive is False
    assert GactConfig.from_options(bits=2).updated({"level": "L2.2"}).adaptive.avg_bits == 2.0
    with pytest.raises(ValueError, match="unknown gact option"):
        adaptive.updated({"bitz": 2})


def test_every_level_groups_by_feature_unless_told_otherwise():
    for level in ("L1", "L1.1", "L1.2", "L2", "L2.1", "L2.2", "L3"):
        assert GactConfig.from_options({"level": level}).core.feature_groups is True
    assert GactConfig.from_options({"avg_bits": 2}).core.feature_groups is True
    assert GactConfig.from_options({"level": "L2.2", "feature_groups": False}).core.feature_groups is False
    contiguous = GactConfig.from_options({"level": "L1", "feature_groups": False})
    assert contiguous.updated({"group_size": 128}).core.feature_groups is False
    assert contiguous.updated({"level": "L2.2"}).core.feature_groups is False  # a level sets bits, not the groups


def test_per_call_options_on_a_backend_object():
    from .helpers import model_case, projection_loss

    model, inputs = model_case("mlp")
    backend = gact_fx.backend(level="L2")
    compiled = torch.compile(model, backend=backend, options={"level": "L1.1"})
    projection_loss(compiled(*inputs)).backward()
    assert {c.bits for c in backend.records[0].compressions if c.is_float} == {8}
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend, options={"avg_bits": 2})
    with pytest.raises(Exception, match="cannot change the adaptive settings"):
        compiled(*inputs)


def test_offload_is_refused_where_torch_has_no_offloading_pass(monkeypatch):
    from gact_fx import _compat

    monkeypatch.setattr(_compat, "has_activation_offloading", lambda: False)
    with pytest.raises(ValueError, match="needs torch 2.10 or later"):
        GactConfig.from_options({"level": "L3"})
    GactConfig.from_options({"level": "L2"})  # the rest is unaffected


def test_auto_compiler_is_inductor_unless_the_environment_asks_for_eager(monkeypatch):
    from gact_fx.dynamo_backend import resolve_compiler
    from gact_fx.runtime import cpu_kernels

    cpu_inputs = [torch.randn(2)]
    monkeypatch.delenv("GACT_FX_COMPILER", raising=False)
    assert resolve_compiler("auto", cpu_inputs) == ("inductor" if cpu_kernels.available() else "eager")
    monkeypatch.setenv("GACT_FX_COMPILER", "eager")
    assert resolve_compiler("auto", cpu_inputs) == "eager"
    assert resolve_compiler("auto", cpu_inputs, lowering="aten") == "inductor"
    assert resolve_compiler("inductor", cpu_inputs) == "inductor"
    monkeypatch.setenv("GACT_FX_COMPILER", "fast")
    with pytest.raises(ValueError, match="GACT_FX_COMPILER must be 'inductor' or 'eager', got 'fast'"):
        resolve_compiler("auto", cpu_inputs)


def test_auto_compiler_without_a_cpp_compiler_takes_the_eager_path_with_a_warning(monkeypatch, caplog):
    from gact_fx.dynamo_backend import resolve_compiler
    from gact_fx.runtime import cpu_kernels

    monkeypatch.delenv("GACT_FX_COMPILER", raising=False)
    monkeypatch.setattr(cpu_kernels, "available", lambda: False)
    with caplog.at_level("WARNING", logger="gact_fx"):
        assert resolve_compiler("auto", [torch.randn(2)]) == "eager"
    assert "no working C++ compiler" in caplog.text
