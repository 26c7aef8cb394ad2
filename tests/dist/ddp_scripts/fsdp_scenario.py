"""FSDP2 scenarios for tests/dist/test_fsdp.py, run as
``torchrun --standalone --nproc_per_node=2 fsdp_scenario.py NAME OUTDIR [ARGS...]``.

Several checks per launch (a launch costs ~14 s on 2 cores). Each rank writes ``OUTDIR/NAME.rank{r}.json``
(and ``.pt`` weights, gathered in full) for the test to compare with single-process references.
"""

from __future__ import annotations

import io
import json
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common
import fsdp_common as fc

from nbtrainer import FSDP, EarlyStopping, History, ModelCheckpoint, Trainer
from nbtrainer._resume import _checkpoint_io

RANK = int(os.environ["RANK"])


def dump(out: str, name: str, data: dict, weights: dict | None = None) -> None:
    with open(os.path.join(out, f"{name}.rank{RANK}.json"), "w") as fh:
        json.dump(data, fh)
    if weights is not None:
        torch.save(weights, os.path.join(out, f"{name}.rank{RANK}.pt"))


def _bytes(t: torch.Tensor) -> tuple[int, int]:
    """(bytes this rank holds, bytes of the whole tensor)."""
    local = t.to_local() if isinstance(t, DTensor) else t
    return local.numel() * local.element_size(), t.numel() * t.element_size()


def memory(trainer: Trainer) -> dict:
    params = [_bytes(p) for p in trainer.model.parameters()]
    assert trainer.optimizer is not None
    state = [_bytes(v) for s in trainer.optimizer.state.values() for k, v in s.items() if k != "step"]
    return {
        "param_local": sum(a for a, _ in params),
        "param_full": sum(b for _, b in params),
        "optim_local": sum(a for a, _ in state),
        "optim_full": sum(b for _, b in state),
        "dtensor": all(isinstance(p, DTensor) for p in trainer.model.parameters()),
    }


class StopOnRank:
    """Requests a stop at the end of ``epoch`` on one rank only (the others must follow, not hang)."""

    def __init__(self, rank: int, epoch: int) -> None:
        self.rank, self.epoch = rank, epoch

    def on_epoch_end(self, trainer: Trainer, epoch: int, logs: dict) -> None:
        if self.rank == RANK and epoch == self.epoch:
            trainer.request_stop(f"rank {RANK} says stop")


class GradSync:
    """After each micro-batch: whether the sharded gradients exist yet. A micro-step without gradient sync
    leaves them unset (gradients accumulate unsharded, no reduce-scatter); the window's last one sets them."""

    def __init__(self) -> None:
        self.after_batch: list[bool] = []

    def on_train_batch_end(self, trainer: Trainer, batch_idx: int, loss: torch.Tensor) -> None:
        self.after_batch.append(any(p.grad is not None for p in trainer.model.parameters()))


def scenario_main(out: str, ckpt_dir: str) -> None:
    results: dict = {}
    weights: dict = {}
    # SGD, with progress (rank 0 prints plain lines) and a full ModelCheckpoint (rank 0 writes)
    writes: list[str] = []
    real_save = _checkpoint_io.save_checkpoint_file

    def counting(path, checkpoint):
        writes.append(os.path.basename(path))
        real_save(path, checkpoint)

    _checkpoint_io.save_checkpoint_file = counting
    captured = io.StringIO()
    real_stderr, real_stdout, sys.stderr, sys.stdout = sys.stderr, sys.stdout, captured, captured
    try:
        trainer = fc.make_trainer(
            "sgd", "fsdp", progress=True, callbacks=[ModelCheckpoint(ckpt_dir, monitor="val_loss", save_last=True)]
        )
        train, val = common.ddp_loaders()
        history = trainer.fit(train, val, epochs=fc.EPOCHS["sgd"])
    finally:
        sys.stderr, sys.stdout = real_stderr, real_stdout
        _checkpoint_io.save_checkpoint_file = real_save
    try:
        trainer.evaluate([b for b, _ in zip(val, range(3), strict=False)])  # 3 batches for 2 ranks: refused
        refused = ""
    except ValueError as exc:
        refused = str(exc)
    # 3 samples, batch_size=1: shares of 2 and 1, and 2 batches each would be needed: refused on both ranks (only
    # the rank with the smaller share refused, and the other waited in its first forward)
    small = torch.utils.data.Subset(common.val_set(), range(3))
    try:
        trainer.evaluate(torch.utils.data.DataLoader(small, batch_size=1))
        small_refused = ""
    except ValueError as exc:
        small_refused = str(exc)
    results["sgd"] = {
        "strategy": repr(trainer.strategy),
        "units": trainer.strategy.units,
        "epochs": history.epochs,
        "status": history.status,
        "evaluate": trainer.evaluate(val),
        "uneven": trainer.evaluate(fc.uneven_val()),
        "predict": trainer.predict(val).tolist(),  # every rank runs every batch (forwards are collectives)
        "list_refused": refused,
        "small_refused": small_refused,
        "writes": writes,
        "output": captured.getvalue(),
        "memory": memory(trainer),
    }
    weights["sgd"] = trainer.model_state_dict()

    # AdamW with ragged accumulation windows and clipping; its end state is the 2 -> 1 -> 2 checkpoint
    synced = GradSync()
    trainer = fc.make_trainer("adamw", "fsdp", callbacks=[synced])
    train, val = common.ddp_loaders()
    history = trainer.fit(train, val, epochs=fc.EPOCHS["adamw"])
    trainer.save_checkpoint(os.path.join(out, "adamw.ckpt"))
    results["adamw"] = {
        "epochs": history.epochs,
        "memory": memory(trainer),
        "steps": trainer.global_step,
        "synced": synced.after_batch,
    }
    weights["adamw"] = trainer.model_state_dict()

    # bf16 through MixedPrecisionPolicy: what the blocks compute with, what the loss sees
    trainer = fc.make_trainer("bf16", "fsdp")
    seen: dict = {}
    block = trainer.model[2][0].fc

    def record(key: str, value: torch.dtype) -> None:  # hooks return None: they observe, never replace
        seen.setdefault(key, str(value))

    block.register_forward_pre_hook(lambda m, args: record("param", m.weight.dtype))
    trainer.model.register_forward_hook(lambda m, args, output: record("output", output.dtype))
    train, val = common.ddp_loaders()
    history = trainer.fit(train, val, epochs=fc.EPOCHS["bf16"])
    stored = {str(p.dtype) for p in trainer.model.parameters()}
    results["bf16"] = {"epochs": history.epochs, "seen": seen, "stored": sorted(stored)}
    weights["bf16"] = trainer.model_state_dict()

    # Stopping agrees across ranks: EarlyStopping on a reduced value (lr=0: val_loss flat, patience 1 stops
    # after epoch 2), and a stop requested at epoch 3 on rank 1 only (shared at epoch end, nobody hangs).
    trainer = fc.make_trainer("sgd", "fsdp", callbacks=[EarlyStopping("val_loss", patience=1)])
    trainer.optimizer.param_groups[0]["lr"] = 0.0
    early = trainer.fit(*common.ddp_loaders(), epochs=10)
    trainer = fc.make_trainer("sgd", "fsdp", callbacks=[StopOnRank(rank=1, epoch=3)])
    one_rank = trainer.fit(*common.ddp_loaders(), epochs=10)
    results["stop"] = {
        "early": [len(early.epochs), early.status],
        "one_rank": [len(one_rank.epochs), one_rank.status, one_rank.stop_reason],
    }
    dump(out, "main", results, weights)


