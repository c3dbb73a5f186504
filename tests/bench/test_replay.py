"""Replaying a convergence run with the exact gradient beside the compressed one (``gact_fx.bench.replay``)."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from gact_fx.bench.replay import replay
from gact_fx.bench.train import train


class TanhTask:
    """A small tanh MLP on fresh random batches, under Adam."""

    name = "tanh"
    metric = "loss"

    def model(self) -> nn.Module:
        return nn.Sequential(nn.Linear(16, 256), nn.Tanh(), nn.Linear(256, 4))

    def optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.Adam(model.parameters(), lr=1e-2)

    def batch(self, step: int, generator: torch.Generator):
        x = torch.randn(64, 16, generator=generator)
        return (x,), x[:, :4].sin()

    def loss(self, output, target) -> torch.Tensor:
        return F.mse_loss(output, target)

    def evaluate(self, model) -> float:
        return 0.0


OPTIONS = {"compiler": "eager", "min_numel": 0}


def test_the_replay_follows_the_convergence_run_and_measures_its_error():
    task = TanhTask()
    trained = train(task, "2 bit", OPTIONS | {"bits": 2}, steps=6, eval_every=6)
    replayed = replay(task, OPTIONS | {"bits": 2}, steps=6)
    assert [r.norm for r in replayed] == pytest.approx(trained.grad_norms, rel=1e-5)
    assert all(0.01 < r.relative_error < 1 for r in replayed)
    assert [r.exact_norm for r in replayed] != pytest.approx([r.norm for r in replayed], rel=1e-3)


def test_at_32_bits_the_compressed_gradient_is_the_exact_one():
    rows = replay(TanhTask(), OPTIONS | {"bits": 32}, steps=3)
    assert all(r.relative_error < 1e-6 for r in rows)
