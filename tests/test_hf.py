"""Hugging Face integration against the transformers / PEFT in the test extras: tiny random-init models built
from configs (nothing is downloaded), dict / BatchEncoding batches, dynamic padding, LoRA.

Skipped (not failed) when transformers or peft is missing.
"""

from __future__ import annotations

import copy
import os
import warnings

import pytest
import torch
from conftest import LazyModule, needs
from torch import nn

from nbtrainer import ModelCheckpoint, Trainer

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers is imported: never reach the Hub
pytestmark = needs("transformers")
transformers = LazyModule("transformers")  # imported by the first test that uses it, not at collection

VOCAB, PAD = 100, 0


@pytest.fixture(autouse=True)
def _quiet_transformers():
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    yield
    transformers.logging.set_verbosity(verbosity)


def _bert(seed=0):
    torch.manual_seed(seed)
    cfg = transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        num_labels=2,
    )
    return transformers.BertForSequenceClassification(cfg)


def _gpt2(seed=0):
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=2)
    return transformers.GPT2LMHeadModel(cfg)


def _sequences(n=32, seed=0):
    """Token sequences of varying length (4..15); label 1 when the first token is in the upper half."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        length = int(torch.randint(4, 16, (1,), generator=g))
        start = int(torch.randint(1, VOCAB, (1,), generator=g))
        ids = (start + torch.arange(length)) % (VOCAB - 1) + 1  # counting tokens: learnable, never PAD
        out.append((ids, int(start > VOCAB // 2)))
    return out


def _collate_classification(samples):
    """Dynamic padding to the longest sequence of the batch, as a BatchEncoding (a Mapping, not a dict)."""
    length = max(len(ids) for ids, _ in samples)
    ids = torch.full((len(samples), length), PAD)
    mask = torch.zeros(len(samples), length, dtype=torch.long)
    for i, (s, _) in enumerate(samples):
        ids[i, : len(s)], mask[i, : len(s)] = s, 1
    labels = torch.tensor([label for _, label in samples])
    return transformers.BatchEncoding({"input_ids": ids, "attention_mask": mask, "labels": labels})


def _collate_lm(samples):
    enc = _collate_classification(samples)
    return {
        "input_ids": enc["input_ids"],
        "attention_mask": enc["attention_mask"],
        "labels": enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100),
    }


def _loader(collate, n=32, batch_size=8):
    return torch.utils.data.DataLoader(_sequences(n), batch_size=batch_size, collate_fn=collate)


def _acc(out, y):
    return (out.logits.argmax(-1) == y).float().mean()


def _manual_val_loss(model, loader):
    """Sample-weighted mean of the model's own per-batch loss, in eval mode."""
    model.eval()
    total = count = 0.0
    with torch.no_grad():
        for batch in loader:
            n = batch["input_ids"].shape[0]
            total += model(**batch).loss.item() * n
            count += n
    model.train()
    return total / count


# -- BERT: dict batches, model loss or a criterion ------------------------------------------------------------------
def test_bert_batchencoding_batches_with_model_loss_and_with_a_criterion_train_identically():
    loader = _loader(_collate_classification)
    assert isinstance(next(iter(loader)), transformers.BatchEncoding)

    def run(criterion):
        model = _bert()
        trainer = Trainer(model, criterion, "adamw", lr=3e-3, seed=0, metrics={"acc": _acc}, progress=False)
        return model, trainer, trainer.fit(loader, loader, epochs=4)

    model, trainer, h = run(None)  # the model computes its loss from 'labels'
    assert h["loss"][-1] < h["loss"][0]
    assert trainer.evaluate(loader)["val_loss"] == pytest.approx(_manual_val_loss(model, loader), rel=1e-5)
    # a criterion on the output object: 'labels' is withheld from the model and given to the criterion
    _, _, h2 = run(lambda out, y: nn.functional.cross_entropy(out.logits, y))
    assert h2["loss"] == pytest.approx(h["loss"], rel=1e-5)
    assert h2["val_acc"] == h["val_acc"]

    preds = trainer.predict(loader)
    assert isinstance(preds, transformers.modeling_outputs.SequenceClassifierOutput)
    assert list(preds.keys()) == ["logits"] and preds.logits.shape == (32, 2)  # no per-batch 'loss'


