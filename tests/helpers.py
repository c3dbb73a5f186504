"""Models, losses and gradient statistics shared by the tests."""

from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

import gact_fx
from gact_fx.bench.tasks import Block as TransformerBlock  # pre-norm attention + GELU MLP


class MLP(nn.Module):
    def __init__(self, width: int = 256):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.GELU(), nn.Linear(width, 10)
        )

    def forward(self, x):
        return self.net(x)


class ConvBlock(nn.Module):
    """Two conv + BatchNorm + ReLU stages, global average pooling, linear head."""

    def __init__(self, channels: int = 16):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(3, channels, 3, padding=1), nn.BatchNorm2d(channels)
        self.c2, self.b2 = nn.Conv2d(channels, channels, 3, padding=1), nn.BatchNorm2d(channels)
        self.head = nn.Linear(channels, 10)

    def forward(self, x):
        x = F.relu(self.b1(self.c1(x)))
        x = F.relu(self.b2(self.c2(x)))
        return self.head(x.mean((2, 3)))


class HFWrapper(nn.Module):
    """A transformers model returning its last hidden state as a plain tensor."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids).last_hidden_state


def tiny_bert(dropout: float = 0.0) -> nn.Module:
    from transformers import BertConfig, BertModel

    config = BertConfig(
        vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=256, max_position_embeddings=64,
        hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout,
    )
    return HFWrapper(BertModel(config))


def tiny_gpt2(dropout: float = 0.0) -> nn.Module:
    from transformers import GPT2Config, GPT2Model

    config = GPT2Config(
        vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=64,
        resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout,
    )
    return HFWrapper(GPT2Model(config))


def model_case(name: str):
    """(model, inputs) for the named test model, built from a fixed seed."""
    torch.manual_seed(0)
    if name == "mlp":
        return MLP(), (torch.randn(64, 64),)
    if name == "block":
        return TransformerBlock(), (torch.randn(8, 32, 64),)
    if name == "conv":
        return ConvBlock(), (torch.randn(8, 3, 16, 16),)
    if name == "bert":
        return tiny_bert(), (torch.randint(0, 128, (4, 32)),)
    if name == "gpt2":
        return tiny_gpt2(), (torch.randint(0, 128, (4, 32)),)
    raise KeyError(name)


def projection_loss(output: torch.Tensor) -> torch.Tensor:
    """A fixed random projection of the output: a loss whose gradient is generic.

    (``(out ** 2).mean()`` is a bad probe after a final LayerNorm: at initialisation its
    gradient is parallel to the normalised output and LayerNorm's backward cancels it.)
    """
    weights = torch.randn(output.shape, generator=torch.Generator().manual_seed(1)).to(output.device)
    return (output.float() * weights).sum()


def flat_grad(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def compiled_grads(model, inputs, backend, *, steps: int = 1, fullgraph: bool = True, **compile_kwargs):
    """Flat parameter gradients of ``steps`` fresh backward passes through one compile."""
    model = copy.deepcopy(model)
    compiled = torch.compile(model, backend=backend, fullgraph=fullgraph, **compile_kwargs)
    draws = []
    for _ in range(steps):
        model.zero_grad(set_to_none=True)
        torch.manual_seed(0)  # identical dropout masks in every run
        projection_loss(compiled(*inputs)).backward()
        draws.append(flat_grad(model))
    return draws, compiled


def relative_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    return ((value - reference).norm() / reference.norm()).item()


def floor_ratio(draws: list[torch.Tensor], exact: torch.Tensor) -> float:
    """The error of the mean over ``draws`` against the averaging floor (one draw's mean
    error over the square root of their number): about 1 when the gradient is unbiased,
    growing with the number of draws when it is not."""
    single = sum(relative_error(d, exact) for d in draws) / len(draws)
    return relative_error(torch.stack(draws).mean(0), exact) / (single / len(draws) ** 0.5)


def baseline_backend(compiler: str = "eager") -> gact_fx.GactBackend:
    """The same compile path with compression disabled."""
    return gact_fx.backend(enabled=False, compiler=compiler)


def squared_loss_grad(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The exact gradient of ``model(x).pow(2).sum()``, on a copy of ``model``."""
    model = copy.deepcopy(model)
    model(x).pow(2).sum().backward()
    return flat_grad(model)


def one_gact_step(model: nn.Module, x: torch.Tensor, compiler: str = "eager", **options):
    """One step of ``model(x).pow(2).sum()`` through gact, on a copy of ``model``: the
    report's compressions and the gradient. Fails on a graph break."""
    torch._dynamo.reset()
    model = copy.deepcopy(model)
    backend = gact_fx.backend(compiler=compiler, min_numel=0, **options)
    counters = torch._dynamo.utils.counters
    counters.clear()
    torch.compile(model, backend=backend, fullgraph=True)(x).pow(2).sum().backward()
    assert counters["stats"]["unique_graphs"] == 1
    compressions = [c for record in backend.report().records for c in record.compressions]
    return compressions, flat_grad(model)


def one_graph_step(make_model, x, **options):
    """The report and the gradient of one step of ``make_model()(x).pow(2).sum()``,
    compiled as one graph."""
    torch._dynamo.reset()
    backend = gact_fx.backend(compiler="eager", min_numel=0, **options)
    counters = torch._dynamo.utils.counters
    counters.clear()
    model = make_model()
    torch.compile(model, backend=backend, fullgraph=True)(x).pow(2).sum().backward()
    assert counters["stats"]["unique_graphs"] == 1
    return backend.report(), flat_grad(model)


def dynamic_batch_steps(make_model, x, batches=(8, 3, 5), **options) -> gact_fx.GactBackend:
    """One gact compile with ``dynamic=True`` of ``make_model()``, stepped on ``x[:b]`` for
    each batch size ``b``: each gradient within 2e-2 of the exact one, one graph for all.
    Returns the backend."""
    torch._dynamo.reset()
    backend = gact_fx.backend(compiler="eager", min_numel=0, **options)
    counters = torch._dynamo.utils.counters
    counters.clear()
    model = make_model()
    step = torch.compile(model, backend=backend, fullgraph=True, dynamic=True)
    for batch in batches:
        part = x[:batch].clone()
        model.zero_grad(set_to_none=True)
        step(part).pow(2).sum().backward()
        assert relative_error(flat_grad(model), squared_loss_grad(make_model(), part)) < 2e-2
    assert counters["stats"]["unique_graphs"] == 1
    return backend


def loss_draws(model: nn.Module, inputs, loss_fn, backend, draws: int, warmup: int = 0,
               fullgraph: bool = True) -> list[torch.Tensor]:
    """Gradients of ``loss_fn(model(*inputs))`` from ``draws`` steps through one compile
    with ``backend``, after ``warmup`` steps not kept (an adaptive backend's probes), on a
    copy of ``model``."""
    torch._dynamo.reset()
    model = copy.deepcopy(model)
    compiled = torch.compile(model, backend=backend, fullgraph=fullgraph)
    result = []
    for index in range(warmup + draws):
        model.zero_grad(set_to_none=True)
        loss_fn(compiled(*inputs)).backward()
        if index >= warmup:
            result.append(flat_grad(model))
    return result


def gact_draws(model: nn.Module, x: torch.Tensor, draws: int, compiler: str = "eager", **options):
    """Gradients of ``model(x).pow(2).sum()`` from ``draws`` steps through one gact
    compile (fresh rounding noise in each), on a copy of ``model``."""
    backend = gact_fx.backend(compiler=compiler, min_numel=0, **options)
    return loss_draws(model, (x,), lambda output: output.pow(2).sum(), backend, draws, fullgraph=False)
