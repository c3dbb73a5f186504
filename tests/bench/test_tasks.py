"""The character-LM Llama task: a transformers Llama over bytes, compressed like the GPT."""

import copy

import pytest
import torch

import gact_fx

from ..helpers import flat_grad, relative_error

pytest.importorskip("transformers")

from gact_fx.bench.tasks import TASKS  # noqa: E402


def test_the_llama_task_trains_through_gact_with_its_norm_outputs_rebuilt():
    task = TASKS["charlm-llama"](batch_size=2, context=16)
    torch.manual_seed(0)
    model = task.model()
    (tokens,), targets = task.batch(0, torch.Generator().manual_seed(0))
    task.loss(model(tokens), targets).backward()
    exact = flat_grad(model)

    gact = copy.deepcopy(model)
    gact.zero_grad(set_to_none=True)
    torch._dynamo.reset()
    backend = gact_fx.backend(compiler="eager", bits=8, min_numel=0)
    output = torch.compile(gact, backend=backend, fullgraph=True)(tokens)
    assert output.shape == (2, 16, 256)
    task.loss(output, targets).backward()
    assert relative_error(flat_grad(gact), exact) < 2e-2
    # RMSNorm's normalised and scaled outputs are rebuilt from its input and 1/rms
    assert [r for r in backend.report().rows if r.stored.startswith("rebuilt in the backward from ")]
