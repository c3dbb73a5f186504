"""The model families users bring, built offline from configs, for the API tests."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..helpers import HFWrapper, model_case


class ViTWrapper(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, pixels):
        return self.model(pixel_values=pixels).last_hidden_state


class GCN(nn.Module):
    """Two PyG GCN layers: PyG's message passing graph-breaks under Dynamo."""

    def __init__(self, features: int = 34, hidden: int = 64, classes: int = 4):
        super().__init__()
        from torch_geometric.nn import GCNConv

        self.conv1, self.conv2 = GCNConv(features, hidden), GCNConv(hidden, classes)

    def forward(self, x, edge_index):
        return self.conv2(F.relu(self.conv1(x, edge_index)), edge_index)


class Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return 2 * x * grad


@torch.library.custom_op("gact_tests::cube", mutates_args=())
def cube(x: torch.Tensor) -> torch.Tensor:
    return x**3


@cube.register_fake
def _cube_fake(x):
    return torch.empty_like(x)


def _cube_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])


def _cube_backward(ctx, grad):
    (x,) = ctx.saved_tensors
    return 3 * x * x * grad


cube.register_autograd(_cube_backward, setup_context=_cube_setup)


class WithFunction(nn.Module):
    """A custom ``torch.autograd.Function`` in the middle (it saves its input)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(64, 256), nn.Linear(256, 10)

    def forward(self, x):
        return self.b(Square.apply(self.a(x)))


class WithCustomOp(nn.Module):
    """A ``torch.library`` custom op with its own autograd (it saves its input)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(64, 256), nn.Linear(256, 10)

    def forward(self, x):
        return self.b(cube(self.a(x)))


class Untraceable(nn.Module):
    """A forward torch.compile will not trace at all."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(64, 256), nn.Linear(256, 10)

    @torch._dynamo.disable
    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


def family(name: str):
    """(model, inputs) for each family the rewrite API must handle."""
    import transformers as T

    torch.manual_seed(0)
    if name in ("bert", "gpt2", "conv"):
        return model_case(name)
    if name == "llama":
        config = T.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
        return HFWrapper(T.LlamaModel(config)), (torch.randint(0, 128, (2, 32)),)
    if name == "vit":
        config = T.ViTConfig(image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                             intermediate_size=128, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        return ViTWrapper(T.ViTModel(config)), (torch.randn(4, 3, 32, 32),)
    if name == "gcn":
        from torch_geometric.datasets import KarateClub

        data = KarateClub()[0]
        return GCN(), (data.x, data.edge_index)
    if name == "function":
        return WithFunction(), (torch.randn(64, 64),)
    if name == "custom_op":
        return WithCustomOp(), (torch.randn(64, 64),)
    if name == "untraceable":
        return Untraceable(), (torch.randn(64, 64),)
    raise KeyError(name)
