"""attention=: the SDPA backend around the model's forward, Hugging Face models switched to sdpa, and backends
this device cannot run refused up front with the ones it can (issue 22)."""

from __future__ import annotations

import pytest
import torch
from setup_models import lm_batches, mlp, tiny_llama
from torch import nn

from nbtrainer import Trainer
from nbtrainer._setup._attention import attention_support


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
