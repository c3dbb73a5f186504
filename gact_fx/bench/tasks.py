"""Real training tasks that run offline (``TASKS``): four classifications and three character LMs.

* ``Mnist1dTask``: MNIST-1D generated on the spot (``mnist1d.data.make_dataset``), a
  three-layer 1-D CNN; metric: test accuracy.
* ``CharLMTask``: a small pre-norm GPT trained on Python's own standard library sources
  (read from this interpreter's ``stdlib`` directory, bytes as tokens); metric:
  validation loss in nats per character.
* ``CharLlamaTask``: the same data and metric, with a Llama from transformers (RMSNorm,
  SiLU-gated MLP, rotary positions, grouped-query SDPA) in place of the GPT.
* ``CharBertTask``: the same data, a BERT-like encoder (transformers' ModernBERT) trained
  as a masked LM (15% of the bytes replaced by a mask token, predicted from both sides);
  metric: validation loss on the masked bytes.
* ``DigitsTask``: scikit-learn's bundled 8x8 digits, an MLP; metric: test accuracy.
* ``DigitsVitTask``: the same digits, a ViT from transformers (2x2 patches); metric: test
  accuracy.
* ``KarateTask``: Zachary's karate club (bundled with PyG), a two-layer GCN; metric:
  test accuracy (on the nodes held out of training).

Each builds the same data, order and initial weights for a given seed, so methods
differ only in how saved activations are compressed.
"""

from __future__ import annotations

import math
import pathlib
import sysconfig

import torch
import torch.nn as nn
import torch.nn.functional as F

from .zoo import _Hidden


class CNN1d(nn.Module):
    def __init__(self, channels: int = 64, length: int = 40):
        super().__init__()
        self.conv1 = nn.Conv1d(1, channels, 5, padding=2)
        self.conv2 = nn.Conv1d(channels, channels, 3, padding=1)
        self.conv3 = nn.Conv1d(channels, channels, 3, padding=1)
        self.head = nn.Linear(channels * length, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x.unsqueeze(1)))
        x = F.relu(self.conv2(x))
        x = F.relu(self.conv3(x))
        return self.head(x.flatten(1))


def load_mnist1d(seed: int = 0):
    """(x_train, y_train, x_test, y_test) tensors; generated, never downloaded."""
    from mnist1d.data import get_dataset_args, make_dataset

    args = get_dataset_args()
    args.seed = seed
    data = make_dataset(args)
    floats = lambda key: torch.as_tensor(data[key], dtype=torch.float32)  # noqa: E731
    labels = lambda key: torch.as_tensor(data[key], dtype=torch.long)  # noqa: E731
    return floats("x"), labels("y"), floats("x_test"), labels("y_test")


class _TensorClassification:
    """Shared by the tasks whose data are in-memory (x, y) train and test tensors."""

    metric = "test accuracy"
    higher_is_better = True
    batch_size: int
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor

    def batch(self, step: int, generator: torch.Generator):
        index = torch.randint(0, len(self.x_train), (self.batch_size,), generator=generator)
        return (self.x_train[index],), self.y_train[index]

    def loss(self, output, target) -> torch.Tensor:
        return F.cross_entropy(output, target)

    @torch.no_grad()
    def evaluate(self, model) -> float:
        return (model(self.x_test).argmax(1) == self.y_test).float().mean().item()


class Mnist1dTask(_TensorClassification):
    name = "mnist1d-cnn"

    def __init__(self, batch_size: int = 100, seed: int = 0):
        self.batch_size = batch_size
        self.x_train, self.y_train, self.x_test, self.y_test = load_mnist1d(seed)

    def model(self) -> nn.Module:
        return CNN1d()

    def optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.Adam(model.parameters(), lr=2e-3)


