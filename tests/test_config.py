"""GactConfig validation: defaults, and every bad option as a clear error at compile time."""

import pytest
import torch

import gact_fx
from gact_fx.config import GactConfig


def test_defaults_are_valid_and_frozen():
    config = GactConfig()
    with pytest.raises(Exception):
        config.bits = 2
    assert GactConfig.from_options({"bits": 4}).bits == 4


@pytest.mark.parametrize(
    "options,message",
    [
        ({"bits": 3}, "bits must be one of"),
        ({"bits": 16}, "bits must be one of"),
        ({"bits": 8.0}, "bits must be int"),
        ({"group_size": 12}, "multiple of 8"),
        ({"group_size": 0}, "multiple of 8"),
        ({"min_numel": -1}, "min_numel must be >= 0"),
        ({"compiler": "tvm"}, "compiler must be one of"),
        ({"partitioner": "greedy"}, "partitioner must be one of"),
        ({"enabled": 1}, "enabled must be bool"),
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
    compiled = torch.compile(model, backend="gact", options={"bits": 3})
    with pytest.raises(Exception, match="bits must be one of"):
        compiled(torch.randn(2, 4))
