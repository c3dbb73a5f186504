"""The model zoo of ``gact-fx bench``, built offline from configs at a few sizes.

Each entry gives a fresh model, a batch of a given size, and a loss. Transformers models
come from their configs with random weights (no download); the graph models run on a
random graph generated in memory; the CNN is the MNIST-1D CNN of the examples.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn

SIZES = ("tiny", "small", "base", "large")


@dataclass
class Workload:
    model: nn.Module
    batch: Callable[[int], tuple]  # batch size -> model inputs
    loss: Callable[[object], torch.Tensor]  # model output -> scalar
    default_batch: int
    checkpointing: Callable[[nn.Module], None] | None = None  # turn on per-block checkpointing


def _square_mean(output) -> torch.Tensor:
    return output.float().square().mean()


class _Hidden(nn.Module):
    """A transformers model returning one tensor."""

    def __init__(self, model: nn.Module, field: str, key: str):
        super().__init__()
        self.model, self.field, self.key = model, field, key

    def forward(self, x):
        return getattr(self.model(**{self.key: x}), self.field)


def checkpoint_blocks(wrapper: nn.Module) -> None:
    """Per-block checkpointing of a wrapped transformers model."""
    wrapper.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


_TEXT = {  # layers, hidden, heads, sequence
    "tiny": (2, 64, 4, 64), "small": (4, 256, 4, 128), "base": (12, 768, 12, 512), "large": (24, 1024, 16, 512),
}


TEXT_VOCAB = 1024


def text_model(kind: str, layers: int, hidden: int, heads: int, sequence: int) -> nn.Module:
    """A transformers BERT, GPT-2 or Llama from its config (random weights), wrapped to take
    token ids and return the last hidden state; ``checkpoint_blocks`` turns on its
    per-block checkpointing."""
    import transformers as T

    vocab = TEXT_VOCAB
    if kind == "bert":
        model = T.BertModel(T.BertConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                                         intermediate_size=4 * hidden, max_position_embeddings=sequence))
    elif kind == "gpt2":
        model = T.GPT2Model(T.GPT2Config(vocab_size=vocab, n_embd=hidden, n_layer=layers, n_head=heads, n_positions=sequence,
                                         bos_token_id=0, eos_token_id=0))
    else:
        model = T.LlamaModel(T.LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
                                           num_attention_heads=heads, num_key_value_heads=max(1, heads // 2), max_position_embeddings=sequence))
    return _Hidden(model, "last_hidden_state", "input_ids")


def _text_model(kind: str, size: str, device) -> Workload:
    layers, hidden, heads, sequence = _TEXT[size]
    wrapper = text_model(kind, layers, hidden, heads, sequence).to(device)
    generator = torch.Generator().manual_seed(0)
    batch = lambda n: (torch.randint(0, TEXT_VOCAB, (n, sequence), generator=generator).to(device),)  # noqa: E731
    return Workload(wrapper, batch, _square_mean, {"tiny": 8, "small": 8, "base": 16, "large": 8}[size], checkpoint_blocks)


_IMAGES = {"tiny": 32, "small": 64, "base": 224, "large": 224}


def _vision_model(kind: str, size: str, device) -> Workload:
    import transformers as T

    image = _IMAGES[size]
    if kind == "vit":
        layers, hidden, heads, _ = _TEXT[size]
        model = T.ViTModel(T.ViTConfig(image_size=image, patch_size=16 if image >= 224 else 8, hidden_size=hidden, num_hidden_layers=layers,
                                       num_attention_heads=heads, intermediate_size=4 * hidden))
        wrapper, checkpointing = _Hidden(model, "last_hidden_state", "pixel_values"), checkpoint_blocks
    elif kind == "resnet":
        depths = {"tiny": [1, 1, 1, 1], "small": [2, 2, 2, 2], "base": [3, 4, 6, 3], "large": [3, 4, 23, 3]}[size]
        model = T.ResNetModel(T.ResNetConfig(layer_type="bottleneck", depths=depths, hidden_sizes=[256, 512, 1024, 2048], embedding_size=64))
        wrapper, checkpointing = _Hidden(model, "pooler_output", "pixel_values"), None
    else:
        depths = {"tiny": [1, 1, 1, 1], "small": [2, 2, 2, 2], "base": [3, 3, 9, 3], "large": [3, 3, 27, 3]}[size]
        model = T.ConvNextModel(T.ConvNextConfig(depths=depths, hidden_sizes=[96, 192, 384, 768], image_size=image))
        wrapper, checkpointing = _Hidden(model, "pooler_output", "pixel_values"), None
    wrapper = wrapper.to(device)
    generator = torch.Generator().manual_seed(0)
    batch = lambda n: (torch.randn(n, 3, image, image, generator=generator).to(device),)  # noqa: E731
    return Workload(wrapper, batch, _square_mean, {"tiny": 8, "small": 8, "base": 32, "large": 32}[size], checkpointing)


class _GraphNet(nn.Module):
    def __init__(self, kind: str, features: int, hidden: int, classes: int, layers: int):
        super().__init__()
        from torch_geometric.nn import GCNConv, SAGEConv

        conv = GCNConv if kind == "gcn" else SAGEConv
        sizes = [features] + [hidden] * (layers - 1) + [classes]
        self.convs = nn.ModuleList(conv(a, b) for a, b in zip(sizes, sizes[1:]))

    def forward(self, x, edge_index):
        for index, conv in enumerate(self.convs):
            x = conv(x, edge_index)
            if index < len(self.convs) - 1:
                x = torch.relu(x)
        return x


def _graph_model(kind: str, size: str, device) -> Workload:
    nodes, hidden, layers = {"tiny": (1000, 64, 2), "small": (5000, 128, 3), "base": (50_000, 256, 3), "large": (200_000, 256, 4)}[size]
    features = 64
    model = _GraphNet(kind, features, hidden, 16, layers).to(device)
    generator = torch.Generator().manual_seed(0)

    def batch(scale: int):  # "batch size": graphs of scale x the base node count
        count = nodes * max(1, scale) // 8
        x = torch.randn(count, features, generator=generator).to(device)
        edges = torch.randint(0, count, (2, 8 * count), generator=generator).to(device)
        return x, edges

    return Workload(model, batch, _square_mean, 8)


def _cnn(size: str, device) -> Workload:
    from .tasks import CNN1d

    channels = {"tiny": 32, "small": 64, "base": 128, "large": 256}[size]
    model = CNN1d(channels=channels).to(device)
    generator = torch.Generator().manual_seed(0)
    batch = lambda n: (torch.randn(n, 40, generator=generator).to(device),)  # noqa: E731
    return Workload(model, batch, _square_mean, {"tiny": 64, "small": 128, "base": 512, "large": 1024}[size])


ZOO: dict[str, Callable[[str, object], Workload]] = {
    "bert": lambda size, device: _text_model("bert", size, device),
    "gpt2": lambda size, device: _text_model("gpt2", size, device),
    "llama": lambda size, device: _text_model("llama", size, device),
    "vit": lambda size, device: _vision_model("vit", size, device),
    "resnet": lambda size, device: _vision_model("resnet", size, device),
    "convnext": lambda size, device: _vision_model("convnext", size, device),
    "gcn": lambda size, device: _graph_model("gcn", size, device),
    "sage": lambda size, device: _graph_model("sage", size, device),
    "cnn": lambda size, device: _cnn(size, device),
}


def build(name: str, size: str, device="cpu") -> Workload:
    if name not in ZOO:
        raise ValueError(f"unknown model {name!r}; the zoo has {sorted(ZOO)}")
    if size not in SIZES:
        raise ValueError(f"size must be one of {SIZES}, got {size!r}")
    torch.manual_seed(0)
    return ZOO[name](size, device)
