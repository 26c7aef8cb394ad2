"""Seeding: two runs with the same seed give identical losses on CPU; different seeds differ."""

from __future__ import annotations

import torch
from conftest import make_classification

from nbtrainer import Trainer, seed_everything


def _run(seed, deterministic=True):
    seed_everything(seed)
    x, y = make_classification(n=256)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16, shuffle=True)
    model = torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.Dropout(0.3), torch.nn.ReLU(), torch.nn.Linear(32, 3))
    trainer = Trainer(
        model,
        torch.nn.CrossEntropyLoss(),
        torch.optim.Adam(model.parameters(), 1e-2),
        seed=seed,
        deterministic=deterministic,
        progress=False,
    )
    h = trainer.fit(loader, epochs=3)
    return h.steps["loss"], [p.detach().clone() for p in model.parameters()]


def test_same_seed_same_losses_and_weights():
    a_loss, a_w = _run(123)
    b_loss, b_w = _run(123)
    c_loss, _ = _run(7)
    assert a_loss == b_loss  # exact, step by step (shuffle order and dropout included)
    assert all(torch.equal(p, q) for p, q in zip(a_w, b_w, strict=True))
    assert a_loss != c_loss


def test_deterministic_flag_sets_torch_switches():
    _run(1, deterministic=True)
    assert torch.are_deterministic_algorithms_enabled()
    assert torch.backends.cudnn.deterministic
