"""Any model shape: multi-input, multi-output, dict batches and dict/dataclass outputs; predict keeps structure.

The batch protocol (``nbtrainer._data._batch``): tuples, nested ``(inputs, targets)``, dicts and other Mappings,
dataclasses and namedtuples work the same in fit, evaluate and predict.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Iterator, Mapping

import pytest
import torch
from conftest import accuracy
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
        metrics={"acc": accuracy},
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


class _Pair:
    """A batch type the batch protocol does not know: only the subclass's compute_loss can read it."""

    def __init__(self, x, y):
        self.x, self.y = x, y


def test_subclass_compute_loss_for_its_own_batch_type_validates_and_evaluates():
    class PairTrainer(Trainer):
        def compute_loss(self, batch):
            out = self.model(batch.x)
            return nn.functional.cross_entropy(out, batch.y), out, batch.y

    g = torch.Generator().manual_seed(0)
    data = [_Pair(torch.randn(8, 4, generator=g), torch.randint(0, 2, (8,), generator=g)) for _ in range(4)]
    model = nn.Linear(4, 2)
    trainer = PairTrainer(model, nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), 0.1), progress=False)
    h = trainer.fit(data, data, epochs=2)
    logs = trainer.evaluate(data)
    with torch.no_grad():
        expected = sum(nn.functional.cross_entropy(model(b.x), b.y).item() * 8 for b in data) / 32
    assert len(h) == 2 and math.isclose(logs["val_loss"], expected, rel_tol=1e-6)
    assert math.isclose(h.epochs[-1]["val_loss"], expected, rel_tol=1e-6)


def test_bad_batch_type_is_explained():
    model = nn.Linear(4, 2)
    trainer = Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), 0.1), progress=False)
    with pytest.raises(TypeError, match=r"must yield tensors, tuples/lists.*compute_loss=fn\(model, batch\)"):
        trainer.fit(["not a batch"] * 3)


# -- one batch protocol for fit, evaluate and predict ------------------------------------------------------------
def _two_input_data(n_batches=6, bs=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(bs, 4, generator=g), torch.randn(bs, 3, generator=g), torch.randint(0, 2, (bs,), generator=g))
        for _ in range(n_batches)
    ]


def _run_all_three(batches, make_trainer):
    """fit, evaluate and predict on ``batches``; the weights and results, to compare shapes of the same data."""
    torch.manual_seed(0)
    model = TwoInOneOut()
    trainer = make_trainer(model)
    history = trainer.fit(batches, epochs=2)
    return history.steps["loss"], trainer.evaluate(batches), trainer.predict(batches)


def _flat_trainer(model, **kw):
    return Trainer(model, nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), 0.1), progress=False, **kw)


@dataclasses.dataclass
class PairBatch:
    xa: torch.Tensor
    xb: torch.Tensor
    labels: torch.Tensor


class Triple(collections.namedtuple("Triple", "xa xb y")):
    pass


class FrozenMapping(Mapping):
    """A read-only Mapping that is not a dict (like Hugging Face's BatchEncoding, a UserDict)."""

    def __init__(self, data):
        self._data = dict(data)

    def __getitem__(self, key):
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


@pytest.mark.parametrize(
    "shape",
    ["nested-tuple", "nested-list", "dict-inputs", "dataclass", "namedtuple", "mapping", "userdict"],
)
def test_every_batch_shape_trains_evaluates_and_predicts_like_the_flat_tuple(shape):
    """The same data in each shape gives the same losses, evaluation and predictions as (xa, xb, y)."""
    flat = _two_input_data()
    reference = _run_all_three(flat, _flat_trainer)
    convert = {
        "nested-tuple": lambda xa, xb, y: ((xa, xb), y),
        "nested-list": lambda xa, xb, y: [[xa, xb], y],  # what a DataLoader's default collate yields
        "dict-inputs": lambda xa, xb, y: ({"xa": xa, "xb": xb}, y),
        "dataclass": lambda xa, xb, y: PairBatch(xa, xb, y),
        "namedtuple": lambda xa, xb, y: Triple(xa, xb, y),
        "mapping": lambda xa, xb, y: FrozenMapping({"xa": xa, "xb": xb, "labels": y}),
        "userdict": lambda xa, xb, y: collections.UserDict({"xa": xa, "xb": xb, "labels": y}),
    }[shape]
    batches = [convert(*b) for b in flat]
    losses, evaluated, predicted = _run_all_three(batches, _flat_trainer)
    assert losses == reference[0]
    assert evaluated == reference[1]
    assert torch.equal(predicted, reference[2]) and predicted.shape == (48, 2)


