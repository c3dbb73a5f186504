"""Test fixtures: a fresh Dynamo and fixed seeds for every test.

Without a GPU, Triton kernels run under the interpreter. Triton reads TRITON_INTERPRET
once, when first imported (Inductor imports it too), so it is set here, before any
test module imports anything; so is GACT_FX_COMPILER.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# compiler="auto" means Inductor; the suite runs the eager path unless a test asks for
# Inductor (compiles of seconds, not minutes, on two cores).
os.environ.setdefault("GACT_FX_COMPILER", "eager")
# Under pytest-xdist (make test: a process per core) each process gets its share of the
# cores, so that torch's threads do not outnumber them.
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))

import pytest  # noqa: E402

import gact_fx  # noqa: E402


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
