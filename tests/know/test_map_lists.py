"""DataMap over a list of ready batches (numbered in order, the map growing as it numbers them): each item's column
is its own, whatever the batches' sizes and however often the map reduces."""

from __future__ import annotations

import torch

from nbtrainer import DataMap, Trainer


def test_an_item_numbered_one_past_the_maps_room_gets_its_own_column() -> None:
    """Batches of 10, 1 and 10 items, reduced after each step: the map had room for 10 items (and one column where
    rows that do not count land) when item 10 came, and item 10 was written into that column: it took the ignored
    labels' rows as visits (8 visits in 2 epochs), and lost its own when the map grew."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(21, 4, generator=g), torch.randint(0, 3, (21,), generator=g)
    y[:3] = -100  # ignored by the loss: not visits of any item
    batches = [(x[:10], y[:10]), (x[10:11], y[10:11]), (x[11:], y[11:])]
    dm = DataMap(flush_rows=1)
    trainer = Trainer(torch.nn.Linear(4, 3), torch.nn.CrossEntropyLoss(), "sgd", lr=0.1, callbacks=[dm],
                      progress=False, run_store=False)  # fmt: skip
    trainer.fit(batches, epochs=2)
    visits = dm.visits.tolist()
    assert visits == [0] * 3 + [2] * 18, f"item 10: {visits[10]} visits of 2; all: {visits}"
    assert dm.given[10].item() == y[10].item()
