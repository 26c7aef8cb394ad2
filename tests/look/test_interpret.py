"""interpret(): each item's loss equals the criterion on that item alone; matrices and per-class figures equal
scikit-learn's; dataset indices survive a shuffled loader; the pass leaves the model and the RNG as they were; what
cannot be split per item or fetched back is said clearly."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
import torch
from conftest import LazyModule, make_classification, make_loader, mlp, needs

from nbtrainer import Interpretation, Trainer
from nbtrainer._look._per_item import NoPerItemLoss

skm = LazyModule("sklearn.metrics")  # imported at first use: collection stays cheap in every worker

F = torch.nn.functional


def _trainer(model: torch.nn.Module, criterion: Any, **kw: Any) -> Trainer:
    return Trainer(model, criterion, progress=False, run_store=False, **kw)


def _numpy_keys() -> Any:
    state: Any = np.random.get_state()
    return state[1]


def _alone(criterion: Any, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The criterion applied to each item alone (what a per-item loss must equal)."""
    return torch.stack([criterion(outputs[i : i + 1], targets[i : i + 1]) for i in range(len(targets))])


class Seq(torch.nn.Module):
    """(B, T) token ids -> (B, C, T) logits: a per-token classifier, for CrossEntropyLoss over a sequence."""

    def __init__(self, vocab: int = 12, classes: int = 4) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.out = torch.nn.Embedding(vocab, 8), torch.nn.Linear(8, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.emb(x)).transpose(1, 2)


