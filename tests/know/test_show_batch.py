"""show_batch's text form: each item with its target, whatever the number of features."""

from __future__ import annotations

import torch

from nbtrainer import show_batch


def test_a_wide_table_row_keeps_its_target_in_the_text() -> None:
    x, y = torch.randn(6, 64), torch.tensor([3, 1, 4, 1, 5, 9])  # digits-like: 64 features per row
    lines = str(show_batch((x, y), 3, classes=[f"digit {d}" for d in range(10)])).splitlines()[1:]
    assert [line.rsplit(" -> ", 1)[-1] for line in lines] == ["digit 3", "digit 1", "digit 4"]
    assert all(line.count("=") == 8 and ", ..." in line for line in lines)  # the first 8 features, then more
    narrow = str(show_batch((torch.randn(4, 3), torch.arange(4)), 2, feature_names=["a", "b", "c"]))
    assert narrow.splitlines()[1].startswith("a=") and narrow.splitlines()[1].endswith(" -> 0")
