"""The run store and MLflowLogger: their cost on training, and how fast a big store reads.

Part 1, overhead: the tiny MLP of ``overhead.py`` (32-64-10, batch 32, 3,000 steps, one epoch per round) trained
with ``run_store=False`` (nothing recorded: the baseline), with the SQLite run store (a file), with the
in-memory session store (the default) and with ``MLflowLogger`` on a ``sqlite:///`` URI (store off), in
interleaved rounds in one process (``_rounds.interleaved``). Reported per variant: the median wall time of
``fit`` (its end included, where the file store is flushed; MLflow's thread finishes after ``fit`` returns) and
the median CPU time of the whole process from the start of ``fit`` until MLflow has the whole run (every thread:
the store's writer and MLflow's included), each as a ratio to the baseline. On a shared, loaded machine the
CPU ratio is the one that resolves a few percent; the wall ratio there mostly measures the neighbours.

Part 2, reading: a store of ``--runs`` runs of ``--steps`` steps each (plus 10 epoch rows per run), written
directly in the recorder's schema; then the time of ``Runs(path).table()`` on a fresh open, and of overlays of
10 runs (``plot("loss")``: per-step, 10 x steps points decimated; ``plot("val_loss")``: epoch values).

    python bench/runs.py                     # both parts
    python bench/runs.py --part overhead --rounds 11
    python bench/runs.py --part read --runs 1000 --steps 10000 --db /tmp/big_runs.db
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import tempfile
import time
import uuid
import warnings

import torch
from _models import tiny_mlp
from _rounds import interleaved, machine_line


def _data(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(0)
    return [(torch.randn(32, 32), torch.randint(0, 10, (32,))) for _ in range(steps)]


def overhead(rounds: int, steps: int, folder: str) -> None:
    from nbtrainer import MLflowLogger, Trainer

    data = _data(steps)
    uri = f"sqlite:///{os.path.join(folder, 'mlflow.db')}"
    store = os.path.join(folder, "runs.db")

    def run(name: str) -> tuple[float, float]:
        torch.manual_seed(0)
        model = tiny_mlp()
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        kw: dict = {"run_store": False}
        logger = None
        if name == "sqlite store":
            kw = {"run_store": store}
        elif name == "memory store":
            kw = {"run_store": None}
        elif name == "mlflow":
            logger = MLflowLogger(tracking_uri=uri, experiment="bench")
            kw = {"run_store": False, "callbacks": [logger]}
        trainer = Trainer(model, torch.nn.CrossEntropyLoss(), opt, progress=False, **kw)
        cpu, start = time.process_time(), time.perf_counter()
        trainer.fit(data, epochs=1)
        wall = time.perf_counter() - start
        if logger is not None:  # fit returns at once; MLflow's thread finishes the run: its CPU counts too
            logger.flush()
        return wall, time.process_time() - cpu  # CPU of every thread of the process (writer threads included)

    names = ["off", "sqlite store", "memory store", "mlflow"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        times = interleaved(run, names, rounds)
    print(f"\ntiny MLP 32-64-10, batch 32, {steps:,} steps, {rounds} rounds (+1 warm-up each)\n")
    print("| variant | wall s / fit | wall ratio | CPU s / fit | CPU ratio | per-round CPU ratio min-max |")
    print("|---|---:|---:|---:|---:|---:|")
    base_wall = statistics.median(w for w, _ in times["off"])
    base_cpu = statistics.median(c for _, c in times["off"])
    for n in names:
        wall = statistics.median(w for w, _ in times[n])
        cpu = statistics.median(c for _, c in times[n])
        per = [c / b for (_, c), (_, b) in zip(times[n], times["off"], strict=True)]
        spread = "-" if n == "off" else f"{min(per):.3f}-{max(per):.3f}"
        print(f"| {n} | {wall:.3f} | {wall / base_wall:.3f}x | {cpu:.3f} | {cpu / base_cpu:.3f}x | {spread} |")


def build_store(path: str, runs: int, steps: int) -> None:
    from nbtrainer._runs._store import open_store

    store = open_store(path)
    now = time.time() - runs * 60
    config = json.dumps({"optimizer": "AdamW", "optimizer_params": {"lr": 1e-3}, "batch_size": 32, "precision": "fp32"})
    model = json.dumps({"class": "Sequential", "params": 2762})
    per_epoch = steps // 10
    for r in range(runs):
        run_id = uuid.uuid4().hex[:12]
        lr = 10 ** (-4 + 3 * r / runs)
        losses = [2.3 * math.exp(-s / (steps / 3)) + 0.05 * math.sin(s) for s in range(1, steps + 1)]
        epochs = [
            {
                "epoch": e,
                "loss": losses[e * per_epoch - 1],
                "val_loss": losses[e * per_epoch - 1] * 1.1,
                "steps": e * per_epoch,
            }
            for e in range(1, 11)
        ]
        best = json.dumps({"loss": min(r_["loss"] for r_ in epochs), "val_loss": min(r_["val_loss"] for r_ in epochs)})

        def write(
            conn, run_id=run_id, r=r, lr=lr, losses=losses, epochs=epochs, best=best, per_epoch=per_epoch
        ) -> None:
            conn.execute(
                "INSERT INTO runs (id, name, status, started, ended, heartbeat, config, model, env, best, n_steps, "
                "n_epochs) VALUES (?, ?, 'finished', ?, ?, ?, ?, ?, '{}', ?, ?, 10)",
                (run_id, f"sequential-{r + 1}", now + r * 60, now + r * 60 + 50, now + r * 60 + 50, config, model,
                 best, steps),
            )  # fmt: skip
            conn.executemany(
                "INSERT INTO steps VALUES (?, ?, ?, ?, ?)",
                [(run_id, s, (s - 1) // per_epoch + 1, loss, lr) for s, loss in enumerate(losses, 1)],
            )
            conn.executemany(
                "INSERT INTO epochs VALUES (?, ?, ?)", [(run_id, e["epoch"], json.dumps(e)) for e in epochs]
            )

        store.write([write])
        if (r + 1) % 100 == 0:
            print(f"  wrote {r + 1} runs", file=sys.stderr)


def read(path: str, runs: int, steps: int, repeats: int) -> None:
    from nbtrainer import Runs
    from nbtrainer._runs import _store

    if not os.path.exists(path):
        t0 = time.perf_counter()
        build_store(path, runs, steps)
        print(f"built {path}: {runs} runs x {steps} steps in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    size = os.path.getsize(path)
    table_t, loss_t, val_t = [], [], []
    for _ in range(repeats):
        _store._STORES.clear()  # a fresh open each time: what a new notebook pays
        t0 = time.perf_counter()
        r = Runs(path)
        table = r.table()
        table_t.append(time.perf_counter() - t0)
        chosen = [row["id"] for row in table.rows[:: max(1, len(table.rows) // 10)][:10]]
        t0 = time.perf_counter()
        svg = r.plot("loss", runs=chosen).to_svg()
        loss_t.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        r.plot("val_loss", runs=chosen).to_svg()
        val_t.append(time.perf_counter() - t0)
        assert svg.count("<polyline") == 10 and len(table.rows) >= runs
    print(f"\nstore: {len(table.rows):,} runs x {steps:,} steps, {size / 2**20:,.0f} MiB; best of {repeats}\n")
    print("| operation | best s | median s |")
    print("|---|---:|---:|")
    for name, ts in (
        ("Runs(path).table() (fresh open)", table_t),
        ("plot('loss'), 10 runs, per step", loss_t),
        ("plot('val_loss'), 10 runs, per epoch", val_t),
    ):
        print(f"| {name} | {min(ts):.3f} | {statistics.median(ts):.3f} |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=["overhead", "read", "both"], default="both")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=3000, help="training steps per round (overhead)")
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--store-steps", type=int, default=10000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--db", default=None, help="the big store (built when missing; default: a temp file)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(machine_line(torch.device("cpu")))
    print(f"# load average at start: {os.getloadavg()[0]:.1f} (a shared machine: other agents run beside this)")
    with tempfile.TemporaryDirectory() as folder:
        if args.part in ("overhead", "both"):
            overhead(args.rounds, args.steps, folder)
        if args.part in ("read", "both"):
            db = args.db or os.path.join(folder, "big_runs.db")
            read(db, args.runs, args.store_steps, args.repeats)
        with contextlib.suppress(Exception):
            print(f"# load average at end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
