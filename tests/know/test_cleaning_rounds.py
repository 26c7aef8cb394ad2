"""Cleaning a dataset in rounds, as a practitioner does in a notebook: map, mark, clean, train on the view, mark
again. Each test trains real fits on tiny models and checks the items and labels the next fit gets."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, SubsetRandomSampler, TensorDataset

from nbtrainer import CleanedDataset, DataMap, Trainer


def _trainer(model: torch.nn.Module, *callbacks: Any, **kw: Any) -> Trainer:
    return Trainer(model, torch.nn.CrossEntropyLoss(), "sgd", lr=0.1, callbacks=list(callbacks), progress=False, **kw)


def _data(n: int = 48, classes: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 4, generator=g), torch.randint(0, classes, (n,), generator=g)


class _Records(Dataset):
    """Dict items whose label key is not a default one, beside a float field named ``y``."""

    def __init__(self) -> None:
        self.x, self.c = _data(40)
        self.y = torch.randn(40)

    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i], "y": self.y[i], "class_id": self.c[i]}


class _DictModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        return self.lin(x)


def test_a_relabel_changes_the_field_the_trainer_reads_as_the_label() -> None:
    ds = _Records()
    dm = DataMap()
    _trainer(_DictModel(), dm, target_keys="class_id").fit(DataLoader(ds, batch_size=8), epochs=1)
    new = (int(ds.c[0]) + 1) % 3
    item = dm.cleaned(relabel={0: new})[0]
    assert int(item["class_id"]) == new
    assert float(item["y"]) == float(ds.y[0])  # the float field called "y" is an input here, left alone


def test_with_compute_loss_the_label_place_is_asked_for_before_the_next_fit() -> None:
    x, y = _data()
    w = torch.full((len(y),), 0.5)

    def compute_loss(model: torch.nn.Module, batch: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        xb, yb, wb = batch
        out = model(xb)
        return (torch.nn.functional.cross_entropy(out, yb, reduction="none") * wb).mean(), out, yb

    dm = DataMap()
    ds = TensorDataset(x, y, w)
    _trainer(torch.nn.Linear(4, 3), dm, compute_loss=compute_loss).fit(DataLoader(ds, batch_size=8), epochs=1)
    new = (int(y[5]) + 1) % 3
    with pytest.raises(TypeError, match=r"cannot tell which field of the items \(tuples of 3\).*target="):
        dm.cleaned(relabel={5: new})
    view = dm.cleaned(relabel={5: new}, target=1)
    # the batched fetch (one index_select per batch) and the item path give the same, right, fields
    _, yb, wb = next(iter(DataLoader(view, batch_size=len(view))))
    assert int(yb[5]) == new and torch.equal(wb, w)
    _, y5, w5 = view[5]
    assert int(y5) == new and float(w5) == 0.5


def test_a_relabeled_class_probability_row_stays_a_row() -> None:
    x, y = _data()
    onehot = torch.nn.functional.one_hot(y, 3).float()
    dm = DataMap()
    _trainer(torch.nn.Linear(4, 3), dm).fit((x, onehot), batch_size=8, epochs=1)
    new = (int(y[0]) + 1) % 3
    view = dm.cleaned(relabel={0: new})
    assert torch.equal(view[0][1], torch.nn.functional.one_hot(torch.tensor(new), 3).float())
    _trainer(torch.nn.Linear(4, 3)).fit(DataLoader(view, batch_size=8), epochs=1)  # the rows still stack


def test_marks_made_before_a_fit_on_the_view_are_not_applied_again() -> None:
    x, y = _data()
    dm = DataMap()
    trainer = _trainer(torch.nn.Linear(4, 3), dm)
    trainer.fit((x, y), batch_size=8, epochs=1)
    dm.edits.drop(0, 1)
    trainer.fit((x, y), batch_size=8, epochs=1)  # the same arrays again: the marks still stand
    assert dm.edits.dropped == [0, 1]
    view = dm.cleaned()
    _trainer(torch.nn.Linear(4, 3), dm).fit(DataLoader(view, batch_size=8), epochs=1)
    assert len(dm.edits) == 0  # they are in the view; the map's indices are now the view's
    dm.edits.drop(5)  # the view's item 5 is the base's item 7
    assert dm.cleaned().changes["dropped"] == [0, 1, 7]


@pytest.mark.parametrize("kind", ["tensor", "numpy", "mask", "one"])
def test_indices_to_drop_may_be_a_tensor_an_array_or_a_mask(kind: str) -> None:
    x, y = _data()
    dm = DataMap()
    _trainer(torch.nn.Linear(4, 3), dm).fit((x, y), batch_size=8, epochs=1)
    drop: Any = {
        "tensor": torch.tensor([3, 9]),
        "numpy": np.array([3, 9]),
        "mask": torch.isin(torch.arange(len(y)), torch.tensor([3, 9])),
        "one": torch.tensor([0]),  # one element: a truthiness test would read it as "nothing"
    }[kind]
    expected = [0] if kind == "one" else [3, 9]
    assert dm.cleaned(drop=drop).changes["dropped"] == expected
    with pytest.raises(ValueError, match="both dropped and relabeled"):
        dm.cleaned(drop=[1], relabel={1: 0})


def _filtering(items: list[Any]) -> list[torch.Tensor]:
    kept = [it for it in items if float(it[0][0]) > -0.5]  # a collate that leaves out "broken" items
    return [torch.stack([it[0] for it in kept]), torch.stack([it[1] for it in kept])]


def _sorting(items: list[Any]) -> list[torch.Tensor]:
    items = sorted(items, key=lambda it: float(it[0][0]))  # as before packing sequences by length
    return [torch.stack([it[0] for it in items]), torch.stack([it[1] for it in items])]


@pytest.mark.parametrize(("collate", "said"), [(_filtering, "rows for"), (_sorting, "reorders")])
def test_a_collate_that_drops_or_reorders_items_turns_the_map_off_and_training_goes_on(collate: Any, said: str) -> None:
    x, y = _data(64)
    dm = DataMap()
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True, collate_fn=collate)
    history = _trainer(torch.nn.Linear(4, 3), dm).fit(loader, epochs=2)
    assert history.status == "finished"
    assert said in (dm.note or "")
    assert int(dm.visits.sum()) == 0 and len(dm.visits) == 64  # nothing attributed to the wrong items
    assert dm.label_issues(5) == []


def test_a_collate_that_keeps_the_order_keeps_the_map() -> None:
    x, y = _data(64)
    dm = DataMap()
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True, collate_fn=_stack)
    _trainer(torch.nn.Linear(4, 3), dm).fit(loader, epochs=2)
    assert dm.note is None
    assert torch.equal(dm.given, y) and int(dm.visits.min()) == 2


def _stack(items: list[Any]) -> list[torch.Tensor]:
    return [torch.stack([it[0] for it in items]), torch.stack([it[1] for it in items])]


def test_a_cleaned_view_trains_with_batch_size_like_arrays() -> None:
    x, y = _data()
    dm = DataMap()
    trainer = _trainer(torch.nn.Linear(4, 3), dm)
    trainer.fit((x, y), batch_size=8, epochs=1)
    view = dm.cleaned(drop=[0, 1])
    assert isinstance(view, CleanedDataset)
    history = trainer.fit(view, batch_size=8, epochs=1)
    assert history.status == "finished" and int(dm.visits.sum()) == len(y) - 2
    with pytest.raises(TypeError, match=r"is a Dataset \(CleanedDataset\), not a loader.*batch_size="):
        trainer.fit(view, epochs=1)


def test_the_data_check_reads_the_split_a_subset_sampler_draws() -> None:
    x, y = _data(100)
    ds = TensorDataset(x, y)
    order = torch.randperm(100, generator=torch.Generator().manual_seed(1)).tolist()
    train = DataLoader(ds, batch_size=16, sampler=SubsetRandomSampler(order[:80]))
    val = DataLoader(ds, batch_size=16, sampler=SubsetRandomSampler(order[80:]))
    report = _trainer(torch.nn.Linear(4, 3)).check_data(train, val)
    assert report.by_kind("duplicates_across") == []  # disjoint splits of one dataset: no leak
    assert report.splits["train"]["items"] == 80 and report.splits["val"]["items"] == 20
    counts = report.splits["train"]["classes"]
    assert counts == {int(k): int(v) for k, v in zip(*torch.unique(y[order[:80]], return_counts=True), strict=True)}


def test_a_refusal_is_checked_against_the_data_as_it_is_now() -> None:
    x, y = _data()
    y[3] = 7
    loader = DataLoader(TensorDataset(x, y), batch_size=8)
    trainer = _trainer(torch.nn.Linear(4, 3), check_data=True)
    assert trainer.check_data(loader).by_kind("label_range")
    y[3] = 1  # fixed in place, after the check
    assert trainer.fit(loader, epochs=1).status == "finished"


def test_a_leak_found_in_a_sample_is_said_to_be_a_floor() -> None:
    x, y = _data(200)
    val = (x[:20].clone(), y[:20].clone())
    report = _trainer(torch.nn.Linear(4, 3)).check_data((x, y), val, max_items=50, batch_size=16)
    (leak,) = report.by_kind("duplicates_across")
    assert leak.message.startswith("at least ") and "sampled of 200" in leak.message
    full = _trainer(torch.nn.Linear(4, 3)).check_data((x, y), val, batch_size=16)
    assert full.by_kind("duplicates_across")[0].data["count"] == 20


def test_a_binary_heads_rare_positives_are_reported_with_pos_weight() -> None:
    x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
    y = torch.zeros(64)
    y[:3] = 1
    trainer = Trainer(torch.nn.Linear(4, 1), torch.nn.BCEWithLogitsLoss(), "sgd", lr=0.1, progress=False)
    report = trainer.check_data((x, y[:, None]), batch_size=16)
    (problem,) = report.by_kind("imbalance")
    assert problem.data["counts"] == {0: 61, 1: 3} and "pos_weight=torch.tensor([20.3])" in problem.advice
    assert report.by_kind("label_range") == []  # 0/1 floats are not class numbers past a single output


def test_show_says_which_items_are_not_in_the_training_set() -> None:
    x, y = _data()
    dm = DataMap()
    _trainer(torch.nn.Linear(4, 3), dm).fit((x, y), batch_size=8, epochs=1)
    shown = dm.show([2, 99])
    assert "not an item of this training set (0..47)" in shown.html and "#2 · given" in shown.html


class _TokenLoss(torch.nn.Module):  # one loss per batch, no reduction=: the map cannot split it without help
    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())


def test_a_loss_the_map_cannot_split_is_followed_with_loss_per_item() -> None:
    ids = torch.randint(0, 16, (32, 6), generator=torch.Generator().manual_seed(0))
    model = torch.nn.Sequential(torch.nn.Embedding(16, 8), torch.nn.Linear(8, 16))
    plain = DataMap()
    Trainer(model, _TokenLoss(), "adam", lr=1e-2, callbacks=[plain], progress=False).fit((ids, ids), batch_size=8)
    assert plain.mode == "off" and "DataMap(loss_per_item=" in (plain.note or "")

    def per_item(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(out.transpose(1, 2), y, reduction="none").mean(1)

    dm = DataMap(loss_per_item=per_item)
    Trainer(model, _TokenLoss(), "adam", lr=1e-2, callbacks=[dm], progress=False).fit((ids, ids), batch_size=8)
    assert dm.mode == "loss" and int(dm.visits.min()) == 1 and bool(torch.isfinite(dm.confidence).all())


def test_sequences_padded_per_batch_are_checked_in_every_batch() -> None:
    g = torch.Generator().manual_seed(0)
    items = [torch.randn(int(n), 5, generator=g) for n in torch.randint(3, 9, (64,), generator=g)]
    items[3][1, 2] = float("nan")
    items[40][0, 4] = float("inf")

    def pad(batch: list[Any]) -> list[torch.Tensor]:
        seqs = torch.nn.utils.rnn.pad_sequence([b[0] for b in batch], batch_first=True)
        return [seqs, torch.stack([b[1] for b in batch])]

    data = [(s, torch.tensor(i % 2)) for i, s in enumerate(items)]
    report = _trainer(torch.nn.Linear(5, 2)).check_data(DataLoader(data, batch_size=16, collate_fn=pad))  # type: ignore[arg-type]
    (bad,) = report.by_kind("nonfinite")
    assert bad.data["indices"] == [3, 40] and bad.data["items"] == 2
    every = torch.cat(items)
    finite = every[torch.isfinite(every).all(1)]
    assert report.splits["train"]["fields"]["inputs"]["max"] == pytest.approx(float(finite.max()))


def test_a_relabel_to_a_class_the_model_has_no_output_for_is_refused_before_any_step() -> None:
    """relabel={100: 7} for a 3-class model (a typo, a class number of another label map) was taken, and the next fit
    trained 6 steps before the batch holding item 100 failed. The map knows the model's outputs: refused at cleaned(),
    naming the item, the label and the range; decisions made in the panel's cleaner too; Interpretation alike."""
    x, y = _data(120)
    dm = DataMap()
    trainer = _trainer(torch.nn.Linear(4, 3), dm)
    trainer.fit(DataLoader(TensorDataset(x, y), batch_size=16), epochs=1)
    for relabel in ({100: 7}, {100: -1}):
        with pytest.raises(ValueError, match=r"item 100 .*outside the model's 3 outputs \(0\.\.2\)"):
            dm.cleaned(relabel=relabel)
    dm.edits.relabel(5, 3)  # the panel's cleaner
    with pytest.raises(ValueError, match=r"item 5 .*class 3"):
        dm.cleaned(relabel={100: 2})
    dm.edits.keep(5)
    assert int(dm.cleaned(relabel={100: 2})[100][1]) == 2  # in range: taken
    interp = trainer.interpret(DataLoader(TensorDataset(x, y), batch_size=16))
    with pytest.raises(ValueError, match=r"item 9 .*outside the model's 3 outputs"):
        interp.cleaned(relabel={9: 3})
    binary = DataMap()
    head = Trainer(torch.nn.Linear(4, 1), torch.nn.BCEWithLogitsLoss(), "sgd", callbacks=[binary], progress=False)
    head.fit((x, (y > 0).float()[:, None]), batch_size=16, epochs=1)
    with pytest.raises(ValueError, match=r"outside the model's 2 outputs \(0\.\.1\)"):
        binary.cleaned(relabel={3: 2})