def test_nested_targets_reach_the_criterion_as_given():
    """((x1, x2), (y1, y2)): two inputs unpacked, the target pair to a criterion that unpacks it."""
    g = torch.Generator().manual_seed(0)

    class TwoInTwoOut(TwoInOneOut):
        def forward(self, xa, xb):
            out = super().forward(xa, xb)
            return out, out.sum(1, keepdim=True)

    data = [
        (
            (torch.randn(8, 4, generator=g), torch.randn(8, 3, generator=g)),
            (torch.randint(0, 2, (8,), generator=g), torch.randn(8, 1, generator=g)),
        )
        for _ in range(4)
    ]
    model = TwoInTwoOut()
    seen = []

    def criterion(outputs, targets):
        seen.append(type(targets))
        return _multi_loss(outputs, targets)

    trainer = Trainer(model, criterion, torch.optim.SGD(model.parameters(), 0.05), progress=False)
    h = trainer.fit(data, epochs=3)
    assert h.status == "finished" and seen and all(t is tuple for t in seen)
    assert set(trainer.evaluate(data)) == {"val_loss"}
    cls, reg = trainer.predict(data)
    assert cls.shape == (32, 2) and reg.shape == (32, 1)


def test_num_inputs_keeps_flat_semantics_and_passes_a_list_whole():
    """num_inputs=k turns the nested rule off: (x1, x2, y) still works, and ([a, b], y) with num_inputs=1
    passes the list as one argument (models that take a list of tensors)."""
    flat = _two_input_data(n_batches=3)
    ref = _run_all_three(flat, _flat_trainer)
    assert _run_all_three(flat, lambda m: _flat_trainer(m, num_inputs=2))[0] == ref[0]

    class ListModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = TwoInOneOut()

        def forward(self, parts):
            assert isinstance(parts, list)
            return self.inner(*parts)

    torch.manual_seed(0)
    model = ListModel()
    trainer = Trainer(
        model, nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), 0.1), num_inputs=1, progress=False
    )
    h = trainer.fit([([xa, xb], y) for xa, xb, y in flat], epochs=2)
    assert h.steps["loss"] == ref[0][: len(h.steps["loss"])]


@dataclasses.dataclass(frozen=True)
class HFBatch:
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    labels: torch.Tensor | None = None


def test_dataclass_batch_with_model_computed_loss_and_no_labels_at_predict():
    """A collate returning a (frozen) dataclass behaves like the dict of its fields (HF-style model computing
    its loss from labels); at predict time batches without labels (None) work too."""
    g = torch.Generator().manual_seed(0)
    dicts = []
    for _ in range(6):
        ids = torch.randint(0, 20, (8, 5), generator=g)
        dicts.append({"input_ids": ids, "attention_mask": torch.ones(8, 5), "labels": (ids[:, 0] > 9).long()})

    def run(batches, test_batches):
        torch.manual_seed(0)
        model = DictModel()
        trainer = Trainer(
            model,
            None,
            torch.optim.Adam(model.parameters(), 1e-2),
            progress=False,
            metrics={"acc": lambda o, t: (o.logits.argmax(1) == t).float().mean()},
        )
        h = trainer.fit(batches, batches, epochs=8)
        return h, trainer.predict(test_batches)

    ref_h, ref_preds = run(dicts, [{k: v for k, v in d.items() if k != "labels"} for d in dicts])
    records = [HFBatch(**d) for d in dicts]
    h, preds = run(records, [dataclasses.replace(b, labels=None) for b in records])
    assert h["loss"] == ref_h["loss"] and h["val_acc"] == ref_h["val_acc"]
    assert h["loss"][-1] < 0.8 * h["loss"][0] and h["val_acc"][-1] > 0.65
    assert isinstance(preds, Out) and preds.logits.shape == (48, 2) and preds.loss is None
    assert torch.equal(preds.logits, ref_preds.logits)


def test_compare_splits_dataclass_batches_into_micro_batches():
    """compare_strategies' accumulation strategies cut every batch shape, dataclasses too (not k copies)."""
    from nbtrainer._compare import split_batch

    batch = PairBatch(torch.arange(10.0)[:, None].repeat(1, 4), torch.zeros(10, 3), torch.arange(10))
    parts = split_batch(batch, 2)
    assert [type(p) for p in parts] == [PairBatch, PairBatch]
    assert [p.labels.tolist() for p in parts] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    assert torch.equal(torch.cat([p.xa for p in parts]), batch.xa)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int16, torch.int8])
def test_class_labels_of_another_integer_width_get_the_long_hint(dtype):
    """CrossEntropyLoss takes int64 (or uint8) class indices: int32 labels (a NumPy default on Windows, pandas
    columns, compact datasets) fail on the first batch with the fix, before any optimizer step."""
    from conftest import make_classification, make_loader, mlp

    x, y = make_classification(n=64)
    model = mlp()
    before = [p.detach().clone() for p in model.parameters()]
    trainer = Trainer(model, nn.CrossEntropyLoss(), "adamw", lr=1e-2, progress=False)
    name = str(dtype)
    with pytest.raises(RuntimeError, match=rf"CrossEntropyLoss wants int64 class indices; the targets are {name}.*"):
        trainer.fit(make_loader(x, y.to(dtype)))
    with pytest.raises(RuntimeError, match=r"Convert them: y\.long\(\)"):
        trainer.fit((x, y.to(dtype)), batch_size=16)  # arrays: the same check
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    # torch takes uint8 class indices as they are: they train
    assert trainer.fit(make_loader(x, y.to(torch.uint8)), epochs=1).epochs
