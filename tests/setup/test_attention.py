"""attention=: the SDPA backend around the model's forward, Hugging Face models switched to sdpa, and backends
this device cannot run refused up front with the ones it can (issue 22)."""

from __future__ import annotations

import pytest
import torch
from setup_models import lm_batches, mlp, tiny_llama
from torch import nn

from nbtrainer import Trainer
from nbtrainer._setup._attention import _probe, attention_support


def test_the_backend_is_in_force_during_the_forward_only() -> None:
    model = tiny_llama()
    seen = []
    model.model.layers[0].register_forward_hook(
        lambda *_: seen.append((torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.math_sdp_enabled()))
    )
    Trainer(model, None, "adamw", attention="math", progress=False)
    model(**lm_batches(n=1)[0])
    assert seen == [(False, True)]  # flash off, math on inside the forward
    assert torch.backends.cuda.flash_sdp_enabled()  # and restored afterwards


def test_an_eager_hugging_face_model_is_switched_to_sdpa_with_the_same_logits() -> None:
    batch = lm_batches(n=1)[0]
    eager = tiny_llama(attn="eager")
    expected = eager(**batch).logits
    model = tiny_llama(attn="eager")
    trainer = Trainer(model, None, "adamw", attention="flash", progress=False)
    assert model.config._attn_implementation == "sdpa"
    assert trainer.model_setup.describe()["attention"] == "flash"
    assert (model(**batch).logits - expected).abs().max() < 1e-5


def test_a_backend_this_device_cannot_run_is_refused_with_the_alternatives() -> None:
    support = attention_support("cpu", torch.float32)
    assert support["math"] == (True, "") and support["auto"] == (True, "")
    assert not support["efficient"][0]  # no memory-efficient kernel on a CPU
    model = tiny_llama(attn="eager")
    with pytest.raises(ValueError, match=r"attention='efficient' cannot run on cpu in float32.*'math'"):
        Trainer(model, None, "adamw", attention="efficient", progress=False)
    assert model.config._attn_implementation == "eager"  # refused before anything changed
    with pytest.raises(ValueError, match=r"attention='flash2' is not an SDPA backend: use one of"):
        Trainer(mlp(), nn.CrossEntropyLoss(), "adamw", attention="flash2", progress=False)


def test_a_training_run_under_a_named_backend() -> None:
    trainer = Trainer(tiny_llama(), None, "adamw", lr=1e-2, attention="flash", progress=False, seed=0)
    history = trainer.fit(lm_batches(), epochs=2)
    assert history.epochs[-1]["loss"] < history.epochs[0]["loss"]


class Encoder(nn.Module):
    """A real ``nn.TransformerEncoderLayer`` (its ``dropout`` also sets the attention's) and a classifier head."""

    def __init__(self, dropout: float) -> None:
        super().__init__()
        self.enc = nn.TransformerEncoderLayer(d_model=32, nhead=4, batch_first=True, dropout=dropout)
        self.head = nn.Linear(32, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.enc(x).mean(1))


def encoder_batches(n: int = 4) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(8, 6, 32, generator=g), torch.randint(0, 2, (8,), generator=g)) for _ in range(n)]


def tiny_bert(attention_dropout: float) -> nn.Module:
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=50,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=32,
        attention_probs_dropout_prob=attention_dropout,
        attn_implementation="sdpa",
    )
    return BertForSequenceClassification(config)


def bert_batches(n: int = 3) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        {"input_ids": torch.randint(0, 50, (4, 12), generator=g), "labels": torch.randint(0, 2, (4,), generator=g)}
        for _ in range(n)
    ]


def flash_without_dropout_here() -> bool:
    """This device's flash kernel cannot run attention dropout (torch's CPU one), which is what these tests refuse."""
    return attention_support("cpu")["flash"][0] and bool(_probe("cpu", "flash", torch.float32, True))


@pytest.mark.skipif(not flash_without_dropout_here(), reason="this torch's CPU flash kernel runs attention dropout")
def test_flash_with_attention_dropout_it_cannot_run_is_refused_up_front_naming_the_module_and_the_fix() -> None:
    """Before: the probe ran without dropout, so the Trainer was built, and the first batch failed with "No available
    kernel" in an error that blamed the loader's batches."""
    with pytest.raises(ValueError) as refused:
        Trainer(Encoder(dropout=0.1), nn.CrossEntropyLoss(), "adamw", attention="flash", progress=False)
    text = str(refused.value)
    assert "attention='flash' cannot run attention dropout on cpu" in text
    assert "enc.self_attn (nn.MultiheadAttention) dropout=0.1" in text
    assert "model.enc.self_attn.dropout = 0.0" in text and "attention='math'" in text and "attention='auto'" in text

    model = tiny_bert(attention_dropout=0.1)  # BERT runs its attention through SDPA
    with pytest.raises(ValueError, match=r"attention_probs_dropout_prob=0\.1.*attention_probs_dropout_prob=0\.0"):
        Trainer(model, None, "adamw", attention="flash", progress=False)


@pytest.mark.parametrize("build", ["encoder", "bert"])
def test_without_attention_dropout_flash_trains_and_with_it_math_does(build: str) -> None:
    """The fixes the refusal names work: the attention dropout at 0 under flash, or the math backend with it."""
    make, batches, criterion = (
        (Encoder, encoder_batches(), nn.CrossEntropyLoss()) if build == "encoder" else (tiny_bert, bert_batches(), None)
    )
    for dropout, attention in ((0.0, "flash"), (0.1, "math")):
        trainer = Trainer(make(dropout), criterion, "adamw", lr=1e-3, attention=attention, progress=False, seed=0)
        history = trainer.fit(batches, epochs=1)
        assert history.epochs[-1]["loss"] > 0 and trainer.global_step == len(batches)
