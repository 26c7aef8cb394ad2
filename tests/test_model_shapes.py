"""Any model shape: multi-input, multi-output, dict batches and dict/dataclass outputs; predict keeps structure."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from nbtrainer import Trainer


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


class TwoInOneOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 8), nn.Linear(3, 8)
        self.head = nn.Linear(8, 2)

    def forward(self, xa, xb):
        return self.head(torch.relu(self.a(xa) + self.b(xb)))


class OneInTwoOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(4, 8)
        self.cls, self.reg = nn.Linear(8, 3), nn.Linear(8, 1)

    def forward(self, x):
        h = torch.relu(self.body(x))
        return self.cls(h), self.reg(h)


@dataclasses.dataclass
class Out:
    logits: torch.Tensor
    loss: torch.Tensor | None = None


class DictModel(nn.Module):
    """Hugging Face style: keyword inputs, returns an output object with .loss when labels are given."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, 8)
        self.head = nn.Linear(8, 2)

    def forward(self, input_ids, attention_mask, labels=None):
        h = (self.emb(input_ids) * attention_mask.unsqueeze(-1)).sum(1) / attention_mask.sum(1, keepdim=True)
        logits = self.head(h)
        loss = nn.functional.cross_entropy(logits, labels) if labels is not None else None
        return Out(logits=logits, loss=loss)


def _multi_loss(outputs, targets):
    (cls, reg), (yc, yr) = outputs, targets
    return nn.functional.cross_entropy(cls, yc) + nn.functional.mse_loss(reg, yr)


def test_multi_input_single_output():
    g = torch.Generator().manual_seed(0)
    data = [
        (torch.randn(8, 4, generator=g), torch.randn(8, 3, generator=g), torch.randint(0, 2, (8,), generator=g))
        for _ in range(6)
    ]
    model = TwoInOneOut()
    trainer = Trainer(
        model,
        nn.CrossEntropyLoss(),
        torch.optim.Adam(model.parameters(), 1e-2),
        progress=False,
        metrics={"acc": lambda o, t: (o.argmax(1) == t).float().mean()},
    )
    h = trainer.fit(data, data, epochs=5)
    assert h["loss"][-1] < h["loss"][0]
    assert set(trainer.evaluate(data)) == {"val_loss", "val_acc"}
    assert trainer.predict(data).shape == (48, 2)


def test_single_input_multi_output_with_num_inputs():
    g = torch.Generator().manual_seed(0)
    data = [
        (torch.randn(8, 4, generator=g), torch.randint(0, 3, (8,), generator=g), torch.randn(8, 1, generator=g))
        for _ in range(5)
    ]
    model = OneInTwoOut()
    trainer = Trainer(model, _multi_loss, torch.optim.Adam(model.parameters(), 1e-2), num_inputs=1, progress=False)
    h = trainer.fit(data, epochs=4)
    assert h["loss"][-1] < h["loss"][0]
    preds = trainer.predict(data)
    assert isinstance(preds, tuple) and preds[0].shape == (40, 3) and preds[1].shape == (40, 1)


def test_dict_batches_and_model_computed_loss():
    g = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(6):
        ids = torch.randint(0, 20, (8, 5), generator=g)
        batches.append({"input_ids": ids, "attention_mask": torch.ones(8, 5), "labels": (ids[:, 0] > 9).long()})
    model = DictModel()
    # criterion=None: the model computes the loss from labels (passed through), metrics still get targets.
    trainer = Trainer(
        model,
        None,
        torch.optim.Adam(model.parameters(), 1e-2),
        progress=False,
        metrics={"acc": lambda o, t: (o.logits.argmax(1) == t).float().mean()},
    )
    h = trainer.fit(batches, batches, epochs=8)
    assert h["loss"][-1] < 0.8 * h["loss"][0] and h["val_acc"][-1] > 0.65
    preds = trainer.predict(batches)
    assert isinstance(preds, Out) and preds.logits.shape == (48, 2)


def test_dict_batches_with_criterion_and_target_keys():
    g = torch.Generator().manual_seed(0)
    batches = [
        {
            "xa": torch.randn(8, 4, generator=g),
            "xb": torch.randn(8, 3, generator=g),
            "y": torch.randint(0, 2, (8,), generator=g),
        }
        for _ in range(4)
    ]
    model = TwoInOneOut()
    trainer = Trainer(
        model, nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), 0.1), target_keys="y", progress=False
    )
    trainer.fit(batches, epochs=2)
    out = trainer.predict(batches)
    assert out.shape == (32, 2)


def test_compute_loss_hook_and_subclass():
    data = [(torch.randn(8, 4), torch.randn(8, 2)) for _ in range(4)]
    model = nn.Linear(4, 2)
    calls = []

    def compute_loss(m, batch):
        x, y = batch
        out = m(x)
        calls.append(1)
        return nn.functional.l1_loss(out, y), out, y

    Trainer(model, None, torch.optim.SGD(model.parameters(), 0.1), compute_loss=compute_loss, progress=False).fit(data)
    assert len(calls) == 4

    class Custom(Trainer):
        def compute_loss(self, batch):
            x, y = batch
            out = self.model(x)
            return (out - y).pow(2).mean(), out, y

    h = Custom(model, None, torch.optim.SGD(model.parameters(), 0.1), progress=False).fit(data, epochs=2)
    assert len(h) == 2


def test_bad_batch_type_is_explained():
    model = nn.Linear(4, 2)
    trainer = Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), 0.1), progress=False)
    with pytest.raises(TypeError, match="must yield tensors, tuples/lists"):
        trainer.fit(["not a batch"] * 3)