class Block(nn.Module):
    """Pre-norm block: LayerNorm, causal SDPA attention, GELU MLP, residuals (also the
    tests' transformer block: the override tests name its tensors by ``ln1``, ``qkv``, ``fc1``)."""

    def __init__(self, dim: int = 64, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        attention = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attention.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class CharGPT(nn.Module):
    """A pre-norm GPT over bytes."""

    def __init__(self, dim: int = 128, layers: int = 4, heads: int = 4, context: int = 128):
        super().__init__()
        self.embed = nn.Embedding(256, dim)
        self.position = nn.Parameter(torch.randn(context, dim) * 0.02)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, 256)

    def forward(self, tokens):
        x = self.embed(tokens) + self.position[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def python_sources(max_bytes: int = 4_000_000) -> bytes:
    """The interpreter's own standard library sources, in a fixed order."""
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    chunks, total = [], 0
    for path in sorted(root.glob("*.py")):
        data = path.read_bytes()
        chunks.append(data)
        total += len(data)
        if total >= max_bytes:
            break
    return b"".join(chunks)[:max_bytes]


class CharLMTask:
    name = "char-lm"
    metric = "validation loss"
    higher_is_better = False

    def __init__(self, batch_size: int = 32, context: int = 128, eval_batches: int = 16, seed: int = 0):
        corpus = torch.frombuffer(bytearray(python_sources()), dtype=torch.uint8).long()
        split = int(0.9 * len(corpus))
        self.train_tokens, self.val_tokens = corpus[:split], corpus[split:]
        self.batch_size, self.context = batch_size, context
        generator = torch.Generator().manual_seed(seed + 1)
        starts = torch.randint(0, len(self.val_tokens) - context - 1, (eval_batches * batch_size,), generator=generator)
        self.val_starts = starts.split(batch_size)
        self.val_batches = [self._window(self.val_tokens, s) for s in self.val_starts]

    def _window(self, tokens, starts):
        index = starts[:, None] + torch.arange(self.context + 1)
        window = tokens[index]
        return window[:, :-1], window[:, 1:]

    def model(self) -> nn.Module:
        return CharGPT(context=self.context)

    def optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)

    def batch(self, step: int, generator: torch.Generator):
        starts = torch.randint(0, len(self.train_tokens) - self.context - 1, (self.batch_size,), generator=generator)
        inputs, targets = self._window(self.train_tokens, starts)
        return (inputs,), targets

    def loss(self, output, target) -> torch.Tensor:
        return F.cross_entropy(output.reshape(-1, 256), target.reshape(-1))

    @torch.no_grad()
    def evaluate(self, model) -> float:
        losses = [self.loss(model(inputs), targets).item() for inputs, targets in self.val_batches]
        return sum(losses) / len(losses)


class CharLlamaTask(CharLMTask):
    name = "char-llama"

    def model(self) -> nn.Module:
        import transformers as T

        config = T.LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=self.context,
                               attn_implementation="sdpa")
        return _Hidden(T.LlamaForCausalLM(config), "logits", "input_ids")


class CharBertTask(CharLMTask):
    """A BERT-like masked LM over bytes: each batch masks ``MASK_RATE`` of its positions."""

    name = "char-bert"
    MASK_TOKEN = 256
    MASK_RATE = 0.15
    VOCAB = 257

    def _window(self, tokens, starts, generator=None):
        index = starts[:, None] + torch.arange(self.context)
        inputs = tokens[index]
        if generator is None:  # a validation batch: masks fixed by where it starts
            generator = torch.Generator().manual_seed(int(starts[0]))
        masked = torch.rand(inputs.shape, generator=generator) < self.MASK_RATE
        targets = torch.where(masked, inputs, -100)
        return inputs.masked_fill(masked, self.MASK_TOKEN), targets

    def batch(self, step: int, generator: torch.Generator):
        starts = torch.randint(0, len(self.train_tokens) - self.context - 1, (self.batch_size,), generator=generator)
        inputs, targets = self._window(self.train_tokens, starts, generator)
        return (inputs,), targets

    def model(self) -> nn.Module:
        import transformers as T

        # ModernBERT: pre-norm, rotary positions, GeGLU; global attention every third layer, a
        # 64-token window in the others.
        # (A post-norm BERT with learned positions sat at the unigram loss for 800 steps.)
        config = T.ModernBertConfig(vocab_size=self.VOCAB, hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                                    num_attention_heads=4, max_position_embeddings=self.context, local_attention=64,
                                    pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2,
                                    mask_token_id=self.MASK_TOKEN, attention_dropout=0.0, embedding_dropout=0.0,
                                    mlp_dropout=0.0, attn_implementation="sdpa")
        return _Hidden(T.ModernBertForMaskedLM(config), "logits", "input_ids")

    def loss(self, output, target) -> torch.Tensor:
        return F.cross_entropy(output.reshape(-1, self.VOCAB), target.reshape(-1), ignore_index=-100)


