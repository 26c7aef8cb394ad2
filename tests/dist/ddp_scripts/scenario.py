"""DDP scenarios for tests/dist/test_distributed.py, run as
``torchrun --standalone --nproc_per_node=2 scenario.py NAME OUTDIR [ARGS...]``.

Each rank writes ``OUTDIR/NAME.rank{r}.json`` (and ``.pt`` weights) for the test to compare with a
single-process reference computed in the test process.
"""

from __future__ import annotations

import io
import json
import os
import sys
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common

from nbtrainer import (
    DDP,
    EarlyStopping,
    ModelCheckpoint,
    Trainer,
    precision_support,
)
from nbtrainer._resume import _checkpoint_io

RANK = int(os.environ["RANK"])


def dump(out: str, name: str, data: dict, weights: dict | None = None) -> None:
    with open(os.path.join(out, f"{name}.rank{RANK}.json"), "w") as fh:
        json.dump(data, fh)
    if weights is not None:
        torch.save(weights, os.path.join(out, f"{name}.rank{RANK}.pt"))


def cpu_state(trainer: Trainer) -> dict:
    return {k: v.detach().cpu().clone() for k, v in trainer.model_state_dict().items()}


class CommCounter:
    """Registers a DDP comm hook at fit start that counts gradient all-reduces (then does the usual one)."""

    def __init__(self) -> None:
        self.calls = 0
        self.last: list[bool] = []

    def on_fit_start(self, trainer: Trainer) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        def hook(state, bucket):
            self.calls += 1
            self.last.append(bool(bucket.is_last()))
            return default_hooks.allreduce_hook(state, bucket)

        ddp = trainer.model
        assert isinstance(ddp, DistributedDataParallel), type(ddp)
        ddp.register_comm_hook(None, hook)


class StopOnRank:
    """Requests a stop at the end of ``epoch`` on one rank only (the others must follow, not hang)."""

    def __init__(self, rank: int, epoch: int) -> None:
        self.rank, self.epoch = rank, epoch

    def on_epoch_end(self, trainer: Trainer, epoch: int, logs: dict) -> None:
        if self.rank == RANK and epoch == self.epoch:
            trainer.request_stop(f"rank {RANK} says stop")


def scenario_parity(out: str, ckpt_dir: str) -> None:
    # Only rank 0 writes: count the checkpoint writes of this rank.
    writes = []
    real_save = _checkpoint_io.save_checkpoint_file

    def counting(path, checkpoint):
        writes.append(os.path.basename(path))
        real_save(path, checkpoint)

    _checkpoint_io.save_checkpoint_file = counting
    # Progress (plain epoch lines: a StringIO is not a TTY): rank 0 only (captured per rank).
    captured = io.StringIO()
    real_stderr, real_stdout, sys.stderr, sys.stdout = sys.stderr, sys.stdout, captured, captured
    try:
        model = common.make_model(0)
        train, val = common.ddp_loaders()
        trainer = Trainer(
            model,
            torch.nn.CrossEntropyLoss(),
            common.sgd(model),
            metrics=common.metrics(),
            seed=common.SAMPLER_SEED,
            progress=True,
            refresh_interval=0.0,
            callbacks=[ModelCheckpoint(ckpt_dir, monitor="val_loss", save_top_k=2, save_last=True)],
        )
        strategy = repr(trainer.strategy)
        history = trainer.fit(train, val, epochs=3)
        evaluated = trainer.evaluate(val)
    finally:
        sys.stderr, sys.stdout = real_stderr, real_stdout
        _checkpoint_io.save_checkpoint_file = real_save
    dump(
        out,
        "parity",
        {
            "strategy": strategy,
            "type": type(trainer.strategy).__name__,
            "device": str(trainer.device),
            "world_size": trainer.strategy.world_size,
            "epochs": history.epochs,
            "status": history.status,
            "evaluate": evaluated,
            "writes": writes,
            "output": captured.getvalue(),
            "steps": trainer.global_step,
            "model_type": type(trainer.model).__name__,
            "ckpt_keys_prefixed": any(k.startswith("module.") for k in trainer.state_dict()["model"]),
        },
        cpu_state(trainer),
    )

    # Gradient accumulation (ragged: 4 micro-batches per rank per epoch, windows of 3 and 1) under no_sync:
    # one all-reduce per optimizer step, counted by a comm hook.
    model = common.make_model(0)
    train, val = common.ddp_loaders()
    counter = CommCounter()
    trainer = Trainer(
        model,
        torch.nn.CrossEntropyLoss(),
        common.sgd(model),
        metrics=common.metrics(),
        seed=common.SAMPLER_SEED,
        progress=False,
        grad_accum_steps=3,
        callbacks=[counter],
    )
    history = trainer.fit(train, val, epochs=2)
    dump(
        out,
        "accum",
        {
            "epochs": history.epochs,
            "steps": trainer.global_step,
            "hook_calls": counter.calls,
            "hook_last": counter.last,
        },
        cpu_state(trainer),
    )
    scenario_manual(out)  # in this launch: one torchrun start fewer
    scenario_tiny_val(out)


