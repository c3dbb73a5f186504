"""The convergence harness's training loop (``gact_fx.bench.train``)."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from gact_fx.bench.train import train, warm_start


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


class NoisyMlpTask:
    """A two-layer MLP under AdamW on random batches drawn from the run's generator: every part
    of a run's state (weights, optimizer moments, schedule, data order) changes each step."""

    name = "noisy-mlp"
    metric = "weight sum"

    def model(self) -> nn.Module:
        return nn.Sequential(nn.Linear(8, 256), nn.ReLU(), nn.Linear(256, 1))

    def optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.AdamW(model.parameters(), lr=1e-2)

    def batch(self, step: int, generator: torch.Generator):
        x = torch.randn(256, 8, generator=generator)
        return (x,), x.sum(1, keepdim=True).sin()

    def loss(self, output, target) -> torch.Tensor:
        return F.mse_loss(output, target)

    def evaluate(self, model) -> float:
        return float(sum(p.detach().double().sum() for p in model.parameters()))


def test_fp32_continued_from_a_warm_start_is_the_uninterrupted_run():
    task = NoisyMlpTask()
    whole = train(task, "fp32", {"enabled": False}, steps=7, eval_every=1)
    warm = warm_start(task, steps=3, then=4)
    continued = train(task, "fp32", {"enabled": False}, steps=4, eval_every=1, warm=warm)
    assert continued.warm_steps == 3
    assert continued.curve == whole.curve[3:]
    assert continued.grad_norms == whole.grad_norms[3:]


def test_a_method_continues_from_the_warm_state_and_compresses():
    task = NoisyMlpTask()
    warm = warm_start(task, steps=3, then=2)
    run = train(task, "2 bit", {"bits": 2}, steps=2, eval_every=1, warm=warm)
    fresh = train(task, "2 bit", {"bits": 2}, steps=2, eval_every=1)
    assert [step for step, _ in run.curve] == [4, 5]
    assert run.activation_ratio > 4
    assert run.grad_norms[0] != pytest.approx(fresh.grad_norms[0], rel=1e-3)  # not from init


def test_a_warm_start_made_for_other_steps_is_refused():
    task = NoisyMlpTask()
    with pytest.raises(ValueError, match="warm start was made for 4 more steps, not 5"):
        train(task, "fp32", {"enabled": False}, steps=5, eval_every=1, warm=warm_start(task, steps=1, then=4))


def test_the_rounding_seed_moves_only_the_rounding():
    task = NoisyMlpTask()
    runs = {noise: train(task, "2 bit", {"bits": 2}, steps=2, eval_every=1, noise_seed=noise) for noise in (None, 0, 5)}
    assert runs[0].grad_norms == runs[None].grad_norms  # the default rounding seed is the run's seed
    assert runs[5].grad_norms[0] != pytest.approx(runs[0].grad_norms[0], rel=1e-6)
    exact = train(task, "fp32", {"enabled": False}, steps=1, eval_every=1, noise_seed=5)
    assert exact.grad_norms == train(task, "fp32", {"enabled": False}, steps=1, eval_every=1).grad_norms
