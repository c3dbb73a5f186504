"""gact with the other memory savers: it compresses what they still save."""

import copy
import functools

import pytest
import torch
import torch.nn as nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

import gact_fx
from gact_fx.measure import saved_activation_bytes

from .helpers import TransformerBlock, baseline_backend, flat_grad, model_case, projection_loss, relative_error

aten = torch.ops.aten


class Checkpointed(nn.Module):
    """Blocks under torch.utils.checkpoint; ``policy`` makes it selective."""

    def __init__(self, blocks: int = 2, policy=None):
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(TransformerBlock() for _ in range(blocks))
        self.policy = policy

    def forward(self, x):
        for block in self.blocks:
            context = functools.partial(create_selective_checkpoint_contexts, self.policy) if self.policy else None
            kwargs = {"context_fn": context} if context else {}
            x = checkpoint(block, x, use_reentrant=False, **kwargs)
        return x


def save_matmuls(ctx, op, *args, **kwargs):
    return CheckpointPolicy.MUST_SAVE if op in (aten.mm.default, aten.addmm.default) else CheckpointPolicy.PREFER_RECOMPUTE


def step(model, x, backend, patches=None):
    model = copy.deepcopy(model)
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    with patches or torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        projection_loss(compiled(x)).backward()
        saved = saved_activation_bytes(compiled, x)
    return flat_grad(model), saved


@pytest.mark.parametrize("policy", [None, save_matmuls], ids=["checkpoint", "selective"])
def test_checkpointing_then_compression(policy):
    model, x = Checkpointed(policy=policy), torch.randn(8, 32, 64)
    expected, checkpoint_bytes = step(model, x, baseline_backend())
    exact, _ = step(model, x, gact_fx.backend(bits=32, min_numel=1024))
    assert torch.equal(exact, expected)
    got, _ = step(model, x, gact_fx.backend(bits=8, min_numel=1024))
    assert relative_error(got, expected) < 2e-2
    _, gact_bytes = step(model, x, gact_fx.backend(bits=4, min_numel=1024))
    assert gact_bytes < checkpoint_bytes / 3  # it compressed what checkpointing still saved


def test_memory_budget_then_compression():
    model, (x,) = model_case("block")
    budget = lambda: torch._functorch.config.patch(activation_memory_budget=0.5)  # noqa: E731
    expected, budget_bytes = step(model, x, baseline_backend(), budget())
    got, both_bytes = step(model, x, gact_fx.backend(bits=8), budget())
    _, plain_bytes = step(model, x, baseline_backend())
    assert budget_bytes < plain_bytes and both_bytes < budget_bytes / 3
    assert relative_error(got, expected) < 2e-2


@pytest.mark.parametrize("options", [{"bits": 32, "offload": True}, {"level": "L3"}])
def test_offloading_moves_the_blobs(options):
    model, (x,) = model_case("block")
    expected, _ = step(model, x, baseline_backend())
    backend = gact_fx.backend(**options)
    got, _ = step(model, x, backend)
    forward, backward = backend.records[0].code_after
    blobs = sum(1 for r in backend.report().rows if r.stored == "compressed")
    assert forward.count("prims.device_put") == backward.count("prims.device_put") == blobs  # out, and back
    if options.get("bits") == 32:
        assert torch.equal(got, expected)
    else:
        assert relative_error(got, expected) < 2e-2
