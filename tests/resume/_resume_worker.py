"""A training run that the exact-resume tests and ``bench/crash_soak.py`` start as a subprocess.

The run is small but has everything exact resume must carry: a shuffled DataLoader (with or without
its own generator), dropout (so the torch RNG matters), numpy/python RNG draws in a callback, Adam +
OneCycleLR stepping per optimizer step, ``grad_accum_steps=2`` with a ragged last window, a
torchmetrics metric and a callable metric, validation, EarlyStopping and ModelCheckpoint
(``every_n_steps``, ``save_last``). Optionally fp16-mixed on CPU (GradScaler state).

Usage::

    python tests/resume/_resume_worker.py --dir CKPTS --out OUT.pt [--seed S] [--kill-at M] [--resume]
    python tests/resume/_resume_worker.py --reference --seeds 0,1,2 --out-dir D   # uninterrupted runs
    python tests/resume/_resume_worker.py --jobs '[{"seed": 0, "dir": ..., "out": ..., "resume": true}, ...]'

``--kill-at M`` SIGKILLs the process itself right after micro-batch ``M`` (counted over the whole
run); ``--step-sleep`` slows every micro-batch down so an outside killer lands at random moments.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import time

import numpy as np
import torch

torch.set_num_threads(1)

from nbtrainer import EarlyStopping, ModelCheckpoint, Trainer  # noqa: E402

N_SAMPLES, BATCH, EPOCHS = 200, 16, 3  # 13 batches per epoch (last one has 8 samples) -> ragged last window


class Chaos:
    """Draws from python's and numpy's RNG every batch (a stand-in for augmentations)."""

    def __init__(self) -> None:
        self.draws: list[float] = []

    def on_train_batch_start(self, trainer, batch, batch_idx):
        self.draws.append(random.random() + float(np.random.rand()))


class Killer:
    def __init__(self, kill_at: int | None, sleep: float) -> None:
        self.kill_at, self.sleep, self.n = kill_at, sleep, 0

    def on_fit_start(self, trainer):
        print("fit-started", flush=True)  # bench/crash_soak.py times its kill from here

    def on_train_batch_end(self, trainer, batch_idx, loss):
        self.n += 1
        if self.sleep:
            time.sleep(self.sleep)
        if self.kill_at is not None and self.n >= self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)


def make_data(seed: int):
    g = torch.Generator().manual_seed(1000 + seed)
    x = torch.randn(N_SAMPLES, 10, generator=g)
    y = (x @ torch.randn(10, 3, generator=g)).argmax(1)
    xv = torch.randn(48, 10, generator=g)
    yv = (xv @ torch.randn(10, 3, generator=g)).argmax(1)
    return x, y, xv, yv


def build(
    seed: int,
    dirpath: str,
    *,
    precision: str = "fp32",
    every: int = 2,
    kill_at: int | None = None,
    sleep: float = 0.0,
    own_generator: bool | None = None,
    checkpoint: bool = True,
):
    import torchmetrics

    x, y, xv, yv = make_data(seed)
    own_generator = (seed % 2 == 0) if own_generator is None else own_generator
    gen = torch.Generator().manual_seed(seed) if own_generator else None
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, y), batch_size=BATCH, shuffle=True, generator=gen
    )
    val = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xv, yv), batch_size=16)
    torch.manual_seed(seed)  # the initial weights (the resumed run overwrites them from the checkpoint)
    model = torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.Dropout(0.3), torch.nn.ReLU(), torch.nn.Linear(32, 3))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    callbacks: list = [Chaos(), EarlyStopping("val_loss", patience=50)]
    if checkpoint:
        callbacks.append(ModelCheckpoint(dirpath, monitor="val_acc", save_top_k=2, every_n_steps=every, save_last=True))
    callbacks.append(Killer(kill_at, sleep))
    trainer = Trainer(
        model,
        torch.nn.CrossEntropyLoss(),
        opt,
        grad_accum_steps=2,
        precision=precision,
        metrics={
            "acc": torchmetrics.Accuracy(task="multiclass", num_classes=3),
            "err": lambda o, t: (o.argmax(1) != t).float().mean(),
        },
        seed=seed,
        deterministic=True,
        progress=False,
        callbacks=callbacks,
        device=os.environ.get("NBT_RESUME_DEVICE", "cpu"),  # bench/crash_soak.py --device cuda
        refresh_interval=0.0 if seed % 3 == 0 else 0.05,
    )
    trainer.set_scheduler(
        torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=5e-2, total_steps=trainer.total_steps(loader, EPOCHS))
    )
    return trainer, loader, val


def result(trainer, history) -> dict:
    es = next(cb for cb in trainer.callbacks.callbacks if isinstance(cb, EarlyStopping))
    return {
        "model": {k: v.clone() for k, v in trainer.model.state_dict().items()},
        "optimizer": trainer.optimizer.state_dict(),
        "scheduler": trainer.scheduler.state_dict(),
        "scaler": trainer.scaler.state_dict() if trainer.scaler is not None else None,
        "history": json.loads(history.to_json()),
        "early_stopping": {"best": es.best, "wait": es.wait, "best_epoch": es.best_epoch},
        "rng": torch.get_rng_state(),
        "global_step": trainer.global_step,
        "chaos": next(cb for cb in trainer.callbacks.callbacks if isinstance(cb, Chaos)).draws,
    }


def run(seed: int, dirpath: str, out: str, *, resume: bool = False, **kw) -> None:
    trainer, loader, val = build(seed, dirpath, **kw)
    history = trainer.fit(loader, val, epochs=EPOCHS, resume_from="last" if resume else None)
    torch.save(result(trainer, history), out)


def run_job(job: dict) -> None:
    """One run of a ``--jobs`` / ``--killed-jobs`` list (``{seed, dir, out, resume, precision, every, kill_at}``)."""
    run(
        job["seed"],
        job["dir"],
        job["out"],
        resume=job.get("resume", False),
        precision=job.get("precision", "fp32"),
        every=job.get("every", 2),
        kill_at=job.get("kill_at"),
    )


def _killed_jobs(jobs: list[dict]) -> int:
    """Each job in a forked child that must die by SIGKILL (a real kill: no cleanup, no atexit). This process
    runs no torch op before forking, so the children start as a fresh interpreter with the imports done."""
    # what every child's run imports, imported once here (imports only: no torch op, no thread pool before the
    # fork): torchmetrics for the metrics, torch._dynamo (with sympy) which building any torch optimizer imports,
    # the single-device strategy. Each child imported them again, ~2.5 s quiet and much more on a loaded machine.
    import torch._dynamo  # noqa: F401
    import torchmetrics  # noqa: F401

    import nbtrainer._dist._ddp  # noqa: F401

    for job in jobs:
        pid = os.fork()
        if pid == 0:  # the child: run until the Killer callback sends SIGKILL to itself
            try:
                run_job(job)
            except BaseException:
                import traceback

                traceback.print_exc()
                os._exit(3)
            os._exit(0)  # not killed: the parent reports it
        _, status = os.waitpid(pid, 0)
        if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL):
            print(f"job {job} was not killed by SIGKILL (wait status {status})", file=sys.stderr, flush=True)
            return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--dir")
    p.add_argument("--out")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seeds", default="")
    p.add_argument("--out-dir")
    p.add_argument("--reference", action="store_true")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--kill-at", type=int)
    p.add_argument("--every", type=int, default=2)
    p.add_argument("--precision", default="fp32")
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument(
        "--jobs",
        help="JSON list of runs ({seed, dir, out, resume, precision, kill_at}) done in turn "
        "in this process (each fit is seeded or restores every RNG, so they are independent)",
    )
    p.add_argument(
        "--killed-jobs",
        help="JSON list of runs each killed by SIGKILL at its kill_at, each in a child forked from this process in "
        "turn (torch is imported once, not once per kill: under load those imports were most of the test's time)",
    )
    a = p.parse_args(argv)
    if a.killed_jobs:
        return _killed_jobs(json.loads(a.killed_jobs))
    if a.jobs:
        for job in json.loads(a.jobs):
            run_job(job)
        return 0
    if a.reference:
        for s in [int(v) for v in a.seeds.split(",") if v]:
            run(
                s,
                os.path.join(a.out_dir, f"ckpt-ref-{s}"),
                os.path.join(a.out_dir, f"ref-{s}.pt"),
                precision=a.precision,
                every=a.every,
            )
        return 0
    run(
        a.seed,
        a.dir,
        a.out,
        resume=a.resume,
        precision=a.precision,
        every=a.every,
        kill_at=a.kill_at,
        sleep=a.step_sleep,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
