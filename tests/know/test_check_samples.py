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
