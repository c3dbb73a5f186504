"""Checkpoint and resume: model, optimizer and gact controller state round-trip through torch.save."""

import pytest
import torch

import gact_fx

from .helpers import model_case, projection_loss


def train(model, optimizer, x, steps):
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        projection_loss(model(x)).backward()
        optimizer.step()


def fresh(options):
    model, (x,) = model_case("block")
    model = gact_fx.compress(model, **options)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4), x


def test_a_resumed_run_keeps_its_bits_and_schedule(tmp_path):
    options = dict(level="L2.2", adapt_interval=4, probe_tensors=3)
    model, optimizer, x = fresh(options)
    train(model, optimizer, x, 8)
    controller = model.gact.controller
    (region,) = controller.regions.values()
    assert region.adaptations >= 2 and len(set(controller.bits().values())) > 1
    path = tmp_path / "checkpoint.pt"
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "gact": controller.state_dict()}, path)

    torch._dynamo.reset()
    resumed, resumed_optimizer, _ = fresh(options)
    state = torch.load(path)
    resumed.load_state_dict(state["model"])
    resumed_optimizer.load_state_dict(state["optimizer"])
    resumed.gact.controller.load_state_dict(state["gact"])  # before the first step: applied when compiled
    train(resumed, resumed_optimizer, x, 1)
    (resumed_region,) = resumed.gact.controller.regions.values()
    assert resumed.gact.controller.bits() == controller.bits()
    assert resumed.gact.controller.sensitivities() == controller.sensitivities()
    assert resumed_region.calls == region.calls + 1 and resumed_region.adaptations == region.adaptations  # no re-probe


def test_an_unknown_state_version_is_refused():
    model, _, _ = fresh(dict(level="L2"))
    with pytest.raises(ValueError, match="unknown gact controller state version"):
        model.gact.controller.load_state_dict({"version": 99, "regions": {}})
