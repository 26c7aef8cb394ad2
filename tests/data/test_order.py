"""The data order: nbtrainer's shuffling generator is lent to the user's loader for an epoch at a time, so the
loader is left as it was and re-running a training cell trains the same weights."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from nbtrainer import Trainer


def _loader(**kwargs: Any) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(96, 8, generator=g), torch.randint(0, 3, (96,), generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True, **kwargs)


def _fit(loader: DataLoader, **kwargs: Any) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    trainer = Trainer(model, nn.CrossEntropyLoss(), "sgd", lr=0.1, seed=0, progress=False, run_store=False, **kwargs)
    trainer.fit(loader, epochs=2)
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("fast_fetch", [True, False])
def test_rerunning_a_cell_trains_the_same_weights_and_leaves_the_loader_as_it_was(
    deterministic: bool, fast_fetch: bool
) -> None:
    loader = _loader()
    first = _fit(loader, deterministic=deterministic, fast_fetch=fast_fetch)
    assert loader.sampler.generator is None and loader.generator is None  # type: ignore[attr-defined]
    assert loader.worker_init_fn is None
    again = _fit(loader, deterministic=deterministic, fast_fetch=fast_fetch)  # the same cell, run again
    for a, b in zip(first, again, strict=True):
        assert torch.equal(a, b)
    fresh = _fit(_loader(), deterministic=deterministic, fast_fetch=fast_fetch)  # a loader never trained on
    for a, b in zip(first, fresh, strict=True):
        assert torch.equal(a, b)


def test_a_generator_of_the_users_own_is_kept_and_drives_the_order() -> None:
    mine = torch.Generator().manual_seed(7)
    loader = _loader(generator=mine)
    _fit(loader)
    assert loader.generator is mine and loader.sampler.generator is mine  # type: ignore[attr-defined]
    # the sampler shuffled with the user's generator: its state moved, as in a hand loop
    assert not torch.equal(mine.get_state(), torch.Generator().manual_seed(7).get_state())


def test_the_loader_is_given_back_when_the_fit_fails() -> None:
    loader = _loader()

    def boom(model: nn.Module, batch: object) -> torch.Tensor:
        raise RuntimeError("boom")

    torch.manual_seed(0)
    model = nn.Linear(8, 3)
    trainer = Trainer(model, nn.CrossEntropyLoss(), "sgd", lr=0.1, compute_loss=boom, progress=False, run_store=False)
    with pytest.raises(RuntimeError, match="boom"):
        trainer.fit(loader, epochs=1)
    assert loader.sampler.generator is None and loader.generator is None  # type: ignore[attr-defined]