class DigitsTask(_TensorClassification):
    """sklearn's bundled 8x8 digits, an MLP."""

    name = "digits-mlp"

    def __init__(self, batch_size: int = 64, seed: int = 0):
        from sklearn.datasets import load_digits

        data = load_digits()
        x = torch.as_tensor(data.data, dtype=torch.float32) / 16.0
        y = torch.as_tensor(data.target, dtype=torch.long)
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
        split = int(0.8 * len(x))
        self.x_train, self.y_train = x[order[:split]], y[order[:split]]
        self.x_test, self.y_test = x[order[split:]], y[order[split:]]
        self.batch_size = batch_size

    def model(self) -> nn.Module:
        return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))

    def optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.Adam(model.parameters(), lr=1e-3)


class _DigitsVit(nn.Module):
    """transformers' ViT over the 8x8 digits as one-channel images, 2x2 patches."""

    def __init__(self):
        super().__init__()
        import transformers as T

        config = T.ViTConfig(image_size=8, patch_size=2, num_channels=1, hidden_size=64, num_hidden_layers=4,
                             num_attention_heads=4, intermediate_size=256, hidden_dropout_prob=0.0,
                             attention_probs_dropout_prob=0.0, num_labels=10, attn_implementation="sdpa")
        self.vit = T.ViTForImageClassification(config)

    def forward(self, x):
        return self.vit(pixel_values=x.view(-1, 1, 8, 8)).logits


class DigitsVitTask(DigitsTask):
    """sklearn's bundled 8x8 digits, a ViT."""

    name = "digits-vit"

    def model(self) -> nn.Module:
        return _DigitsVit()


class KarateTask:
    """Zachary's karate club (bundled with PyG, built in code), a two-layer GCN."""

    name = "karate-gcn"
    metric = "test accuracy"
    higher_is_better = True

    def __init__(self, seed: int = 0):
        from torch_geometric.datasets import KarateClub

        data = KarateClub()[0]
        self.x, self.edge_index, self.y, self.train_mask = data.x, data.edge_index, data.y, data.train_mask

    def model(self) -> nn.Module:
        from .zoo import _GraphNet

        return _GraphNet("gcn", self.x.shape[1], 64, 4, 2)

    def optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.Adam(model.parameters(), lr=1e-2, weight_decay=5e-4)

    def batch(self, step: int, generator: torch.Generator):
        return (self.x, self.edge_index), self.y

    def loss(self, output, target) -> torch.Tensor:
        return F.cross_entropy(output[self.train_mask], target[self.train_mask])

    @torch.no_grad()
    def evaluate(self, model) -> float:
        held_out = ~self.train_mask
        return (model(self.x, self.edge_index).argmax(1)[held_out] == self.y[held_out]).float().mean().item()


TASKS = {"mnist1d": Mnist1dTask, "digits": DigitsTask, "digits-vit": DigitsVitTask, "charlm": CharLMTask,
         "charlm-llama": CharLlamaTask, "charlm-bert": CharBertTask, "karate": KarateTask}


def lr_scale(step: int, steps: int, warmup: int = 50) -> float:
    """Linear warm-up then cosine decay to 10%."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return 0.1 + 0.45 * (1 + math.cos(math.pi * progress))