def _fit_with(callbacks: list, resume: str | None = None) -> tuple[Trainer, History]:
    trainer = fc.make_trainer("adamw", "fsdp", seed=7 if resume else 0, callbacks=callbacks)
    train, val = common.ddp_loaders()
    trainer.grad_accum_steps = 1  # 4 optimizer steps per epoch
    history = trainer.fit(train, val, epochs=2, resume_from=resume)
    return trainer, history


def _checkpoints(ckpt_dir: str, **options: Any) -> list:
    """A full and a sharded ModelCheckpoint, in ``ckpt_dir``/full and ``ckpt_dir``/sharded."""
    return [
        ModelCheckpoint(os.path.join(ckpt_dir, kind), save_top_k=0, sharded=kind == "sharded", **options)
        for kind in ("full", "sharded")
    ]


class KillAt:
    """SIGKILLs this process at the first batch after optimizer step ``step`` (whose checkpoints are written):
    a crash in the middle of an epoch, with no cleanup of any kind."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer: Trainer, batch: object, batch_idx: int) -> None:
        if trainer.global_step >= self.step:
            os.kill(os.getpid(), signal.SIGKILL)


def scenario_killed(out: str, ckpt_dir: str) -> None:
    # Checkpoints every 3 optimizer steps; killed after step 6, in the middle of epoch 2 (4 steps per epoch).
    _fit_with([*_checkpoints(ckpt_dir, every_n_steps=3), KillAt(6)])
    raise AssertionError("KillAt(6) did not kill the process")


def scenario_resume(out: str, ckpt_dir: str, single_ckpt: str) -> None:
    results: dict = {}
    weights: dict = {}
    # A single-process checkpoint (written by the test from the FSDP one) continued under FSDP.
    trainer = fc.make_trainer("adamw", "fsdp", seed=5)
    train, val = common.ddp_loaders()
    history = trainer.fit(train, val, epochs=4, resume_from=single_ckpt)
    results["from_single"] = {"epochs": history.epochs, "status": history.status}
    weights["from_single"] = trainer.model_state_dict()

    # The killed run (scenario_killed) resumed by fresh trainers (other initial weights), from its full and
    # from its sharded checkpoint, against the uninterrupted run.
    uninterrupted, hu = _fit_with([])
    weights["uninterrupted"] = uninterrupted.model_state_dict()
    results["uninterrupted"] = hu.epochs
    for kind in ("full", "sharded"):
        directory = os.path.join(ckpt_dir, kind)
        listing = sorted(os.listdir(directory))  # as the kill left it
        saved = torch.load(os.path.join(ckpt_dir, "full", "last.ckpt"), weights_only=True)["loop"]
        again, h2 = _fit_with([*_checkpoints(ckpt_dir), KillAt(10**9)], resume=os.path.join(directory, "last.ckpt"))
        results[kind] = {
            "saved_at": [saved["global_step"], saved["epoch"], saved["batch"]],
            "epochs": h2.epochs,
            "status": h2.status,
            "listing": listing,
            "last_is_dir": os.path.isdir(os.path.join(directory, "last.ckpt")),
        }
        weights[kind] = again.model_state_dict()
    dump(out, "resume", results, weights)


def main() -> None:
    name, out, *args = sys.argv[1:]
    scenarios: dict[str, Callable[..., None]] = {
        "main": scenario_main,
        "killed": scenario_killed,
        "resume": scenario_resume,
    }
    assert FSDP is not None
    scenarios[name](out, *args)
    dist.barrier()


if __name__ == "__main__":
    main()
