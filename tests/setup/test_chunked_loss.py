"""Trainer(chunked_loss=...): a causal LM's loss with the head and cross-entropy a chunk of tokens at a time. The
loss and gradients are the model's own, training follows the plain run, the logits never exist whole (measured),
and every model or option it cannot serve is refused up front."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from conftest import needs
from setup_models import lm_batches, mlp, tiny_llama
from torch import nn

from nbtrainer import Trainer
from nbtrainer._memory._peak import track_peak
from nbtrainer._setup._chunked_loss import ChunkedCausalLMLoss

pytestmark = needs("transformers")  # found, not imported: collection stays cheap in every worker


def _masked(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    labels = batch["labels"].clone()
    labels[:, :3] = -100  # a prompt that is not counted, as in instruction tuning
    return {**batch, "labels": labels}


@pytest.mark.parametrize("chunk", [7, 1024])
def test_loss_and_gradients_are_the_models_own(chunk: int) -> None:
    batch = _masked(lm_batches(n=1, seq=16)[0])
    model = tiny_llama()
    twin = copy.deepcopy(model)
    ours = ChunkedCausalLMLoss(chunk)(model, batch)
    theirs = twin(**batch).loss
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)
    ours.backward()
    theirs.backward()
    for (name, a), b in zip(model.named_parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-7, msg=name)


def test_training_follows_the_plain_run_and_evaluation_is_the_models() -> None:
    data = [_masked(b) for b in lm_batches(n=4)]
    runs = []
    for chunked in (False, 5):
        trainer = Trainer(tiny_llama(), None, "adamw", lr=1e-3, chunked_loss=chunked, progress=False, seed=0)
        history = trainer.fit(data, data[:2], epochs=2)
        runs.append((trainer, history))
    (plain, hp), (chunked_run, hc) = runs
    a, b = plain.model.state_dict(), chunked_run.model.state_dict()
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=1e-6, msg=k)
    assert hc.epochs[-1]["val_loss"] == pytest.approx(hp.epochs[-1]["val_loss"], rel=1e-5)
    assert hc.epochs[-1]["loss"] < hc.epochs[0]["loss"]
    logits = chunked_run.predict(data[:1])["logits"]  # predict calls the model: logits as usual
    assert logits.shape == (4, 16, 128)


def test_the_full_logits_never_exist_together() -> None:
    """Vocabulary 4,000 and 256 tokens: the plain loss holds the fp32 logits, the softmax and their gradients
    (4 MB each); in chunks of 32 tokens only 1/8 of that exists at a time."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=4000,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    ids = torch.randint(0, 4000, (4, 64))
    batch = {"input_ids": ids, "labels": ids}
    peaks = {}
    for chunked in (False, True):
        model = LlamaForCausalLM(config)
        with track_peak(model, inputs=batch) as peak:
            loss = ChunkedCausalLMLoss(32)(model, batch) if chunked else model(**batch).loss
            loss.backward()
        peaks[chunked] = peak.peak_bytes
    logits = 4 * 64 * 4000 * 4
    # the plain step holds at least the logits and their gradient at once; the chunked one an eighth of them
    assert peaks[False] - peaks[True] >= 2 * logits * (1 - 32 / (4 * 63)), (peaks, logits)


def test_with_lora_only_the_adapters_train() -> None:
    pytest.importorskip("peft")
    data = lm_batches(n=2)
    trainer = Trainer(tiny_llama(), None, "adamw", lr=1e-3, lora={"r": 4}, chunked_loss=8, progress=False, seed=0)
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    trainer.fit(data, epochs=1)
    changed = [k for k, v in trainer.model.state_dict().items() if not torch.equal(before[k], v)]
    assert changed and all("lora_" in k for k in changed)


@pytest.mark.parametrize(
    ("build", "options", "match"),
    [
        (mlp, {}, r"MLP is not a Hugging Face causal LM"),
        (tiny_llama, {"criterion": nn.CrossEntropyLoss()}, r"a criterion= or compute_loss= reads the full logits"),
        (tiny_llama, {"metrics": {"acc": lambda o, y: o.logits.mean()}}, r"training metrics read the logits"),
        (tiny_llama, {"compute_loss": lambda m, b: m(**b).loss}, r"criterion= or compute_loss="),
    ],
)
def test_what_it_cannot_serve_is_refused_up_front(build: Any, options: dict[str, Any], match: str) -> None:
    criterion = options.pop("criterion", None)
    with pytest.raises(ValueError, match=r"chunked_loss: .*" + match):
        Trainer(build(), criterion, "adamw", chunked_loss=True, progress=False, **options)


def test_a_model_that_transforms_its_logits_is_refused() -> None:
    model = tiny_llama()
    model.config.final_logit_softcapping = 30.0  # Gemma 2 caps its logits after the head
    with pytest.raises(ValueError, match=r"transforms its logits after the head \(final_logit_softcapping=30.0\)"):
        Trainer(model, None, "adamw", chunked_loss=True, progress=False)
    with pytest.raises(TypeError, match=r"chunked_loss= takes True, False or the tokens per chunk"):
        bad: Any = 0
        Trainer(tiny_llama(), None, "adamw", chunked_loss=bad, progress=False)


def test_batches_without_labels_get_the_reason_at_the_first_step() -> None:
    data = [{"input_ids": b["input_ids"]} for b in lm_batches(n=2)]
    trainer = Trainer(tiny_llama(), None, "adamw", chunked_loss=True, progress=False)
    with pytest.raises(ValueError, match=r"chunked_loss needs dict batches with 'labels'"):
        trainer.fit(data, epochs=1)
    assert trainer.global_step == 0
