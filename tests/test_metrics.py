"""Metrics: callables and torchmetrics agree with a direct computation; epoch values are sample-weighted."""

from __future__ import annotations

import pytest
import torch
import torchmetrics
from conftest import accuracy, make_classification, make_loader, mlp

from nbtrainer import Trainer


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


def test_bad_metric_object():
    model = mlp()
    with pytest.raises(TypeError, match="torchmetrics Metric or a callable"):
        Trainer(model, torch.nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=0.1), metrics={"x": 3})
