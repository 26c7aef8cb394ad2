"""The Event that ends a long call from another thread (``plan_memory(cancel=)``, ``check_data(cancel=)``,
``lr_find(stop=)``): anything else is refused the same way by all three, before any work (no batch read, no weight
moved)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from conftest import make_classification, mlp

from nbtrainer import Trainer, plan_memory


def test_each_long_call_refuses_a_stop_that_is_not_an_event_before_any_work() -> None:
    x, y = make_classification(n=64)
    read: list[int] = []

    class Watched(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(x)

        def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
            read.append(i)
            return x[i], y[i]

    model = mlp()
    before = [p.detach().clone() for p in model.parameters()]
    trainer = Trainer(model, torch.nn.CrossEntropyLoss(), "sgd", lr=0.1, progress=False, run_store=False)
    loader = torch.utils.data.DataLoader(Watched(), batch_size=16)
    calls: list[tuple[str, Any]] = [
        ("check_data(cancel=...)", lambda bad: trainer.check_data(loader, cancel=bad)),
        ("lr_find(stop=...)", lambda bad: trainer.lr_find(loader, steps=8, stop=bad)),
        ("plan_memory(cancel=...)", lambda bad: plan_memory(model, (x[:16], y[:16]), budget_gb=1.0, cancel=bad)),
    ]
    for name, call in calls:
        for bad in (True, "stop", 1.0):
            with pytest.raises(TypeError) as err:
                call(bad)
            assert str(err.value).startswith(f"{name} takes a threading.Event, got ")
            assert type(bad).__name__ in str(err.value) and "from another thread" in str(err.value)
    assert read == []  # refused before the first batch
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