def scenario_tiny_val(out: str) -> None:
    """evaluate() and a fit's validation where one rank's share of the set is empty: every rank reports the set's
    loss (rank 1 once left val_loss out of its evaluate, and refused the fit alone, leaving rank 0 waiting)."""
    model = common.make_model(0)
    trainer = Trainer(model, torch.nn.CrossEntropyLoss(), common.sgd(model), metrics=common.metrics(), progress=False)
    evaluated = trainer.evaluate(common.tiny_val())
    train, _ = common.ddp_loaders()
    history = trainer.fit(train, common.tiny_val(), epochs=1)
    dump(out, "tiny_val", {"evaluate": evaluated, "status": history.status, "epochs": history.epochs})


def scenario_manual(out: str) -> None:
    """training_step= under DDP with accumulation (issue 36): a partial backward per optimizer, each optimizer's
    gradients averaged across ranks once per window."""
    trainer = common.manual_trainer()
    history = trainer.fit(*common.ddp_loaders(), epochs=2)
    dump(out, "manual", {"epochs": history.epochs, "steps": trainer.global_step}, cpu_state(trainer))


def scenario_stop(out: str) -> None:
    # EarlyStopping on a reduced value: lr=0 keeps val_loss constant, patience=1 stops after epoch 2.
    model = common.make_model(0)
    train, val = common.ddp_loaders()
    trainer = Trainer(
        model,
        torch.nn.CrossEntropyLoss(),
        common.sgd(model, lr=0.0),
        progress=False,
        strategy=DDP(timeout=60),
        callbacks=[EarlyStopping("val_loss", patience=1)],
    )
    h1 = trainer.fit(train, val, epochs=10)
    # A stop decided on one rank only (epoch 3, rank 1): shared with any_rank, so nobody hangs.
    model = common.make_model(0)
    trainer = Trainer(
        model, torch.nn.CrossEntropyLoss(), common.sgd(model), progress=False, callbacks=[StopOnRank(rank=1, epoch=3)]
    )
    h2 = trainer.fit(train, val, epochs=10)
    dump(
        out,
        "stop",
        {
            "early": {"epochs": len(h1.epochs), "status": h1.status, "reason": h1.stop_reason},
            "one_rank": {"epochs": len(h2.epochs), "status": h2.status, "reason": h2.stop_reason},
        },
    )


def _resume_trainer(model: torch.nn.Module, callbacks=()) -> Trainer:
    return Trainer(
        model,
        torch.nn.CrossEntropyLoss(),
        common.sgd(model),
        metrics=common.metrics(),
        progress=False,
        callbacks=list(callbacks),
    )


def scenario_resume(out: str, ckpt_dir: str, single_ckpt: str) -> None:
    # Per-rank RNG matters here: dropout, and each rank seeded differently (no trainer seed).
    # The first Trainer of a process probes precision support with torch.randn (cached afterwards): probe
    # now, so that run A (the first) and run C draw the same random numbers after their manual_seed.
    precision_support("cpu")
    train, val = common.ddp_loaders()
    torch.manual_seed(1000 + RANK)
    a = _resume_trainer(
        common.make_model(None, dropout=0.3), [ModelCheckpoint(ckpt_dir, save_top_k=0, save_last=True, every_n_steps=3)]
    )
    ha = a.fit(train, val, epochs=3, max_steps=6)  # stops mid-epoch 2 (4 steps per epoch)
    # The uninterrupted run from the same start.
    torch.manual_seed(1000 + RANK)
    c = _resume_trainer(common.make_model(None, dropout=0.3))
    hc = c.fit(train, val, epochs=3)
    # Resumed from the mid-epoch checkpoint, after scrambling this process's RNG and weights.
    torch.manual_seed(77 + 5 * RANK)
    b = _resume_trainer(common.make_model(None, dropout=0.3))
    hb = b.fit(train, val, epochs=3, resume_from=os.path.join(ckpt_dir, "last.ckpt"))
    ckpt = torch.load(os.path.join(ckpt_dir, "last.ckpt"), weights_only=True)
    ranks = ckpt.get("ranks") or []
    dump(
        out,
        "resume",
        {
            "a": {"status": ha.status, "steps": a.global_step},
            "c": hc.epochs,
            "b": hb.epochs,
            "b_status": hb.status,
            "ckpt_ranks": len(ranks),
            "ckpt_samples": [r["loop"]["samples"] for r in ranks],
            "ckpt_batch": ckpt["loop"]["batch"],
            "ckpt_epoch": ckpt["loop"]["epoch"],
        },
        {"b": cpu_state(b), "c": cpu_state(c)},
    )
    # A single-process checkpoint (end of epoch 2, written by the test) continued under DDP to epoch 3.
    train, val = common.ddp_loaders()
    model = common.make_model(5)
    d = Trainer(
        model,
        torch.nn.CrossEntropyLoss(),
        common.sgd(model),
        metrics=common.metrics(),
        progress=False,
        seed=common.SAMPLER_SEED,
    )
    hd = d.fit(train, val, epochs=3, resume_from=single_ckpt)
    dump(out, "from_single", {"epochs": hd.epochs, "status": hd.status}, cpu_state(d))