# -- metrics on model outputs: .logits for metrics written for tensors ---------------------------------------------
def _direct_accuracy(model, loader):
    model.eval()
    hits = count = 0
    with torch.no_grad():
        for batch in loader:
            inputs = {k: v for k, v in batch.items() if k != "labels"}
            hits += int((model(**inputs).logits.argmax(-1) == batch["labels"]).sum())
            count += len(batch["labels"])
    model.train()
    return hits / count


def test_metrics_take_the_logits_of_a_model_output():
    """criterion=None: a SequenceClassifierOutput (with its loss) reaches a metric written for tensors and a
    torchmetrics metric as its .logits, and a metric written for the output object whole."""
    import torchmetrics
    from conftest import accuracy

    loader = _loader(_collate_classification)
    model = _bert()
    metrics = {"acc": accuracy, "tm": torchmetrics.Accuracy(task="multiclass", num_classes=2), "own": _acc}
    trainer = Trainer(model, None, "adamw", lr=3e-3, seed=0, metrics=metrics, progress=False)
    h = trainer.fit(loader, loader, epochs=2)
    assert h["acc"] == pytest.approx(h["own"], abs=1e-6)
    logs = trainer.evaluate(loader)
    direct = _direct_accuracy(model, loader)
    for key in ("val_acc", "val_tm", "val_own"):
        assert logs[key] == pytest.approx(direct, abs=1e-6), key
    assert h["val_acc"][-1] == pytest.approx(direct, abs=1e-6)


def test_compare_strategies_on_a_hugging_face_model_reports_val_acc():
    """compare_strategies(criterion=None) with the default metric="val_acc": its argmax accuracy takes .logits,
    so no row fails."""
    import functools

    from nbtrainer import compare_strategies

    loader = _loader(_collate_classification, n=16)
    table = compare_strategies(
        _bert, functools.partial(torch.optim.AdamW, lr=1e-3), None, loader, loader, ["fp32", "accum2"], steps=2
    )
    assert [r["status"] for r in table.rows] == ["ok", "ok"], [r["reason"] for r in table.rows]
    assert all(0.0 <= r["metric"] <= 1.0 for r in table.rows)


# -- GPT-2: dynamic padding, fit / evaluate / predict ----------------------------------------------------------------
def test_gpt2_dynamic_padding_fit_evaluate_predict():
    loader = _loader(_collate_lm)
    lengths = [b["input_ids"].shape[1] for b in loader]
    assert len(set(lengths)) > 1  # the batches really are ragged
    model = _gpt2()
    trainer = Trainer(model, None, "adamw", lr=3e-3, seed=0, progress=False)
    h = trainer.fit(loader, epochs=3)
    assert h["loss"][-1] < 0.9 * h["loss"][0]
    assert trainer.evaluate(loader)["val_loss"] == pytest.approx(_manual_val_loss(model, loader), rel=1e-5)

    out = trainer.predict(loader)
    assert out.logits.shape == (32, max(lengths), VOCAB) and out.logits.dtype == torch.float32
    assert "past_key_values" not in out and "loss" not in out  # the caches of every batch are not kept
    per = trainer.predict(loader, per_batch=True)
    row = 0
    for batch, chunk in zip(loader, per, strict=True):
        n, length = batch["input_ids"].shape
        assert torch.equal(out.logits[row : row + n, :length], chunk.logits)
        assert (out.logits[row : row + n, length:] == -100).all()
        row += n
    kept = trainer.predict(loader, keep=("past_key_values", "loss"), per_batch=True)
    assert all(k.past_key_values is not None and k.loss is not None for k in kept)


class _CacheUnderOtherNames(nn.Module):
    """A user's model around GPT-2 that asks for the cache itself (an explicit use_cache=True wins over the
    config) and returns it under its own names: the Cache object, the per-layer (key, value) tuples of
    transformers 4, and an entry its config lists in keys_to_ignore_at_inference."""

    def __init__(self, as_tuple=False):
        super().__init__()
        self.lm = _gpt2()
        self.lm.config.keys_to_ignore_at_inference = ["memory"]
        self.as_tuple = as_tuple

    def forward(self, input_ids, attention_mask=None, labels=None):  # labels: predict-only, never used
        out = self.lm(input_ids=input_ids, attention_mask=attention_mask, use_cache=True)
        state = out["cache"]  # transformers 5's name (4.x: past_key_values)
        layers = tuple((layer.keys, layer.values) for layer in state.layers)
        if self.as_tuple:
            return out.logits, state, layers
        return {"logits": out.logits, "state": state, "present": layers, "memory": out.logits.mean(-1)}


