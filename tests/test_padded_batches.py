"""Padded batches through transformers' GPT-2 and Llama: the saved attention mask holds
-inf or the dtype's minimum, which must come back exactly (no NaN, no 1e31 offsets).

With SDPA (transformers' default) the mask is saved for the backward; with eager
attention it is folded into the scores. Both must give finite gradients within 2e-2 of
the same compile path without gact, at 8 bits.
"""

import pytest
import torch
import torch.nn as nn

import gact_fx

from .helpers import baseline_backend, flat_grad, relative_error

pytestmark = pytest.mark.compat


class PaddedLM(nn.Module):
    """A transformers decoder with an attention mask: the loss over real tokens only."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return hidden * attention_mask[..., None]


def decoder(family: str, attention: str) -> nn.Module:
    import transformers as T

    torch.manual_seed(0)
    if family == "gpt2":
        config = T.GPT2Config(vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=64,
                              resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        model = T.GPT2Model(config)
    else:
        config = T.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
        model = T.LlamaModel(config)
    model.config._attn_implementation = attention
    return PaddedLM(model)


def padded_batch():
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 128, (4, 48), generator=generator)
    mask = torch.ones(4, 48, dtype=torch.long)
    mask[1, 40:] = 0  # right padding of different lengths
    mask[3, 30:] = 0
    return ids, mask


def gradient(model, backend):
    import copy

    model = copy.deepcopy(model)
    compiled = torch.compile(model, backend=backend)
    weights = torch.randn(4, 48, 64, generator=torch.Generator().manual_seed(1))
    (compiled(*padded_batch()) * weights).sum().backward()
    return flat_grad(model)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_padded_batches_give_finite_gradients_close_to_the_baseline(family, attention):
    model = decoder(family, attention)
    expected = gradient(model, baseline_backend())
    backend = gact_fx.backend(bits=8, min_numel=256)
    got = gradient(model, backend)
    assert torch.isfinite(expected).all()
    assert torch.isfinite(got).all(), f"{torch.isnan(got).float().mean():.0%} of the gradient is NaN"
    assert relative_error(got, expected) < 2e-2
    assert backend.report().num_compressed > 0
