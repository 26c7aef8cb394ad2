"""check_data over the samplers and samples a practitioner really uses: which items the pass reads, and what it may
say about the items it did not read."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader, RandomSampler, TensorDataset

from nbtrainer import Trainer


def _trainer(outputs: int = 3, **kw: Any) -> Trainer:
    model = torch.nn.Linear(4, outputs)
    return Trainer(model, torch.nn.CrossEntropyLoss(), "sgd", lr=0.1, progress=False, run_store=False, **kw)


def test_a_sampler_with_replacement_has_every_item_checked() -> None:
    """RandomSampler(replacement=True) can draw any item of the dataset, as a WeightedRandomSampler can: the check
    read one epoch's draws (about 63% of the items, each once) and a NaN in the others went unsaid."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(1000, 4, generator=g), torch.randint(0, 3, (1000,), generator=g)
    x[[10, 500, 900], 1] = float("nan")
    ds = TensorDataset(x, y)
    loader = DataLoader(ds, batch_size=64, sampler=RandomSampler(ds, replacement=True))
    report = _trainer().check_data(loader)
    assert report.splits["train"]["items"] == 1000, report.splits["train"]
    (nan,) = report.by_kind("nonfinite")
    assert nan.data["indices"] == [10, 500, 900], nan.message


def test_a_class_the_training_sample_missed_is_not_said_to_be_lacking_from_training() -> None:
    """max_items reads a sample of the training items: a rare class absent from the sample is not absent from the
    training data. The check said 'validation has classes 3 that the training data lacks' as a problem (a red light)
    when two training items had class 3; a full pass (max_items=None) is what can say a class is lacking."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(2000, 4, generator=g), torch.randint(0, 3, (2000,), generator=g)
    y[[7, 1500]] = 3  # a rare class, left out of the seeded sample of 500
    val = (torch.randn(200, 4, generator=g), torch.randint(0, 4, (200,), generator=g))
    sampled = _trainer(4).check_data((x, y), val, max_items=500)
    assert 3 not in sampled.splits["train"]["classes"]  # the premise: the sample missed it
    for problem in sampled.by_kind("unseen_class"):
        assert problem.level == "warning" and "the training data lacks" not in problem.message, problem.message
        assert "max_items=None" in problem.message, problem.message
    assert _trainer(4).check_data((x, y), val).by_kind("unseen_class") == []
    y[[7, 1500]] = 0  # now training really lacks class 3: the full pass says so, as a problem
    (lacking,) = _trainer(4).check_data((x, y), val).by_kind("unseen_class")
    assert lacking.level == "problem" and "the training data lacks" in lacking.message


class _Stream(torch.utils.data.IterableDataset):
    """A stream written class by class, as files of one class each are read one after the other."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(120, 4, generator=g), torch.arange(3).repeat_interleave(40)

    def __iter__(self) -> Any:
        return zip(self.x, self.y, strict=True)


def test_the_first_items_of_a_stream_are_said_to_be_a_sample() -> None:
    """max_items on a stream (or a list of batches) reads its first batches up to that many items: the report said
    'train 64 items' as if that were the whole split, and from those first items that class 2 was never a training
    label (missing_class) and that training lacked the validation's class 2 (unseen_class, a problem)."""
    stream = _Stream()
    val = (stream.x[:30].clone(), torch.full((30,), 2))
    batches = [(stream.x[i : i + 16], stream.y[i : i + 16]) for i in range(0, 120, 16)]
    for train in (DataLoader(stream, batch_size=16), batches):
        report = _trainer().check_data(train, val, max_items=50)
        assert report.splits["train"]["sampled"], report.summary()
        assert "first 64" in report.summary() and any("first 64" in n for n in report.notes), str(report)
        assert report.by_kind("missing_class") == [], str(report)
        assert [p.level for p in report.by_kind("unseen_class")] == ["warning"], str(report)
        whole = _trainer().check_data(train, val, max_items=120)  # the stream's every item: not a sample
        assert not whole.splits["train"]["sampled"] and whole.by_kind("unseen_class") == [], str(whole)