def test_caches_under_other_names_are_left_out_and_kept_on_request():
    loader = _loader(_collate_classification, n=12, batch_size=4)
    trainer = Trainer(_CacheUnderOtherNames(), None, progress=False)
    out = trainer.predict(loader)
    assert set(out) == {"logits"} and out["logits"].shape[0] == 12
    kept = trainer.predict(loader, keep="cache", per_batch=True)
    assert all(set(k) == {"logits", "state", "present", "memory"} for k in kept)
    assert all(isinstance(k["state"], transformers.Cache) and len(k["present"]) == 2 for k in kept)
    whole = trainer.predict(loader, keep="past_key_values")  # the same group under its transformers 4 name
    assert whole["memory"].shape[0] == 12 and whole["present"][0][0].shape[0] == 12  # batch-sized: concatenated
    assert isinstance(whole["state"], list) and len(whole["state"]) == 3  # one Cache per batch
    # a tuple output keeps its positions: the Cache object becomes None; unnamed (k, v) pairs of 4-d tensors
    # may be a ConvLSTM's state, so only named entries are judged by their shape
    logits, state, layers = Trainer(_CacheUnderOtherNames(as_tuple=True), None, progress=False).predict(loader)
    assert logits.shape[0] == 12 and state is None and layers[0][0].shape[0] == 12


def test_evaluate_and_predict_build_no_cache():
    """use_cache=False while evaluating and predicting: no per-batch cache is built only to be dropped."""
    model = _gpt2()
    built = []
    model.register_forward_hook(lambda module, args, output: built.append(output.get("cache") is not None))
    loader = _loader(_collate_lm, n=8, batch_size=4)
    trainer = Trainer(model, None, metrics={"acc": lambda out, y: (out.logits.argmax(-1) == y).float().mean()})
    trainer.evaluate(loader)
    trainer.predict(loader)
    assert built == [False] * 4
    assert model.config.use_cache is True  # put back
    kept = trainer.predict(loader, keep="cache", per_batch=True)
    assert built[4:] == [True, True] and all(isinstance(k["cache"], transformers.Cache) for k in kept)


def test_fit_builds_no_cache():
    """Training never reads a key/value cache: GPT-2's forward under fit (and its validation) builds none."""
    model = _gpt2()
    built = []
    model.register_forward_hook(lambda module, args, output: built.append(output.get("cache") is not None))
    loader = _loader(_collate_lm, n=8, batch_size=4)
    Trainer(model, None, torch.optim.SGD(model.parameters(), lr=1e-3), progress=False).fit(loader, loader, epochs=1)
    assert built and not any(built)
    assert model.config.use_cache is True  # put back


def test_gpt2_predict_under_bf16_mixed_is_float32_numpy_ready():
    from nbtrainer import precision_support

    if not precision_support("cpu")["bf16-mixed"][0]:
        pytest.skip("no bf16 autocast on this CPU")
    trainer = Trainer(_gpt2(), None, precision="bf16-mixed", device="cpu", progress=False)
    out = trainer.predict(_loader(_collate_lm, n=8))
    assert out.logits.dtype == torch.float32
    out.logits.numpy()
    kept = trainer.predict(_loader(_collate_lm, n=8), keep_dtype=True)
    assert kept.logits.dtype == torch.bfloat16