def _cases() -> list[tuple[str, torch.nn.Module, Any, torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 10, generator=g)
    labels = torch.randint(0, 3, (40,), generator=g)
    multi = (torch.rand(40, 3, generator=g) > 0.5).float()
    tokens = torch.randint(0, 12, (40, 6), generator=g)
    tags = torch.randint(0, 4, (40, 6), generator=g)
    tags[:, -2:] = -100  # padding, ignored
    tags[3] = -100  # an item with every token ignored gives nan alone; keep it finite: one counted token
    tags[3, 0] = 1
    weight = torch.tensor([0.2, 1.0, 3.0])
    return [
        ("cross-entropy", mlp(), torch.nn.CrossEntropyLoss(), x, labels),
        ("weighted, smoothed", mlp(), torch.nn.CrossEntropyLoss(weight=weight, label_smoothing=0.1), x, labels),
        ("nll", torch.nn.Sequential(mlp(), torch.nn.LogSoftmax(-1)), torch.nn.NLLLoss(weight=weight), x, labels),
        ("mse", mlp(out=2), torch.nn.MSELoss(), x, torch.randn(40, 2, generator=g)),
        ("l1 sum", mlp(out=1), torch.nn.L1Loss(reduction="sum"), x, torch.randn(40, 1, generator=g)),
        ("multi-label", mlp(), torch.nn.BCEWithLogitsLoss(pos_weight=torch.tensor([1.0, 2.0, 0.5])), x, multi),
        ("sequence", Seq(), torch.nn.CrossEntropyLoss(ignore_index=-100), tokens, tags),
    ]


@pytest.mark.parametrize("case", range(7), ids=[c[0] for c in _cases()])
def test_each_items_loss_is_the_criterion_on_that_item_alone(case: int) -> None:
    _, model, criterion, x, y = _cases()[case]
    interp = _trainer(model, criterion).interpret((x, y), batch_size=16)
    with torch.no_grad():
        expected = _alone(criterion, model(x), y)
    assert interp.indices.tolist() == list(range(40))
    torch.testing.assert_close(interp.losses, expected.float(), rtol=1e-5, atol=1e-6)


def test_a_classifier_matches_scikit_learn() -> None:
    x, y = make_classification(n=300, classes=4)
    model = mlp(out=4)
    interp = _trainer(model, torch.nn.CrossEntropyLoss()).interpret(make_loader(x, y, batch_size=64, shuffle=True))
    with torch.no_grad():
        logits = model(x)
    pred = logits.argmax(1)
    assert interp.task == "classification" and interp.predictions is not None
    assert torch.equal(interp.predictions, pred)
    assert np.array_equal(interp.confusion_matrix().numpy(), skm.confusion_matrix(y, pred, labels=range(4)))
    p, r, f, s = skm.precision_recall_fscore_support(y, pred, labels=range(4), zero_division=0)
    rows = interp.per_class()
    for c in range(4):
        assert rows[c]["class"] == c and rows[c]["support"] == s[c]
        assert rows[c]["precision"] == pytest.approx(p[c]) and rows[c]["recall"] == pytest.approx(r[c])
        assert rows[c]["f1"] == pytest.approx(f[c])
    top = interp.top_losses(5)
    assert [row["loss"] for row in top] == sorted(interp.losses.tolist(), reverse=True)[:5]
    first = top[0]
    assert first["target"] == int(y[first["index"]]) and first["prediction"] == int(pred[first["index"]])
    assert first["probability"] == pytest.approx(float(logits.softmax(1)[first["index"], y[first["index"]]]))
    assert interp.top_losses(3, largest=False)[0]["loss"] == float(interp.losses.min())
    confused = interp.most_confused(3)
    matrix = interp.confusion_matrix()
    assert confused[0][2] == max(int(matrix[i, j]) for i in range(4) for j in range(4) if i != j)
    a, b, n = confused[0]
    cell = interp.where(target=a, prediction=b)
    assert len(cell) == n and all(int(y[i]) == a and int(pred[i]) == b for i in cell)
    assert [float(interp.losses[i]) for i in cell] == sorted((float(interp.losses[i]) for i in cell), reverse=True)
    html = interp._repr_html_()
    assert "nbt-confusion" in html and "per class" in html and "top losses" in html


def test_ignored_labels_get_no_loss_and_stay_out_of_the_class_figures() -> None:
    """-100 is CrossEntropyLoss's ignore_index: a fit accepts it, so interpret() must too."""
    x, y = make_classification(n=120, classes=3)
    y[::10] = -100
    model = mlp(out=3)
    trainer = _trainer(model, torch.nn.CrossEntropyLoss(), optimizer="adamw")
    trainer.fit((x, y), batch_size=30, epochs=1)
    interp = trainer.interpret((x, y), batch_size=30)
    ignored = y == -100
    assert interp.losses[ignored].isnan().all() and interp.losses[~ignored].isfinite().all()
    with torch.no_grad():
        pred = model(x).argmax(1)
    kept = skm.confusion_matrix(y[~ignored], pred[~ignored], labels=range(3))
    assert np.array_equal(interp.confusion_matrix().numpy(), kept)
    assert sum(row["support"] for row in interp.per_class()) == int((~ignored).sum())
    accuracy = float((pred[~ignored] == y[~ignored]).float().mean())
    assert f"accuracy {accuracy:.3f}" in interp.summary()
    assert all(row["index"] % 10 for row in interp.top_losses(5))
    assert "per class" in interp._repr_html_()


def test_multi_label_gets_a_two_by_two_matrix_per_label() -> None:
    _, model, criterion, x, y = _cases()[5]
    interp = _trainer(model, criterion).interpret((x, y), batch_size=16)
    with torch.no_grad():
        pred = (torch.sigmoid(model(x)) > 0.5).int()
    assert interp.task == "multilabel"
    assert np.array_equal(interp.confusion_matrix().numpy(), skm.multilabel_confusion_matrix(y.int(), pred))
    assert {kind for _, kind, _ in interp.most_confused(6)} <= {"missed", "false alarm"}
    assert [r["support"] for r in interp.per_class()] == y.sum(0).int().tolist()


def test_a_regression_gets_residuals() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(50, 10, generator=g)
    y = torch.randn(50, 1, generator=g)
    model = mlp(out=1)
    interp = _trainer(model, torch.nn.MSELoss()).interpret((x, y), batch_size=16)
    with torch.no_grad():
        residual = (model(x) - y)[:, 0]
    top = interp.top_losses(3)
    assert interp.task == "regression"
    assert [r["index"] for r in top] == residual.abs().argsort(descending=True)[:3].tolist()
    assert top[0]["residual"] == pytest.approx(float(residual[top[0]["index"]]))
    with pytest.raises(ValueError, match=r"confusion_matrix\(\) is for classifiers; .* 'regression'"):
        interp.confusion_matrix()


def test_a_shuffled_loader_keeps_dataset_indices_and_the_rng_and_the_model_untouched() -> None:
    x, y = make_classification(n=100)
    model = mlp()
    model.train()
    shuffled = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16, shuffle=True)
    rng = (torch.get_rng_state(), random.getstate(), _numpy_keys().copy())
    for fast_fetch in (True, False):  # the batched fetch, and a loader built on the drawn index lists
        trainer = _trainer(model, torch.nn.CrossEntropyLoss(), fast_fetch=fast_fetch)
        interp = trainer.interpret(shuffled)
        assert interp.indices.tolist() == list(range(100))
        with torch.no_grad():
            expected = F.cross_entropy(model(x), y, reduction="none")
        torch.testing.assert_close(interp.losses, expected)
    assert torch.equal(rng[0], torch.get_rng_state()) and rng[1] == random.getstate()
    assert np.array_equal(rng[2], _numpy_keys())
    assert model.training
    part = _trainer(model, torch.nn.CrossEntropyLoss()).interpret(shuffled, max_items=20)
    assert len(part.losses) == 20 and len(set(part.indices.tolist())) == 20


