"""Metrics: callables and torchmetrics agree with a direct computation; epoch values are sample-weighted."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from conftest import LazyModule, accuracy, make_classification, make_loader, mlp

from nbtrainer import Trainer

torchmetrics = LazyModule("torchmetrics")  # imported at first use: collection stays cheap in every worker


def test_metrics_match_direct_computation():
    x, y = make_classification(n=250, classes=4)  # 250 = 7 full batches of 32 + a ragged 26
    model = mlp(out=4)
    metrics = {
        "acc": accuracy,
        "tm_acc": torchmetrics.Accuracy(task="multiclass", num_classes=4),
        "tm": torchmetrics.MetricCollection(
            {"f1": torchmetrics.F1Score(task="multiclass", num_classes=4, average="macro")}
        ),
    }
    trainer = Trainer(
        model, torch.nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=0.0), metrics=metrics, progress=False
    )
    loader = make_loader(x, y, batch_size=32)
    h = trainer.fit(loader, loader, epochs=1)
    with torch.no_grad():
        logits = model(x)
    direct_acc = (logits.argmax(1) == y).float().mean().item()
    direct_loss = torch.nn.functional.cross_entropy(logits, y).item()
    direct_f1 = torchmetrics.functional.f1_score(logits, y, task="multiclass", num_classes=4, average="macro").item()
    row = h.last
    # lr=0: the model never changes, so train-time and eval-time values are the same numbers.
    for key in ("acc", "val_acc", "tm_acc", "val_tm_acc"):
        assert row[key] == pytest.approx(direct_acc, abs=1e-6), key
    assert row["loss"] == pytest.approx(direct_loss, rel=1e-5)
    assert row["val_loss"] == pytest.approx(direct_loss, rel=1e-5)
    assert row["f1"] == pytest.approx(direct_f1, abs=1e-6) and row["val_f1"] == pytest.approx(direct_f1, abs=1e-6)
    assert trainer.evaluate(loader, prefix="test_")["test_acc"] == pytest.approx(direct_acc, abs=1e-6)


def test_metric_returning_non_scalar_is_refused():
    x, y = make_classification(n=64)
    model = mlp()
    trainer = Trainer(
        model,
        torch.nn.CrossEntropyLoss(),
        torch.optim.SGD(model.parameters(), lr=0.1),
        metrics={"per_sample": lambda o, t: (o.argmax(1) == t).float()},
        progress=False,
    )
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ValueError, match=r"per_sample.*one number per batch"):
        trainer.fit(make_loader(x, y), epochs=1)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))  # before the first step


@pytest.mark.parametrize(
    "kind",
    ["numpy float32", "numpy int64", "numpy float64", "numpy 0-d array", "numpy array of one", "float", "0-d tensor"],
)
def test_a_metric_returning_a_number_of_any_kind_logs_its_value(kind):
    """A NumPy scalar (``o.numpy().mean()`` of float32 outputs is a float32, not a Python float) is a number: it logs
    the same sample-weighted value as a tensor would, in fit and in evaluate. So is a 0-d NumPy array (``np.mean``
    with ``keepdims``, ``np.asarray`` of a score, sklearn-style metrics) and an array of one value, as a tensor of one
    value is (the first-batch check refused the arrays as not 'a number or a 0-d tensor')."""
    import numpy as np

    x, y = make_classification(n=50)
    model = mlp()
    kinds: dict[str, Callable[[int], Any]] = {
        "numpy float32": np.float32,
        "numpy int64": np.int64,
        "numpy float64": np.float64,
        "numpy 0-d array": lambda v: np.asarray(v, dtype=np.float64),
        "numpy array of one": lambda v: np.asarray([v], dtype=np.float32),
        "float": float,
        "0-d tensor": torch.tensor,
    }
    as_kind = kinds[kind]
    metrics = {"hits": lambda o, t: as_kind((o.argmax(1) == t).sum().item())}  # a count: exact in every kind
    trainer = Trainer(model, torch.nn.CrossEntropyLoss(), "sgd", lr=1e-9, metrics=metrics, progress=False)
    loader = make_loader(x, y, batch_size=16)  # 16, 16, 16 and 2 items
    with torch.no_grad():
        hits = [(model(xb).argmax(1) == yb).sum().item() for xb, yb in loader]
    expected = sum(h * len(yb) for h, (_, yb) in zip(hits, loader, strict=True)) / 50
    assert trainer.evaluate(loader)["val_hits"] == pytest.approx(expected)
    assert trainer.fit(loader, epochs=1).epochs[-1]["hits"] == pytest.approx(expected, rel=1e-6)


def test_a_metric_returning_a_numpy_array_of_several_values_is_refused_before_the_first_step():
    import numpy as np

    model = mlp()
    before = [p.detach().clone() for p in model.parameters()]
    metrics = {"per_item": lambda o, t: (o.argmax(1) == t).numpy().astype(np.float64)}
    trainer = Trainer(model, torch.nn.CrossEntropyLoss(), "sgd", lr=0.1, metrics=metrics, progress=False)
    with pytest.raises(ValueError, match=r"'per_item' returned a numpy array of shape \(32,\).*one number per batch"):
        trainer.fit(make_loader(*make_classification(n=32)), epochs=1)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_a_metric_returning_something_else_than_a_number_is_refused():
    model = mlp()
    trainer = Trainer(model, torch.nn.CrossEntropyLoss(), "sgd", metrics={"m": lambda o, t: "0.5"}, progress=False)
    with pytest.raises(TypeError, match=r"Metric 'm' returned a str; it must return a number"):
        trainer.fit(make_loader(*make_classification(n=32)), epochs=1)


def test_bad_metric_object():
    model = mlp()
    with pytest.raises(TypeError, match="torchmetrics Metric or a callable"):
        Trainer(model, torch.nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=0.1), metrics={"x": 3})


def test_a_metric_collection_is_accepted_its_keys_name_the_values():
    """Trainer(metrics=MetricCollection(...)): each key of the collection is a logged name (val_ prefix for
    validation), checked up front like any other name (EarlyStopping's monitor)."""
    from nbtrainer import EarlyStopping

    x, y = make_classification(n=250, classes=4)
    model = mlp(out=4)
    collection = torchmetrics.MetricCollection(
        [
            torchmetrics.Accuracy(task="multiclass", num_classes=4),
            torchmetrics.F1Score(task="multiclass", num_classes=4, average="macro"),
        ],
        prefix="m_",
    )
    trainer = Trainer(
        model,
        torch.nn.CrossEntropyLoss(),
        torch.optim.SGD(model.parameters(), lr=0.0),
        metrics=collection,
        callbacks=[EarlyStopping("val_m_MulticlassF1Score", patience=3)],
        progress=False,
    )
    loader = make_loader(x, y, batch_size=32)
    row = trainer.fit(loader, loader, epochs=1).last
    with torch.no_grad():
        logits = model(x)
    acc = (logits.argmax(1) == y).float().mean().item()
    f1 = torchmetrics.functional.f1_score(logits, y, task="multiclass", num_classes=4, average="macro").item()
    for prefix in ("", "val_"):
        assert row[f"{prefix}m_MulticlassAccuracy"] == pytest.approx(acc, abs=1e-6)
        assert row[f"{prefix}m_MulticlassF1Score"] == pytest.approx(f1, abs=1e-6)
    assert trainer.evaluate(loader, prefix="test_")["test_m_MulticlassAccuracy"] == pytest.approx(acc, abs=1e-6)
    with pytest.raises(TypeError, match=r"a dict of name -> metric or a torchmetrics MetricCollection.*Name each"):
        Trainer(
            model,
            torch.nn.CrossEntropyLoss(),
            metrics=torchmetrics.Accuracy(task="multiclass", num_classes=4),
        )


class StateClassifier(torch.nn.Module):
    """An LSTM classifier returning ``(logits, (h, c))``: structured outputs, as recurrent models give."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lstm = torch.nn.LSTM(10, 16, num_layers=2, batch_first=True)
        self.head = torch.nn.Linear(16, 3)

    def forward(self, x):
        out, (h, c) = self.lstm(x.unsqueeze(1))
        return self.head(out[:, -1]), (h, c)


def test_metrics_get_the_tensor_of_structured_outputs_when_they_fail_on_the_whole():
    """A metric written for a tensor (argmax) gets the first tensor of ``(logits, (h, c))``; one written for
    the structure gets it whole; a torchmetrics metric gets the tensor; all give the direct value."""
    x, y = make_classification(n=96)
    model = StateClassifier()
    metrics = {
        "acc": accuracy,
        "whole": lambda out, t: accuracy(out[0], t),
        "tm": torchmetrics.Accuracy(task="multiclass", num_classes=3),
    }
    trainer = Trainer(
        model,
        lambda out, t: torch.nn.functional.cross_entropy(out[0], t),
        torch.optim.SGD(model.parameters(), lr=0.0),
        metrics=metrics,
        progress=False,
    )
    loader = make_loader(x, y, batch_size=32)
    row = trainer.fit(loader, loader, epochs=1).last
    with torch.no_grad():
        direct = (model(x)[0].argmax(1) == y).float().mean().item()
    for key in ("acc", "whole", "tm", "val_acc", "val_whole", "val_tm"):
        assert row[key] == pytest.approx(direct, abs=1e-6), key
    assert trainer.evaluate(loader)["val_acc"] == pytest.approx(direct, abs=1e-6)


def test_a_metric_failing_on_the_outputs_and_on_their_tensor_names_both_errors():
    x, y = make_classification(n=64)
    model = StateClassifier()
    trainer = Trainer(
        model,
        lambda out, t: torch.nn.functional.cross_entropy(out[0], t),
        torch.optim.SGD(model.parameters(), lr=0.1),
        metrics={"bad": lambda out, t: (out.argmax(1) == t[:, 0]).float().mean()},
        progress=False,
    )
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(
        AttributeError,
        match=r"Metric 'bad' raised on the first training batch.*'tuple' object has no attribute 'argmax'.*"
        r"Given the outputs' tensor instead \(the first, shape \[32, 3\]\), metric 'bad' raised too: IndexError",
    ):
        trainer.fit(make_loader(x, y), epochs=1)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def _metric_trainer(metrics):
    model = mlp()
    return Trainer(
        model, torch.nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=0.1), metrics=metrics, progress=False
    )


def test_a_metric_named_like_a_key_the_trainer_logs_is_refused_at_construction():
    # The keys a real fit with validation and no metrics writes in its epoch rows: a metric under any of them
    # would overwrite the trainer's own value (a metric "loss" replaced the training loss and val_loss).
    x, y = make_classification(n=64)
    row = _metric_trainer(None).fit(make_loader(x, y), make_loader(x, y), epochs=1).last
    assert {"loss", "val_loss", "lr", "epoch", "time", "steps", "samples_per_s", "skipped_steps"} <= set(row)
    for key in row:
        with pytest.raises(ValueError, match=rf"Metric '{key}'.*'{key}'.*Rename the metric, e\.g\. metrics="):
            _metric_trainer({key: accuracy})


def test_a_metric_whose_name_is_another_metrics_validation_key_is_refused():
    with pytest.raises(ValueError, match=r"'val_acc'.*metric 'acc'.*Rename"):
        _metric_trainer({"acc": accuracy, "val_acc": accuracy})
    with pytest.raises(ValueError, match=r"'val_acc'.*metric 'val_acc'.*Rename"):
        _metric_trainer({"val_acc": accuracy, "acc": accuracy})
    # no clash: each name and each validation key is logged once
    x, y = make_classification(n=64)
    row = _metric_trainer({"acc": accuracy, "val_top": accuracy}).fit(make_loader(x, y), make_loader(x, y)).last
    assert {"acc", "val_acc", "val_top", "val_val_top"} <= set(row)


def test_two_metric_collections_logging_the_same_name_are_refused():
    accuracy_metric = torchmetrics.Accuracy(task="multiclass", num_classes=3)
    first = torchmetrics.MetricCollection({"acc": accuracy_metric})
    second = torchmetrics.MetricCollection({"acc": torchmetrics.Accuracy(task="multiclass", num_classes=3)})
    with pytest.raises(ValueError, match=r"'acc'.*Rename"):
        _metric_trainer({"a": first, "b": second})
    with pytest.raises(ValueError, match=r"'acc'.*Rename"):
        _metric_trainer({"acc": accuracy, "b": first})