def scenario_fetch(out: str) -> None:
    """The batched fetch under DDP (issue 14): the trainer's DistributedSampler read by the batched fetch,
    the loader's own per-sample iterator, and fit((x, y), batch_size=...): the same weights on each rank."""
    weights, logs = {}, {}
    train_ds, val_ds = common.train_set(), common.val_set()
    for mode in ("fast", "per-sample", "arrays"):
        model = common.make_model(0, dropout=0.2)  # dropout: any RNG draw made differently shows
        trainer = Trainer(
            model,
            torch.nn.CrossEntropyLoss(),
            common.sgd(model),
            seed=common.SAMPLER_SEED,
            progress=False,
            fast_fetch=mode != "per-sample",
        )
        if mode == "arrays":
            history = trainer.fit(train_ds.tensors, val_data=val_ds.tensors, batch_size=common.BATCH, epochs=3)
        else:
            train, val = common.ddp_loaders()
            history = trainer.fit(train, val, epochs=3)
        weights[mode] = cpu_state(trainer)
        logs[mode] = {"loss": [r["loss"] for r in history.epochs], "batches": trainer.progress.batches}
    dump(out, "fetch", logs, weights)


class FailOnRank1:
    """Raises on rank 1 alone, mid-epoch, while rank 0 goes on into the next gradient all-reduce."""

    def on_train_batch_end(self, trainer: Trainer, batch_idx: int, loss: torch.Tensor) -> None:
        if RANK == 1 and trainer.global_step == 3:
            raise RuntimeError("failure raised on rank 1 only")


def scenario_failures(out: str) -> None:
    """What goes wrong on one rank: a NaN loss (skip / stop decided on every rank alike), a training share with no
    batch (refused on every rank), then an exception on rank 1 only, which must end the launch with its error."""
    data: dict = {}
    for mode in ("skip", "stop"):
        trainer = common.nan_trainer(mode)
        history = trainer.fit(torch.utils.data.DataLoader(common.nan_data(), batch_size=4), epochs=2)
        w = cpu_state(trainer)
        data[mode] = {
            "status": history.status,
            "reason": history.stop_reason,
            "steps": trainer.global_step,
            "skipped": trainer.run_state.loop_state.skipped_steps,
            "finite": all(bool(torch.isfinite(v).all()) for v in w.values()),
            "weights": {k: v.tolist() for k, v in w.items()},
        }
    trainer = common.nan_trainer("raise")
    try:  # 12 samples: 6 per rank, fewer than one batch of 8
        twelve = torch.utils.data.Subset(common.nan_data(), range(12))
        trainer.fit(torch.utils.data.DataLoader(twelve, batch_size=8, drop_last=True), epochs=1)
        data["empty"] = ""
    except ValueError as exc:
        data["empty"] = str(exc)
    dump(out, "failures", data)
    dist.barrier()  # both ranks' results are written before rank 1 fails
    trainer = common.nan_trainer("raise", callbacks=[FailOnRank1()])
    finite = torch.utils.data.Subset(common.nan_data(), range(6, 32))
    trainer.fit(torch.utils.data.DataLoader(finite, batch_size=2), epochs=3)


def main() -> None:
    name, out, *args = sys.argv[1:]
    scenarios: dict[str, Callable[..., None]] = {
        "parity": scenario_parity,
        "stop": scenario_stop,
        "resume": scenario_resume,
        "fetch": scenario_fetch,
        "failures": scenario_failures,
    }
    scenarios[name](out, *args)
    dist.barrier()


if __name__ == "__main__":
    main()