# -- no warnings from our calls --------------------------------------------------------------------------------------
def test_activation_checkpointing_and_the_verbs_raise_no_deprecation_warnings():
    model = _bert()
    loader = _loader(_collate_classification, n=16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plain = Trainer(model, None, "adamw", lr=1e-3, progress=False)  # never turned on
        plain.fit(loader, epochs=1)
        trainer = Trainer(model, None, "adamw", lr=1e-3, activation_checkpointing=True, progress=False)
        on = model.is_activation_checkpointing if hasattr(model, "activation_checkpointing_enable") else None
        trainer.fit(loader, epochs=1)
        trainer.evaluate(loader)
        trainer.predict(loader)
        trainer.set_activation_checkpointing(False)
    deprecations = [
        f"{w.category.__name__}: {w.message}"
        for w in caught
        if issubclass(w.category, (FutureWarning, DeprecationWarning))
    ]
    assert not deprecations, deprecations
    assert trainer.checkpointed_blocks == []
    if on is not None:  # transformers >= 5 has the new name; the switch really was on
        assert on and not model.is_activation_checkpointing


# -- LoRA via PEFT: train, checkpoint, resume, evaluate an inference-mode adapter -----------------------------------
def _lora(base):
    peft = pytest.importorskip("peft")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # peft's own call of is_gradient_checkpointing
        return peft.get_peft_model(
            base, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["query", "value"], task_type="SEQ_CLS")
        )


def test_lora_train_checkpoint_resume_and_evaluate_only(tmp_path):
    peft = pytest.importorskip("peft")
    loader = _loader(_collate_classification)
    base_state = copy.deepcopy(_bert().state_dict())

    def trainer_for(callbacks=(), seed=0):
        base = _bert()
        base.load_state_dict(base_state)
        model = _lora(base)
        return Trainer(
            model,
            None,
            "adamw",
            lr=3e-3,
            seed=seed,
            deterministic=True,
            callbacks=list(callbacks),
            metrics={"acc": _acc},
            progress=False,
        )

    straight = trainer_for()
    h = straight.fit(loader, epochs=2)
    assert 0 < straight.param_counts.trainable < straight.param_counts.total
    stopped = trainer_for()
    stopped.fit(loader, epochs=2, max_steps=3)  # stops mid-epoch 1
    path = stopped.save_checkpoint(str(tmp_path / "mid.ckpt"))
    resumed = trainer_for(seed=7)
    h2 = resumed.fit(loader, epochs=2, resume_from=path)
    trained = {n: p for n, p in straight.model.named_parameters() if p.requires_grad}
    again = {n: p for n, p in resumed.model.named_parameters() if p.requires_grad}
    assert trained.keys() == again.keys() and all(torch.equal(trained[n], again[n]) for n in trained)
    assert h2["loss"] == h["loss"]

    # the adapter saved and loaded for inference (every parameter frozen): evaluation needs no optimizer
    straight.model.save_pretrained(str(tmp_path / "adapter"))
    base = _bert(seed=1)
    base.load_state_dict(base_state)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        inference = peft.PeftModel.from_pretrained(base, str(tmp_path / "adapter"))
    assert not any(p.requires_grad for p in inference.parameters())
    with pytest.raises(ValueError, match="optimizer=None"):
        Trainer(inference, None, "adamw", progress=False)
    evaluator = Trainer(inference, None, metrics={"acc": _acc}, progress=False)
    assert evaluator.evaluate(loader) == pytest.approx(straight.evaluate(loader), rel=1e-6)
    assert torch.allclose(evaluator.predict(loader).logits, straight.predict(loader).logits, atol=1e-6)
    with pytest.raises(ValueError, match="fit needs an optimizer"):
        evaluator.fit(loader)


def test_label_key_without_criterion_explains_labels():
    batches = [dict(b) for b in _loader(_collate_classification, n=8)]
    for b in batches:
        b["label"] = b.pop("labels")
    trainer = Trainer(_bert(), None, "adamw", progress=False)
    with pytest.raises(
        ValueError, match=r"took the batch key 'label' as the targets.*rename_column\('label', 'labels'\)"
    ):
        trainer.fit(batches)


def test_checkpoint_callback_with_a_peft_model_writes_loadable_files(tmp_path):
    """ModelCheckpoint over a LoRA model: files load with weights_only=True and hold only tensors/plain data."""
    pytest.importorskip("peft")
    model = _lora(_bert())
    trainer = Trainer(
        model, None, "adamw", lr=1e-3, callbacks=[ModelCheckpoint(tmp_path, save_last=True)], progress=False
    )
    trainer.fit(_loader(_collate_classification, n=16), epochs=1)
    ckpt = torch.load(tmp_path / "last.ckpt", weights_only=True)
    assert any("lora_A" in k for k in ckpt["model"])