def test_a_fit_that_interprets_after_each_validation_equals_one_that_does_not() -> None:
    """What the panel's errors section does (interpret at on_validation_end, on the training thread)."""

    class Interpret:
        def __init__(self, loader: Any) -> None:
            self.loader = loader
            self.results: list[Interpretation] = []

        def on_validation_end(self, trainer: Any, logs: Any) -> None:
            self.results.append(trainer.interpret(self.loader))

    runs = []
    for with_interpret in (False, True):
        x, y = make_classification(n=160)
        train = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16, shuffle=True)
        val = make_loader(x[:64], y[:64], batch_size=16)
        model = torch.nn.Sequential(mlp(), torch.nn.Dropout(0.2))
        callback = Interpret(val)
        trainer = _trainer(model, torch.nn.CrossEntropyLoss(), optimizer="adamw", seed=0,
                           callbacks=[callback] if with_interpret else [])  # fmt: skip
        history = trainer.fit(train, val, epochs=2)
        runs.append((history.steps["loss"], [p.detach().clone() for p in model.parameters()], callback.results))
    assert runs[0][0] == runs[1][0]
    assert all(torch.equal(a, b) for a, b in zip(runs[0][1], runs[1][1], strict=True))
    assert len(runs[1][2]) == 2 and isinstance(runs[1][2][-1], Interpretation)


def test_interpreting_a_loader_with_its_own_generator_leaves_the_next_epochs_order_alone() -> None:
    """A DataLoader given generator= shuffles from that generator, not the global one."""
    runs = []
    for with_interpret in (False, True):
        x, y = make_classification(n=160)
        g = torch.Generator().manual_seed(5)
        train = torch.utils.data.DataLoader(
            torch.utils.data.TensorDataset(x, y), batch_size=16, shuffle=True, generator=g
        )
        model = mlp()
        trainer = _trainer(model, torch.nn.CrossEntropyLoss(), optimizer="sgd", lr=0.1, seed=0)
        trainer.fit(train, epochs=1)
        if with_interpret:
            trainer.interpret(train)
        history = trainer.fit(train, epochs=1)
        runs.append((history.steps["loss"], [p.detach().clone() for p in model.parameters()]))
    assert runs[0][0] == runs[1][0]
    assert all(torch.equal(a, b) for a, b in zip(runs[0][1], runs[1][1], strict=True))


def test_a_list_of_batches_gives_losses_and_a_matrix_but_no_gallery() -> None:
    x, y = make_classification(n=48)
    batches = [(x[i : i + 16], y[i : i + 16]) for i in range(0, 48, 16)]
    interp = _trainer(mlp(), torch.nn.CrossEntropyLoss()).interpret(batches)
    assert interp.indices.tolist() == list(range(48)) and int(interp.confusion_matrix().sum()) == 48
    assert "cannot be shown" in interp.show(k=3)._repr_html_()


def test_no_per_item_loss_names_loss_per_item() -> None:
    x, y = make_classification(n=32)
    fix = r"loss_per_item=fn\(outputs, targets\)"
    with pytest.raises(NoPerItemLoss, match=f"has no reduction='none'. .*{fix}"):
        _trainer(mlp(), lambda out, t: F.cross_entropy(out, t)).interpret((x, y), batch_size=8)
    custom = _trainer(mlp(), None, compute_loss=lambda m, b: F.cross_entropy(m(b[0]), b[1]))
    with pytest.raises(NoPerItemLoss, match=f"compute_loss=, one per batch. .*{fix}"):
        custom.interpret((x, y), batch_size=8)
    with pytest.raises(NoPerItemLoss, match="must return a 1-d tensor of the batch's size"):
        _trainer(mlp(), torch.nn.CrossEntropyLoss()).interpret((x, y), batch_size=8, loss_per_item=lambda o, t: o.sum())
    given = _trainer(mlp(), lambda out, t: F.cross_entropy(out, t)).interpret(
        (x, y), batch_size=8, loss_per_item=lambda out, t: F.cross_entropy(out, t, reduction="none")
    )
    assert given.task == "classification" and len(given.losses) == 32
    with pytest.raises(ValueError, match="max_items must be an int >= 1"):
        given = _trainer(mlp(), torch.nn.CrossEntropyLoss()).interpret((x, y), batch_size=8, max_items=0)


