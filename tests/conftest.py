"""Test fixtures: a fresh Dynamo and fixed seeds for every test."""

import pytest
import torch

import gact_fx


@pytest.fixture(autouse=True)
def fresh_compile_state():
    import torch._dynamo

    torch._dynamo.reset()
    torch.manual_seed(0)
    gact_fx.manual_seed(0)
    yield
    torch._dynamo.reset()


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device; none is visible")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
