"""The bench's transformers tasks (the Llama, the masked LM, the ViT) train through gact like the GPT."""

import copy

import pytest
import torch

import gact_fx

from ..helpers import flat_grad, relative_error

pytest.importorskip("transformers")

from gact_fx.bench.tasks import TASKS  # noqa: E402


def one_step_at_8_bits(task, batch_size: int, **sizes):
    """One batch's gradient error through gact at 8 bits against eager fp32, the output's
    shape and the report."""
    task = TASKS[task](batch_size=batch_size, **sizes)
    torch.manual_seed(0)
    model = task.model()
    (inputs,), targets = task.batch(0, torch.Generator().manual_seed(0))
    task.loss(model(inputs), targets).backward()
    exact = flat_grad(model)

    gact = copy.deepcopy(model)
    gact.zero_grad(set_to_none=True)
    torch._dynamo.reset()
    backend = gact_fx.backend(compiler="eager", bits=8, min_numel=0)
    output = torch.compile(gact, backend=backend, fullgraph=True)(inputs)
    task.loss(output, targets).backward()
    return relative_error(flat_grad(gact), exact), tuple(output.shape), backend.report()


def test_the_llama_task_trains_through_gact_with_its_norm_outputs_rebuilt():
    error, shape, report = one_step_at_8_bits("charlm-llama", 2, context=16)
    assert error < 2e-2 and shape == (2, 16, 256)
    # RMSNorm's normalised and scaled outputs are rebuilt from its input and 1/rms
    assert [r for r in report.rows if r.stored.startswith("rebuilt in the backward from ")]


def test_the_masked_lm_task_masks_a_share_of_bytes_and_trains_through_gact():
    task = TASKS["charlm-bert"](batch_size=4, context=32)
    (tokens,), targets = task.batch(0, torch.Generator().manual_seed(0))
    masked = tokens == task.MASK_TOKEN
    assert torch.equal(masked, targets != -100) and 0.05 < masked.float().mean() < 0.3
    assert torch.equal(task.val_batches[0][0], task._window(task.val_tokens, task.val_starts[0])[0])  # fixed masks

    error, shape, report = one_step_at_8_bits("charlm-bert", 4, context=32)
    assert error < 2e-2 and shape == (4, 32, task.VOCAB)
    # the local attention's mask is held as bools, not as floats at the attention floor
    (select,) = [r for r in report.rows if r.producer == "where.self"]
    assert select.stored.startswith("rebuilt in the backward from ")


def test_the_digits_vit_task_classifies_through_gact():
    error, shape, _ = one_step_at_8_bits("digits-vit", 8)
    assert error < 2e-2 and shape == (8, 10)
