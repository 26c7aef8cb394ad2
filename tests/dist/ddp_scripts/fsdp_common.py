"""The model and trainers shared by the FSDP scenarios (``fsdp_scenario.py``, under torchrun) and their
single-process references (tests/dist/test_fsdp.py). The data is DDP's (``common``)."""

from __future__ import annotations

from typing import Any

import common
import torch

WIDTH = 32


class Block(torch.nn.Module):
    """A residual MLP block: the repeated unit FSDP shards on its own (like a transformer layer)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.fc(x))


def make_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(common.D, WIDTH),
        torch.nn.ReLU(),
        torch.nn.Sequential(Block(), Block(), Block()),
        torch.nn.Linear(WIDTH, common.CLASSES),
    )


def sgd(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.1)


def adamw(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.01)


# name -> (optimizer, Trainer options)
CASES: dict[str, tuple[Any, dict[str, Any]]] = {
    "sgd": (sgd, {}),
    "adamw": (adamw, {"grad_accum_steps": 3, "max_grad_norm": 0.5}),  # ragged windows (4 micro-batches), clipping
    "bf16": (sgd, {"precision": "bf16-mixed"}),
}
EPOCHS = {"sgd": 3, "adamw": 2, "bf16": 1}


def make_trainer(case: str, strategy: str, seed: int = 0, **extra: Any):
    from nbtrainer import Trainer

    optimizer, options = CASES[case]
    model = make_model(seed)
    return Trainer(
        model,
        torch.nn.CrossEntropyLoss(),
        optimizer(model),
        metrics=common.metrics(),
        seed=common.SAMPLER_SEED,
        progress=extra.pop("progress", False),
        strategy=strategy,
        **options,
        **extra,
    )


def uneven_val() -> torch.utils.data.DataLoader:
    """21 samples in batches of 5: 11 and 10 per rank, i.e. 3 and 2 DataLoader batches."""
    return torch.utils.data.DataLoader(common.make_data(21, 2), batch_size=5)
