"""Model factories for ``gact-fx viz`` (each returns ``(model, example_inputs)``).

    gact-fx viz examples/viz_models.py:transformer_block --out block.html --option bits=2
    gact-fx viz examples/viz_models.py:bert_12_layers --out bert.html --option level=L2.2
"""

import torch

from gact_fx.bench.tasks import Block, CharGPT


def transformer_block():
    torch.manual_seed(0)
    return Block(dim=64, heads=4), (torch.randn(8, 32, 64),)


def char_gpt():
    torch.manual_seed(0)
    return CharGPT(layers=2), (torch.randint(0, 256, (8, 128)),)


def bert_12_layers():
    """A 12-layer BERT (small hidden size): thousands of nodes, to try the viewer at scale."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(vocab_size=512, hidden_size=128, num_hidden_layers=12, num_attention_heads=4,
                        intermediate_size=512, max_position_embeddings=128)
    model = BertModel(config)

    class LastHidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, ids):
            return self.model(input_ids=ids).last_hidden_state

    return LastHidden(), (torch.randint(0, 512, (4, 64)),)
