"""No host-device sync per step: host reads of tensors during a fit do not grow with the number of steps.

On CPU there is no device to wait for, so we count the calls that WOULD sync on a GPU
(``item``, ``tolist``, ``__bool__``, ``__float__``, ``__int__``, ``cpu``, ``numpy``) during fits of 10 and
of 80 batches: the counts must be equal (they come from per-epoch and per-refresh reads only).
"""

from __future__ import annotations

import pytest
import torch
from conftest import make_classification, make_loader, mlp

from nbtrainer import Trainer

_METHODS = ("item", "tolist", "__bool__", "__float__", "__int__", "cpu", "numpy")


@pytest.fixture
def count_reads(monkeypatch):
    counts = {"n": 0, "where": []}
    for name in _METHODS:
        original = getattr(torch.Tensor, name)

        def wrapper(self, *a, _orig=original, _name=name, **kw):
            counts["n"] += 1
            return _orig(self, *a, **kw)

        monkeypatch.setattr(torch.Tensor, name, wrapper)
    return counts


@pytest.mark.parametrize("precision,accum", [("fp32", 1), ("bf16-mixed", 3)])
def test_reads_do_not_grow_with_steps(count_reads, precision, accum):
    totals = []
    for n_batches in (10, 80):
        x, y = make_classification(n=16 * n_batches)
        model = mlp()
        trainer = Trainer(
            model,
            torch.nn.CrossEntropyLoss(),
            torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
            metrics={"acc": lambda o, t: (o.argmax(1) == t).float().mean()},
            precision=precision,
            grad_accum_steps=accum,
            max_grad_norm=1.0,
            progress=True,
            refresh_interval=3600.0,
        )
        loader = make_loader(x, y, batch_size=16, shuffle=True)
        count_reads["n"] = 0
        trainer.fit(loader, loader, epochs=2)
        totals.append(count_reads["n"])
    assert totals[0] == totals[1], f"host reads grew with the number of steps: {totals}"
    assert totals[0] <= 15 * 2  # per-epoch reads (DataLoader seeds/indices on CPU, flushes, validation)


def test_loggers_and_line_progress_add_no_reads(count_reads, tmp_path):
    """TensorBoardLogger / CSVLogger take per-step values from the refresh (already on the host) and
    ProgressBar's lines print at epoch ends: with them, host reads still do not grow with the steps."""
    from nbtrainer import CSVLogger, ProgressBar, TensorBoardLogger

    totals = []
    for n_batches in (10, 80):
        x, y = make_classification(n=16 * n_batches)
        model = mlp()
        trainer = Trainer(
            model,
            torch.nn.CrossEntropyLoss(),
            torch.optim.SGD(model.parameters(), lr=0.05),
            metrics={"acc": lambda o, t: (o.argmax(1) == t).float().mean()},
            callbacks=[TensorBoardLogger(tmp_path / f"tb{n_batches}"), CSVLogger(tmp_path / f"csv{n_batches}")],
            progress=ProgressBar(mode="lines", heartbeat=3600.0),
            refresh_interval=3600.0,
        )
        loader = make_loader(x, y, batch_size=16, shuffle=True)
        count_reads["n"] = 0
        trainer.fit(loader, loader, epochs=2)
        totals.append(count_reads["n"])
    assert totals[0] == totals[1], f"host reads grew with the number of steps: {totals}"
