"""The mode a fit trains in: the model in train mode, except the layers with running statistics the user put in eval
mode inside a model in train mode (a BatchNorm frozen for fine-tuning keeps its statistics), through every epoch,
validation between them and the LR finder's steps; a model wholly in eval mode (as inference or ``from_pretrained``
leave it) trains whole, and so does a Dropout in eval mode (a ``from_pretrained`` backbone inside a new model)."""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import make_classification, make_loader
from torch import nn

from nbtrainer import Trainer


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(10, 16), nn.BatchNorm1d(16), nn.Dropout(0.5), nn.ReLU(), nn.Linear(16, 3))


def _record_modes(model: nn.Sequential) -> list[tuple[bool, bool]]:
    """(BatchNorm training, Dropout training) at each forward that computes gradients (a training step's)."""
    seen: list[tuple[bool, bool]] = []

    def record(*_):
        if torch.is_grad_enabled():
            seen.append((model[1].training, model[2].training))

    model[1].register_forward_pre_hook(record)
    return seen


def test_a_submodule_frozen_in_eval_mode_stays_frozen_through_fit():
    x, y = make_classification(n=64)
    model = _model()
    model[1].eval()
    stats = {k: v.clone() for k, v in model[1].named_buffers()}  # running mean, variance and count
    seen = _record_modes(model)
    trainer = Trainer(model, nn.CrossEntropyLoss(), "adam", progress=False)
    before = dict(model.named_parameters())["0.weight"].detach().clone()
    with pytest.warns(
        UserWarning, match=r"1 layer\(s\) with running statistics are in eval mode .*\(1\).*model\.train\(\)"
    ):
        trainer.fit(make_loader(x, y, 16), make_loader(x, y, 32), epochs=2)  # validation between the epochs
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once per model, not at every fit
        trainer.fit_more(make_loader(x, y, 16), epochs=1)
    assert len(seen) == 12 and set(seen) == {(False, True)}  # the BatchNorm frozen, the Dropout on
    assert all(torch.equal(v, dict(model[1].named_buffers())[k]) for k, v in stats.items())  # statistics unmoved
    assert [m.training for m in model.modules()] == [True, True, False, True, True, True]
    assert not torch.equal(before, dict(model.named_parameters())["0.weight"])  # the rest trained


def test_a_model_wholly_in_eval_mode_trains_whole():
    x, y = make_classification(n=64)
    model = _model().eval()
    seen = _record_modes(model)
    mean = dict(model.named_buffers())["1.running_mean"].clone()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing is kept frozen: nothing to say
        Trainer(model, nn.CrossEntropyLoss(), "adam", progress=False).fit(make_loader(x, y, 16), epochs=1)
    assert set(seen) == {(True, True)} and not torch.equal(mean, dict(model.named_buffers())["1.running_mean"])
    assert all(m.training for m in model.modules())


def test_a_dropout_in_eval_mode_inside_a_training_model_is_switched_on():
    x, y = make_classification(n=64)
    model = _model()
    model[2].eval()  # as a from_pretrained backbone inside a model of the user's own comes
    seen = _record_modes(model)
    Trainer(model, nn.CrossEntropyLoss(), "adam", progress=False).fit(make_loader(x, y, 16), epochs=1)
    assert set(seen) == {(True, True)}


@pytest.mark.parametrize("frozen", [True, False])
def test_the_lr_finder_steps_in_the_mode_fit_would(frozen):
    x, y = make_classification(n=128)
    model = _model()
    if frozen:
        model[1].eval()
    seen = _record_modes(model)
    Trainer(model, nn.CrossEntropyLoss(), "adam", progress=False).lr_find(make_loader(x, y, 16), steps=5)
    assert seen and set(seen) == {(not frozen, True)}
    assert model[1].training is not frozen
