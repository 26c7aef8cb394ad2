"""The mistakes a newcomer makes in the first ten minutes, and what they are told (issue 58). Each message names the
problem and the fix before anything trains. (The magic, the CLI and compare_strategies' papercuts are tested beside
their modules: tests/shell/test_magics.py, tests/shell/test_cli.py, tests/compare/test_compare.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import mlp
from torch import nn

from nbtrainer import Trainer


def _data() -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.randn(8, 10), torch.randint(0, 3, (8,)))] * 2


# -- an unknown keyword names the closest valid one -------------------------------------------------------------


@pytest.mark.parametrize(
    "keyword,closest",
    [("grad_accumulation_steps", "grad_accum_steps"), ("ui_intervall", "ui_interval"), ("epoch", "epochs")],
)
def test_an_unknown_keyword_to_the_panel_names_the_closest_valid_one(keyword: str, closest: str) -> None:
    from nbtrainer import TrainerWidget

    with pytest.raises(TypeError, match=rf"unexpected keyword argument '{keyword}'; did you mean '{closest}'\?"):
        options: dict[str, Any] = {keyword: 2}
        TrainerWidget(mlp(), nn.CrossEntropyLoss(), "adamw", _data(), **options)


# -- a dict batch whose label entry has another name --------------------------------------------------------------


class _TakesX(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = mlp()

    def forward(self, x: torch.Tensor, cls: Any = None) -> torch.Tensor:
        return self.net(x)


class _OnlyX(_TakesX):
    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]  # the narrower signature is the case
        return self.net(x)


@pytest.mark.parametrize("model", [_OnlyX, _TakesX], ids=["the model refuses the entry", "no targets reach the loss"])
def test_a_dict_batch_without_a_known_label_name_says_target_keys_first_and_what_was_looked_for(model: Any) -> None:
    batch = {"x": torch.randn(8, 10), "cls": torch.randint(0, 3, (8,))}
    trainer = Trainer(model(), nn.CrossEntropyLoss(), "adamw", progress=False, run_store=False)
    with pytest.raises((TypeError, ValueError)) as info:
        trainer.fit([batch], epochs=1)
    message = str(info.value)
    assert "labels, label, targets, target, y" in message, message
    fixes = [message.find(fix) for fix in ("target_keys=", "compute_loss=", "num_inputs=")]
    assert fixes[0] >= 0 and all(f < 0 or fixes[0] < f for f in fixes[1:]), message  # target_keys= comes first
    assert trainer.global_step == 0
    # and the fix it names works
    trainer = Trainer(model(), nn.CrossEntropyLoss(), "adamw", progress=False, run_store=False, target_keys="cls")
    assert trainer.fit([batch], epochs=1).status == "finished"


# -- DDP(sync_batchnorm=True) without CUDA ------------------------------------------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for a machine without CUDA")
def test_sync_batchnorm_without_cuda_is_refused_when_the_trainer_is_built() -> None:
    import torch.distributed as dist

    from nbtrainer import DDP

    model = nn.Sequential(nn.Linear(10, 16), nn.BatchNorm1d(16), nn.Linear(16, 3))
    with pytest.raises(ValueError, match=r"sync_batchnorm=True\) needs CUDA: torch's SyncBatchNorm runs on GPUs only"):
        Trainer(model, nn.CrossEntropyLoss(), "adamw", strategy=DDP(sync_batchnorm=True), run_store=False)
    assert not (dist.is_available() and dist.is_initialized())  # refused before any process group was made
    page = (Path(__file__).resolve().parent.parent / "docs" / "distributed.md").read_text(encoding="utf-8")
    assert "GPUs only" in page and "refuses it" in page


# -- print(runs.table()) in a terminal ---------------------------------------------------------------------------


def test_printing_the_runs_table_shows_the_table(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from nbtrainer import Runs

    ids = []
    for lr in (1e-2, 3e-3):
        trainer = Trainer(
            mlp(), nn.CrossEntropyLoss(), "adamw", lr=lr, progress=False, run_store=str(tmp_path / "r.db")
        )
        trainer.fit(_data(), _data(), epochs=1)
        ids.append(trainer.run_id)
    print(Runs(str(tmp_path / "r.db")).table())
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "RunTable(2 runs)"
    assert lines[1].split()[:3] == ["id", "name", "status"] and "best_val_loss" in lines[1]
    rows = {line.split()[0]: line for line in lines[2:]}
    assert set(rows) == set(ids)
    assert "1.00e-2" in rows[ids[0]] and "3.00e-3" in rows[ids[1]] and "finished" in rows[ids[0]]


# -- a head replaced after the optimizer was built ---------------------------------------------------------------


def test_trainable_parameters_no_optimizer_holds_are_refused_before_the_first_step_naming_them() -> None:
    model = mlp()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model[2] = nn.Linear(16, 3)  # the new head: trainable, in no optimizer; it would never change
    with pytest.raises(
        ValueError, match=r"2 trainable parameter tensor\(s\) that no optimizer holds: 2.weight, 2.bias"
    ):
        Trainer(model, nn.CrossEntropyLoss(), optimizer, progress=False, run_store=False)
    # the fix it names: the optimizer built after the change (or by name) trains the new head
    trainer = Trainer(model, nn.CrossEntropyLoss(), "adamw", lr=1e-2, progress=False, run_store=False)
    head = model[2]
    assert isinstance(head, nn.Linear)
    before = head.weight.detach().clone()
    trainer.fit(_data(), epochs=1)
    assert not torch.equal(before, head.weight)


def test_with_trainable_the_parameters_no_optimizer_holds_are_a_warning_naming_them() -> None:
    model = mlp()
    optimizer = torch.optim.AdamW(model[0].parameters(), lr=1e-2)  # the body only, on purpose
    with pytest.warns(UserWarning, match=r"no optimizer holds: 2.weight, 2.bias"):
        trainer = Trainer(
            model, nn.CrossEntropyLoss(), optimizer, trainable=["0.*", "2.*"], progress=False, run_store=False
        )
    assert trainer.fit(_data(), epochs=1).status == "finished"
