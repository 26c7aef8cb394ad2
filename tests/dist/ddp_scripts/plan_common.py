"""The model, batches and rows shared by ``plan_scenario.py`` (under torchrun) and tests/plan/test_plan_ranks.py."""

from __future__ import annotations

from typing import Any

import torch

VOCAB, SEQ, BATCH = 2000, 128, 2  # BATCH: one rank's

ROWS: list[dict[str, Any]] = [
    {},
    {"precision": "bf16-mixed"},
    {"precision": "bf16-mixed", "activation_checkpointing": True},
    {"grad_accum_steps": 2},
]


def llama() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=VOCAB, hidden_size=128, intermediate_size=344, num_hidden_layers=6, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, attn_implementation="sdpa",
    )  # fmt: skip
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg)


def batches(rank: int, accum: int) -> list[dict[str, torch.Tensor]]:
    """Two optimizer steps of one rank's batches (``accum`` micro-batches of BATCH // accum samples each)."""
    g = torch.Generator().manual_seed(rank)
    ids = torch.randint(0, VOCAB, (2 * BATCH, SEQ), generator=g)
    micro = BATCH // accum
    return [{"input_ids": b, "labels": b.clone()} for b in ids.split(micro)]


def example() -> dict[str, torch.Tensor]:
    ids = torch.zeros(BATCH, SEQ, dtype=torch.long)
    return {"input_ids": ids, "labels": ids}