class Tokens(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.tensor([i, i + 1, i + 2]), torch.tensor(i % 2)


def test_show_fetches_pictures_text_and_rows_back_by_index() -> None:
    g = torch.Generator().manual_seed(0)
    images = torch.rand(12, 1, 8, 8, generator=g) * 4 - 2  # normalized: outside [0, 1]
    labels = torch.randint(0, 3, (12,), generator=g)
    conv = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 3))
    pictures = _trainer(conv, torch.nn.CrossEntropyLoss()).interpret((images, labels), batch_size=5)
    gallery = pictures.show(k=4)
    assert gallery.html.count("<img src='data:image/png;base64,") == 4 and len(gallery.indices) == 4
    assert gallery.indices == [r["index"] for r in pictures.top_losses(4)]
    assert "p(true)" in gallery.html and f">#{gallery.indices[0]}<" in gallery.html

    text_model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Flatten(), torch.nn.Linear(12, 2))
    loader = torch.utils.data.DataLoader(Tokens(), batch_size=4)
    words = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    text = _trainer(text_model, torch.nn.CrossEntropyLoss()).interpret(
        loader, decode=lambda ids: " ".join(words[i] for i in ids)
    )
    assert "two three four" in text.show(items=[2]).html

    class Tokenizer:
        def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
            return "|".join(words[i] for i in ids)

    assert "five|six|seven" in text.show(items=[5], decode=Tokenizer()).html
    assert "decode= shows text" in _trainer(text_model, torch.nn.CrossEntropyLoss()).interpret(loader).show(k=1).html

    x, y = make_classification(n=20, d=16)
    rows = _trainer(mlp(d=16), torch.nn.CrossEntropyLoss()).interpret(
        (x, y), batch_size=8, feature_names=[f"feature {i}" for i in range(16)], classes=["cat", "dog", "fox"]
    )
    html = rows.show(items=[3]).html
    assert "feature 11<" in html and "feature 12<" not in html and "... 4 more" in html
    assert rows.top_losses(1)[0]["target"] in ("cat", "dog", "fox")
    assert "cat" in rows._repr_html_()


def test_the_kept_columns_are_a_few_bytes_per_item() -> None:
    x, y = make_classification(n=2000, d=64)
    interp = _trainer(mlp(d=64), torch.nn.CrossEntropyLoss()).interpret((x, y), batch_size=256)
    kept = sum(t.numel() * t.element_size() for t in interp.items.columns.values())
    assert kept == 28 * 2000  # index, loss, target, prediction, two probabilities; never the 256-byte inputs


@needs("transformers")
def test_a_causal_lm_gets_each_sequences_mean_token_loss() -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=40, n_positions=16))
    ids = torch.randint(0, 40, (6, 8))
    labels = ids.clone()
    labels[2, 5:] = -100  # padding
    items: Any = [{"input_ids": ids[i], "labels": labels[i]} for i in range(6)]
    batches = torch.utils.data.DataLoader(items, batch_size=4)
    interp = _trainer(model, None).interpret(batches)
    assert interp.task == "lm" and interp.indices.tolist() == list(range(6))
    model.eval()
    with torch.no_grad():
        alone = [float(model(input_ids=ids[i : i + 1], labels=labels[i : i + 1]).loss) for i in range(6)]
    torch.testing.assert_close(interp.losses, torch.tensor(alone), rtol=1e-5, atol=1e-6)
    assert interp.top_losses(1)[0]["perplexity"] == pytest.approx(float(np.exp(max(alone))), rel=1e-5)
    assert "decode= shows text" in interp.show(k=1).html


@needs("transformers")
def test_a_hugging_face_classifier_without_criterion() -> None:
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(vocab_size=30, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, num_labels=3, id2label={0: "neg", 1: "neutral", 2: "pos"})  # fmt: skip
    model = BertForSequenceClassification(config)
    ids, labels = torch.randint(0, 30, (10, 6)), torch.randint(0, 3, (10,))
    items: Any = [{"input_ids": ids[i], "labels": labels[i]} for i in range(10)]
    loader = torch.utils.data.DataLoader(items, batch_size=4)
    interp = _trainer(model, None).interpret(loader)
    model.eval()
    with torch.no_grad():
        alone = [float(model(input_ids=ids[i : i + 1], labels=labels[i : i + 1]).loss) for i in range(10)]
    torch.testing.assert_close(interp.losses, torch.tensor(alone), rtol=1e-5, atol=1e-6)
    assert interp.task == "classification" and interp.classes == ["neg", "neutral", "pos"]
    assert interp.top_losses(1)[0]["target"] in ("neg", "neutral", "pos")