def test_items_with_a_weight_beside_their_label_are_checked_and_mapped_by_the_label() -> None:
    """(x, y, weight) items with num_inputs=1 and a weighted loss: the targets are (y, weight). The check counted no
    class ('targets are not one class label per item') and the map turned itself off; both now read y, and say so."""
    x, y = _data(120)
    y[:100] = 0  # 100 of class 0 against about 10 each
    w = torch.rand(120, generator=torch.Generator().manual_seed(1))

    def weighted(out: torch.Tensor, t: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return (torch.nn.functional.cross_entropy(out, t[0], reduction="none") * t[1]).mean()

    dm = DataMap()
    trainer = Trainer(torch.nn.Linear(4, 3), weighted, "sgd", lr=0.1, callbacks=[dm], progress=False, num_inputs=1)
    loader = DataLoader(TensorDataset(x, y, w), batch_size=16, shuffle=True)
    report = trainer.check_data(loader)
    counts = dict(enumerate(torch.bincount(y, minlength=3).tolist()))
    assert report.splits["train"]["classes"] == counts and report.by_kind("imbalance")
    assert any("first" in n for n in report.notes)
    trainer.fit(loader, epochs=2)
    assert dm.mode == "classification" and torch.equal(dm.given, y) and int(dm.visits.sum()) == 240
    assert dm.note is not None and "first" in dm.note
