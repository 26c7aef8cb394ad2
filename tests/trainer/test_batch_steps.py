"""The Trainer's batch steps (``nbtrainer._loop._batch_steps.BatchSteps``): overrides, a batch's loss, evaluation."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from conftest import make_classification, make_loader, mlp

from nbtrainer import Trainer


def _loss_fn(model, batch):
    x, y = batch
    out = model(x)
    return torch.nn.functional.cross_entropy(out, y) * 2, out, y


class Doubled(Trainer):
    def compute_loss(self, batch):
        return _loss_fn(self.model, batch)


@pytest.mark.parametrize("how", ["default", "function", "subclass"])
def test_the_loss_of_a_batch_follows_the_override(how):
    x, y = make_classification(n=32)
    batch = (x[:8], y[:8])
    model = mlp()
    cls = Doubled if how == "subclass" else Trainer
    kw: dict[str, Any] = {"compute_loss": _loss_fn} if how == "function" else {}
    trainer = cls(model, torch.nn.CrossEntropyLoss(), progress=False, **kw)
    steps = trainer.batch_steps
    assert steps.custom_loss is (how != "default")
    assert steps.compute_loss_fn is kw.get("compute_loss")
    assert steps.default_compute() is (how == "default")  # only the plain protocol may take the loop's inlined path
    loss, outputs, targets = steps.compute(batch)
    plain = torch.nn.functional.cross_entropy(model(x[:8]), y[:8])
    assert torch.allclose(loss, plain * (1 if how == "default" else 2))
    assert outputs.shape == (8, 3) and targets is batch[1]


def test_evaluate_is_the_batch_steps_evaluation_with_its_own_metrics():
    x, y = make_classification(n=64)
    loader = make_loader(x, y, batch_size=16)
    acc = {"acc": lambda out, t: (out.argmax(-1) == t).float().mean()}
    trainer = Trainer(mlp(), torch.nn.CrossEntropyLoss(), "sgd", metrics=acc, progress=False)
    steps = trainer.batch_steps
    assert steps.val_metrics is not trainer.run_state.train_metrics and steps.val_metrics.names == ["acc"]
    direct = steps.evaluate(list(loader), prefix="v_")
    assert sorted(direct) == ["v_acc", "v_loss"]
    assert trainer.evaluate(loader, prefix="v_") == pytest.approx(direct)
    with steps.inference():
        assert torch.is_inference_mode_enabled()


def test_evaluate_leaves_a_submodule_frozen_in_eval_mode_in_eval_mode():
    x, y = make_classification(n=32)
    model = torch.nn.Sequential(torch.nn.Linear(10, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 3))
    model.train()
    model[1].eval()  # a frozen BatchNorm: its running statistics must not move in the next fit
    Trainer(model, torch.nn.CrossEntropyLoss(), progress=False).evaluate([(x, y)])
    assert [m.training for m in model.modules()] == [True, True, False, True]
