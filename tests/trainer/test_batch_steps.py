"""The Trainer's batch steps (``nbtrainer._loop._batch_steps.BatchSteps``): overrides, a batch's loss, evaluation."""

from __future__ import annotations

import dataclasses
import re
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


# -- a standalone evaluate() checks its first batch as fit checks its val_loader -----------------------------------
def _refused(trainer: Trainer, loader: Any, error: type[Exception], *patterns: str) -> None:
    with pytest.raises(error) as info:
        trainer.evaluate(loader)
    for pattern in patterns:
        assert pattern in str(info.value), str(info.value)


def test_evaluate_refuses_outputs_and_targets_that_would_broadcast():
    x, y = torch.randn(8, 5), torch.randn(8)
    trainer = Trainer(torch.nn.Linear(5, 1), torch.nn.MSELoss(), progress=False)
    _refused(trainer, [(x, y)], ValueError, "MSELoss got outputs of shape [8, 1] and targets of shape [8]", "y.view")


def test_evaluate_refuses_batch_options_that_do_not_apply_to_its_batches():
    x, y = make_classification(n=8, d=5)
    tuples = Trainer(torch.nn.Linear(5, 3), torch.nn.CrossEntropyLoss(), progress=False, target_keys="label")
    _refused(tuples, [(x, y)], ValueError, "target_keys='label' names entries of dict", "Drop target_keys=")

    class Named(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(5, 3)

        def forward(self, a: torch.Tensor) -> torch.Tensor:
            return self.layer(a)

    dicts = Trainer(Named(), torch.nn.CrossEntropyLoss(), progress=False, num_inputs=1)
    _refused(dicts, [{"a": x, "labels": y}], ValueError, "num_inputs=1 counts the leading elements", "Drop num_inputs=")


def test_evaluate_names_the_fix_when_the_criterion_or_a_metric_fails_on_the_first_batch():
    x, y = make_classification(n=8)

    class Logits(torch.nn.Module):  # a structured output, as Hugging Face models return
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(10, 3)

        def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"logits": self.layer(x)}

    whole = Trainer(Logits(), torch.nn.CrossEntropyLoss(), progress=False)
    _refused(whole, [(x, y)], TypeError, 'criterion=lambda out, y: CrossEntropyLoss()(out["logits"], y)')
    int32 = Trainer(mlp(), torch.nn.CrossEntropyLoss(), progress=False)
    _refused(int32, [(x, y.int())], RuntimeError, "wants int64 class indices", "y.long()")
    wrong = Trainer(mlp(), torch.nn.CrossEntropyLoss(), progress=False, metrics={"acc": lambda out, t: out.argmax(-1)})
    _refused(wrong, [(x, y)], ValueError, "Metric 'acc' returned a tensor of shape (8,)", ".mean()")


def test_evaluate_checks_its_first_batch_without_running_the_model_twice():
    x, y = make_classification(n=48)
    model = mlp()
    calls: list[int] = []
    model.register_forward_hook(lambda module, args, out: calls.append(len(args[0])))
    logs = Trainer(model, torch.nn.CrossEntropyLoss(), progress=False).evaluate(make_loader(x, y, batch_size=16))
    assert calls == [16, 16, 16]
    with torch.no_grad():
        assert logs["val_loss"] == pytest.approx(torch.nn.functional.cross_entropy(model(x), y).item(), rel=1e-5)


@pytest.mark.parametrize("empty", ["iterator", "generator", "validation_step"])
def test_evaluate_refuses_a_loader_without_len_that_yields_no_batches(empty: str) -> None:
    acc = {"acc": lambda out, t: (out.argmax(-1) == t).float().mean()}
    model = mlp()
    trainer = Trainer(model, torch.nn.CrossEntropyLoss(), progress=False, metrics=acc)
    if empty == "validation_step":  # manual optimization: evaluate() logs validation_step's values
        trainer = Trainer(
            model,
            None,
            {"main": torch.optim.SGD(model.parameters(), lr=0.1)},
            training_step=lambda step, batch: {"loss": model(batch[0]).sum()},
            validation_step=lambda model, batch: {"loss": model(batch[0]).sum()},
            progress=False,
        )
    nothing: list[Any] = []
    loader = iter(nothing) if empty == "iterator" else (b for b in nothing)
    with pytest.raises(ValueError, match=r"evaluate\(\) loader yielded no batches.*already consumed"):
        trainer.evaluate(loader)


@dataclasses.dataclass
class _LogitsAndLoss:  # an output object read by attribute, with a loss field, as Hugging Face's are
    logits: torch.Tensor
    loss: torch.Tensor | None = None


class _Structured(torch.nn.Module):
    def __init__(self, wrap: Any) -> None:
        super().__init__()
        self.layer, self.wrap = torch.nn.Linear(10, 3), wrap

    def forward(self, x: torch.Tensor) -> Any:
        return self.wrap(self.layer(x))


@pytest.mark.parametrize(
    "wrap, model_loss",
    [(lambda t: {"logits": t}, False), (lambda t: _LogitsAndLoss(t), True)],
    ids=["dict", "object"],
)
def test_the_criterion_the_refusal_suggests_for_a_structured_output_runs(wrap, model_loss):
    """The fix in the message is code: pasted back, it must evaluate (a dict has no .logits attribute), and
    criterion=None is offered only where the output has a loss to use."""
    x, y = make_classification(n=8)
    model = _Structured(wrap)
    with pytest.raises(TypeError, match="the criterion gets it whole") as info:
        Trainer(model, torch.nn.CrossEntropyLoss(), progress=False).evaluate([(x, y)])
    message = str(info.value)
    suggested = re.search(r"criterion=(lambda out, y: .*?\(out\S*, y\))", message)
    assert suggested is not None, message
    criterion = eval(suggested.group(1), {"CrossEntropyLoss": torch.nn.CrossEntropyLoss})
    logs = Trainer(model, criterion, progress=False).evaluate([(x, y)])
    with torch.no_grad():
        expected = torch.nn.functional.cross_entropy(model.layer(x), y).item()
    assert logs["val_loss"] == pytest.approx(expected)
    assert ("criterion=None" in message) is model_loss
