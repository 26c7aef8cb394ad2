"""Shared tiny models and data for the memory-saver tests: a Llama decoder built from a config (hidden 64,
2 layers) and a plain ``nn.Module`` MLP, both seeded."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

VOCAB = 128


def tiny_llama(seed: int = 0, attn: str = "sdpa") -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        attn_implementation=attn,
    )
    return LlamaForCausalLM(config)


def lm_batches(n: int = 4, size: int = 4, seq: int = 16, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """Causal-LM batches with a learnable pattern (each sequence counts up from a random start)."""
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, VOCAB, (n * size, 1), generator=g)
    ids = (start + torch.arange(seq)) % VOCAB
    return [{"input_ids": ids[i : i + size], "labels": ids[i : i + size]} for i in range(0, n * size, size)]


class MLP(nn.Module):
    """A plain module (no Hugging Face): two hidden Linear layers and a head."""

    def __init__(self, d: int = 32, hidden: int = 64, out: int = 4) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.head = nn.Linear(hidden, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


def mlp(seed: int = 0) -> MLP:
    torch.manual_seed(seed)
    return MLP()


def mlp_data(n: int = 128, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 32, generator=g)
    y = (x[:, :4] * 3).argmax(dim=1)
    return x, y
