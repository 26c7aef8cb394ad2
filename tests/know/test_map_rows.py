"""``classify``, the data map's per-row arithmetic, against the textbook formulas: the label's softmax probability, the
margin to the strongest other class and that class, on logits large enough to overflow a naive exp, and rows with a
NaN or an infinity left uncounted."""

from __future__ import annotations

import math

import torch

from nbtrainer._know._map_rows import classify


def _reference(logits: torch.Tensor, label: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    p = logits.double().softmax(1).gather(1, label[:, None])[:, 0]
    chosen = logits.gather(1, label[:, None])[:, 0]
    best_other, other = logits.scatter(1, label[:, None], -math.inf).max(1)
    return p, chosen - best_other, other


def test_probability_margin_and_strongest_other_class_match_the_formulas() -> None:
    g = torch.Generator().manual_seed(0)
    for rows, classes, scale in ((500, 10, 3.0), (64, 2, 1.0), (40, 1000, 5.0), (200, 7, 300.0)):
        logits = torch.randn(rows, classes, generator=g) * scale  # scale 300: exp() of a raw logit overflows
        label = torch.randint(0, classes, (rows,), generator=g)
        p_ref, margin_ref, other_ref = _reference(logits, label)
        got_label, valid, p, margin, other = classify("classification", False, logits.clone(), label)
        assert got_label.tolist() == label.tolist() and bool(valid.all())
        torch.testing.assert_close(p.double(), p_ref, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(margin, margin_ref)
        assert other.tolist() == other_ref.tolist()


def test_rows_with_a_nan_or_an_infinity_are_not_counted_and_leave_the_others_alone() -> None:
    logits = torch.tensor(
        [
            [2.0, 1.0, 0.0],
            [math.nan, 1.0, 0.0],  # a NaN in another class's column
            [1.0, math.inf, 0.0],  # +inf for another class
            [math.inf, 1.0, 0.0],  # +inf for the label
            [-math.inf, -math.inf, -math.inf],  # nothing finite
            [0.5, -math.inf, 0.0],  # -inf for another class: a finite margin, a finite probability
        ]
    )
    label = torch.zeros(6, dtype=torch.long)
    _, valid, p, margin, other = classify("classification", False, logits.clone(), label)
    assert valid.tolist() == [True, False, False, False, False, True]
    p_ref, margin_ref, other_ref = _reference(logits[[0, 5]], label[[0, 5]])
    torch.testing.assert_close(p[[0, 5]].double(), p_ref)
    torch.testing.assert_close(margin[[0, 5]], margin_ref)
    assert other[[0, 5]].tolist() == other_ref.tolist() == [1, 2]


def test_labels_outside_the_outputs_are_not_counted() -> None:
    logits = torch.randn(4, 3, generator=torch.Generator().manual_seed(1))
    label = torch.tensor([0, 3, -100, 2])
    _, valid, p, _, _ = classify("classification", False, logits.clone(), label)
    assert valid.tolist() == [True, False, False, True]
    assert bool(torch.isfinite(p).all())


def test_ties_give_the_first_strongest_class_on_both_layouts() -> None:
    """Up to 12 classes a CPU reduces across a (classes, rows) copy, above that along the rows: both name the first
    of the tied strongest other classes, as ``max`` does, and give the textbook values (logits drawn from 3 values,
    so most rows tie)."""
    g = torch.Generator().manual_seed(2)
    for classes in (1, 2, 3, 5, 10, 12, 13, 40):
        for dtype in (torch.float32, torch.float64):
            logits = torch.randint(-1, 2, (300, classes), generator=g).to(dtype)
            label = torch.randint(0, classes, (300,), generator=g)
            p_ref, margin_ref, other_ref = _reference(logits, label)
            _, valid, p, margin, other = classify("classification", False, logits.clone(), label)
            assert bool(valid.all()) == (classes > 1), classes  # one class: no other class, no finite margin
            if classes > 1:
                torch.testing.assert_close(p.double(), p_ref)
                torch.testing.assert_close(margin, margin_ref)
                assert other.tolist() == other_ref.tolist(), classes
