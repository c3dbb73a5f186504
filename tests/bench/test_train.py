"""The convergence harness's training loop (``gact_fx.bench.train``)."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from gact_fx.bench.train import train


class LineTask:
    """One linear map under plain SGD, so that a clipped gradient moves the weight proportionally less."""

    name = "line"
    metric = "weight sum"

    def model(self) -> nn.Module:
        torch.manual_seed(0)
        return nn.Linear(4, 1, bias=False)

    def optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.SGD(model.parameters(), lr=1.0)

    def batch(self, step: int, generator: torch.Generator):
        return (torch.ones(2, 4),), torch.full((2, 1), 3.0)

    def loss(self, output, target) -> torch.Tensor:
        return F.mse_loss(output, target)

    def evaluate(self, model) -> float:
        return float(sum(p.detach().sum() for p in model.parameters()))


def test_clipping_scales_the_step_and_records_the_unclipped_norm():
    task = LineTask()
    start = task.evaluate(task.model())
    free = train(task, "fp32", {"enabled": False}, steps=1, eval_every=1)
    clipped = train(task, "fp32", {"enabled": False}, steps=1, eval_every=1, max_grad_norm=free.grad_norms[0] / 10)
    assert clipped.grad_norms == pytest.approx(free.grad_norms)
    assert free.final - start != pytest.approx(0.0)
    assert clipped.final - start == pytest.approx((free.final - start) / 10, rel=1e-4)
