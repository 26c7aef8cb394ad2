"""RunRecorder: the callback that writes every fit into a run store, fed by the event stream.

It reads what the trainer's History already holds (the history recorder is the first callback, so at each
``on_refresh`` the new steps are there, on the host): no device sync, nothing per step. At each refresh it
hands the steps since the last one to the store's writer thread (:meth:`RunStore.submit` returns at once);
epoch rows go after every callback has seen them (``trainer.defer``, as the loggers do), the final state
and status at ``on_fit_end``, which also waits for the store (the loop is over by then). Rank 0 only.

A ``fit_more`` (or a second ``fit`` that continues the same History) extends the same run; a fresh ``fit``
is a new run.
"""

from __future__ import annotations

import math
import os
import platform
import re
import sqlite3
import time
import uuid
from typing import TYPE_CHECKING, Any

from nbtrainer._data._cleaned import data_changes
from nbtrainer._options import SWITCH
from nbtrainer._report._html import higher_is_better
from nbtrainer._runs._store import RunStore, dumps, open_store, session_store
from nbtrainer._setup._optimizers import Optimizers

if TYPE_CHECKING:
    from nbtrainer._loop._host import LoopHost

__all__ = ["RunRecorder", "resolve_store"]

ENV_VAR = "NBTRAINER_RUNS"


def resolve_store(run_store: Any) -> RunStore | None:
    """``run_store=`` of the Trainer: a path, ``None`` (``$NBTRAINER_RUNS`` or the session's memory) or False."""
    if run_store is False:
        return None
    if run_store is None or run_store is True:
        env = os.environ.get(ENV_VAR)
        return open_store(env) if env else session_store()
    if isinstance(run_store, RunStore):
        return run_store
    if not isinstance(run_store, (str, os.PathLike)):
        raise TypeError(
            f"run_store must be a file path (e.g. 'runs.db'), None (this session's memory) or False (record "
            f"nothing), got {type(run_store).__name__}."
        )
    return open_store(run_store)


def _plain(value: Any) -> Any:
    if isinstance(value, (bool, int, str)) or value is None:
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value)


def _group(opt: Any) -> dict[str, Any]:
    return {k: _plain(v) for k, v in (opt.param_groups[0] if opt.param_groups else {}).items() if k != "params"}


def _optimizer(opt: Any) -> tuple[Any, dict[str, Any]]:
    """The optimizer's class and first group's hyperparameters; for named optimizers (``optimizer={"body": SGD,
    "head": Adam}``) each one's under its name, not the wrapper's class and the first optimizer's group alone."""
    if opt is None:
        return None, {}
    if isinstance(opt, Optimizers):
        return {name: type(o).__name__ for name, o in opt.items()}, {name: _group(o) for name, o in opt.items()}
    return type(opt).__name__, _group(opt)


def _config(trainer: LoopHost) -> dict[str, Any]:
    loop, sched = trainer.run_state.loop, trainer.scheduler
    optimizer, group = _optimizer(trainer.optimizer)
    setup = trainer.model_setup
    loader = getattr(loop, "train_loader", None)
    return {
        "optimizer": optimizer,
        "optimizer_params": group,
        "scheduler": type(sched).__name__ if sched is not None else None,
        "scheduler_interval": trainer.options.step.scheduler_interval,
        "precision": trainer.precision,
        "grad_accum_steps": trainer.grad_accum_steps,
        "max_grad_norm": trainer.max_grad_norm,
        "seed": trainer.options.run.seed,
        "deterministic": trainer.options.run.deterministic,
        "batch_size": getattr(loader, "batch_size", None),
        "epochs": getattr(loop, "epochs", None),
        "max_steps": getattr(loop, "max_steps", None),
        SWITCH.activation_checkpointing: list(setup.checkpointed_blocks),
        "compile": setup.compile_options is not None,
        "channels_last": setup.channels_last,
        "strategy": type(trainer.strategy).__name__,
        "memory": dict(trainer.options.memory.changed()),  # the memory switches in effect (a plan's, if any)
        "memory_budget_gb": trainer.options.budget.budget_gb if trainer.options.budget is not None else None,
        "data": data_changes(loader),  # a cleaned dataset's dropped and relabeled items (DataMap.cleaned)
    }


def _model(trainer: LoopHost) -> dict[str, Any]:
    from nbtrainer._dist._placement import unwrap_model

    counts = trainer.param_counts
    return {
        "class": type(unwrap_model(trainer.model)).__name__,
        "params": counts.total,
        "trainable": counts.trainable,
        "frozen": counts.frozen,
    }


def _environment(trainer: LoopHost) -> dict[str, Any]:
    import torch

    device = trainer.device
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine()
    return {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": str(device),
        "device_name": name,
        "host": platform.node(),
    }


def best_values(epochs: list[dict[str, Any]]) -> dict[str, float]:
    """The best value of every numeric epoch key (max for accuracy-like names, else min)."""
    best: dict[str, float] = {}
    skip = {"epoch", "time", "sample_time", "samples_per_s", "steps", "skipped_steps", "lr"}
    for row in epochs:
        for key, value in row.items():
            if key in skip or key.startswith("lr_") or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if not math.isfinite(value):
                continue
            old = best.get(key)
            if old is None or (value > old if higher_is_better(key) else value < old):
                best[key] = float(value)
    return best


def _checkpoints(trainer: LoopHost) -> list[str]:
    from nbtrainer._events._model_checkpoint import ModelCheckpoint

    paths: list[str] = []
    for checkpoint in ModelCheckpoint.all_in(trainer.callbacks.callbacks):
        paths += [path for path in checkpoint.files() if path not in paths]
    return paths


class RunRecorder:
    """Records each fit of its trainer as a run in a store (attached by the Trainer; see ``run_store=``).

    Attributes:
        store: the :class:`RunStore`, or ``None`` when recording is off (``run_store=False``).
        run_id: the id of the run being (or last) recorded.
        name: the name of the runs recorded from now on (``None``: ``"<model class>-<n>"``, ``n`` one past the
            highest in the store, so a name is never given twice, deletes or not); a name the store holds already
            gets ``" (2)"``, ``" (3)"``... The panel's
            ``TrainerWidget(name=...)`` sets it.

    Example:
        >>> trainer.run_recorder.name = "baseline"  # the next fit is listed as "baseline"  # doctest: +SKIP
    """

    def __init__(self, run_store: Any = None) -> None:
        self.store = resolve_store(run_store)  # opened and checked now: bad paths fail before any step
        self.run_id: str | None = None
        self.name: str | None = None
        self.tags: dict[str, str] = {}
        self._on = False
        self._n_steps = self._n_epochs = self._n_events = self._n_samples = 0
        self._last_step: int | None = None

    # -- the event stream ------------------------------------------------------------------------
    def on_fit_start(self, trainer: LoopHost) -> None:
        store = self.store
        self._on = store is not None and trainer.is_global_zero
        if store is None or not self._on:
            return
        steps = trainer.history.steps["step"]
        continuing = (
            self.run_id is not None
            and trainer.global_step > 0
            and len(steps) >= self._n_steps
            and (self._n_steps == 0 or steps[self._n_steps - 1] == self._last_step)
        )
        now = time.time()
        if continuing:
            run_id = self.run_id

            def resume(conn: sqlite3.Connection) -> None:
                conn.execute(
                    "UPDATE runs SET status='running', ended=NULL, stop_reason=NULL, heartbeat=?, pid=?, host=?, "
                    "proc_start=? WHERE id=?",
                    (now, store.pid, store.host, store.proc_start, run_id),
                )

            store.submit(resume)
        else:
            self.run_id = run_id = uuid.uuid4().hex[:12]
            self._n_steps = self._n_epochs = self._n_events = self._n_samples = 0
            model = _model(trainer)
            row = (
                run_id,
                now,
                now,
                store.pid,
                store.host,
                store.proc_start,
                dumps(_config(trainer)),
                dumps(model),
                dumps(_environment(trainer)),
                dumps(self.tags),
            )
            model_class, given = str(model["class"]).lower(), self.name

            def create(conn: sqlite3.Connection) -> None:
                # One past the highest number in use, not the number of runs: after a delete, a count would give
                # a later run the name of one still in the store.
                if given:  # "baseline", then "baseline (2)", "baseline (3)"...
                    n = _highest(conn, given, re.escape(given) + r"(?: \((\d+)\))?")
                    name = given if n == 0 else f"{given} ({n + 1})"
                else:  # "sequential-1", "sequential-2"...
                    n = _highest(conn, model_class + "-", re.escape(model_class) + r"-(\d+)")
                    name = f"{model_class}-{n + 1}"
                conn.execute(
                    "INSERT INTO runs (id, name, status, started, heartbeat, pid, host, proc_start, config, model, "
                    "env, tags) VALUES (?, ?, 'running', ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (row[0], name, *row[1:]),
                )

            store.submit(create)
        trainer.run_id = run_id
        self._push(trainer)  # a resumed History's steps and epochs, a fit_more's new event

    def on_refresh(self, trainer: LoopHost, progress: Any) -> None:
        if self._on:
            self._push(trainer)

    def on_control(self, trainer: LoopHost, event: dict[str, Any]) -> None:
        if self._on:
            if event.get("kind") == "rollback":
                self._rewind(trainer, int(event["new"]))
            self._push(trainer)

    def _rewind(self, trainer: LoopHost, step: int) -> None:
        """A rollback to ``step``: the History forgot the steps, samples and epoch rows after it, so the store does
        too, and the next push starts at the History's new length (else the steps trained again would be skipped up
        to the old count, and rows rolled back would stay: a run that ends sooner would list them)."""
        store, run_id, history = self.store, self.run_id, trainer.history
        if store is None or run_id is None:
            return
        self._n_steps, self._n_samples = len(history.steps["step"]), len(history.samples)
        self._n_epochs = len(history.epochs)
        self._last_step = history.steps["step"][-1] if self._n_steps else None
        last_epoch = max((int(r.get("epoch", i)) for i, r in enumerate(history.epochs, 1)), default=0)
        best, n_samples = dumps(best_values(history.epochs)), self._n_samples

        def rewind(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM steps WHERE run_id=? AND step>?", (run_id, step))
            conn.execute("DELETE FROM samples WHERE run_id=? AND (step>? OR seq>=?)", (run_id, step, n_samples))
            conn.execute("DELETE FROM epochs WHERE run_id=? AND epoch>?", (run_id, last_epoch))
            conn.execute(  # once per rollback: a recount is fine here
                "UPDATE runs SET n_steps=(SELECT COUNT(*) FROM steps WHERE run_id=?), "
                "n_epochs=(SELECT COUNT(*) FROM epochs WHERE run_id=?), best=? WHERE id=?",
                (run_id, run_id, best, run_id),
            )

        store.submit(rewind)

    def on_health(self, trainer: LoopHost, report: Any) -> None:
        if self._on:  # the History holds it as a "health" event already (its recorder is the first callback)
            self._push(trainer)

    def on_epoch_end(self, trainer: LoopHost, epoch: int, logs: dict[str, Any]) -> None:
        if self._on:
            trainer.defer(lambda: self._push(trainer, epochs=True))  # after LRMonitor & co. add their keys

    def on_fit_end(self, trainer: LoopHost, history: Any) -> None:
        store, run_id = self.store, self.run_id
        if not self._on or store is None or run_id is None:
            return
        self._on = False
        self._push(trainer, epochs=True)
        final = (history.status, history.stop_reason, time.time(), dumps(_checkpoints(trainer)), run_id)

        def finish(conn: sqlite3.Connection) -> None:
            conn.execute(
                "UPDATE runs SET status=?, stop_reason=?, ended=?, heartbeat=ended, checkpoints=? WHERE id=?", final
            )

        store.submit(finish)
        store.flush()  # the loop is over: a reader right after fit() sees the whole run
        store.checkpoint()  # and a copy of the .db file alone holds it (not only <path>-wal)

    # -- writing ---------------------------------------------------------------------------------
    def _push(self, trainer: LoopHost, *, epochs: bool = False) -> None:
        """Queue what the History gained since the last push (no disk I/O on this thread)."""
        store, run_id, history = self.store, self.run_id, trainer.history
        if store is None or run_id is None:
            return
        s = history.steps
        n = len(s["step"])
        steps = list(
            zip(
                s["step"][self._n_steps : n],
                s["epoch"][self._n_steps : n],
                s["loss"][self._n_steps : n],
                s["lr"][self._n_steps : n],
                strict=True,
            )
        )
        if n:
            self._last_step = s["step"][n - 1]
        self._n_steps = n
        events = history.events[self._n_events :]
        first_event = self._n_events
        self._n_events += len(events)
        first_sample, samples = self._n_samples, history.samples[self._n_samples :]
        self._n_samples += len(samples)
        sample_rows = [
            (run_id, first_sample + i, s["step"], s["epoch"], s["name"], s["kind"], s["value"])
            for i, s in enumerate(samples)
        ]
        rows: list[dict[str, Any]] = []
        best = None
        checkpoints = None
        if epochs:
            rows = history.epochs[self._n_epochs :]
            self._n_epochs = len(history.epochs)
            best = dumps(best_values(history.epochs)) if rows else None
            checkpoints = dumps(_checkpoints(trainer)) if rows else None
        now = time.time()
        epoch_rows = [(run_id, int(r.get("epoch", first)), dumps(r)) for first, r in enumerate(rows, 1)]
        event_rows = [(run_id, first_event + i, dumps(e)) for i, e in enumerate(events)]

        def write(conn: sqlite3.Connection) -> None:
            added_steps = added_epochs = 0
            if steps:
                added_steps = _insert_counted(
                    conn,
                    "steps",
                    "step",
                    "INSERT OR REPLACE INTO steps (run_id, step, epoch, loss, lr) VALUES (?, ?, ?, ?, ?)",
                    [(run_id, *p) for p in steps],
                )
            if epoch_rows:
                added_epochs = _insert_counted(
                    conn, "epochs", "epoch", "INSERT OR REPLACE INTO epochs (run_id, epoch, data) VALUES (?, ?, ?)",
                    epoch_rows,
                )  # fmt: skip
            if event_rows:
                conn.executemany("INSERT OR REPLACE INTO events (run_id, seq, data) VALUES (?, ?, ?)", event_rows)
            if sample_rows:
                conn.executemany(
                    "INSERT OR REPLACE INTO samples (run_id, seq, step, epoch, name, kind, value) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?)",
                    sample_rows,
                )
            # Running counts: a recount of the run's rows would cost O(steps) at every refresh (45 ms at 1M steps).
            conn.execute(
                "UPDATE runs SET heartbeat=?, n_steps=n_steps+?, n_epochs=n_epochs+?, best=COALESCE(?, best), "
                "checkpoints=COALESCE(?, checkpoints) WHERE id=?",
                (now, added_steps, added_epochs, best, checkpoints, run_id),
            )

        store.submit(write)


def _highest(conn: sqlite3.Connection, prefix: str, pattern: str) -> int:
    """The highest number among the store's run names that start with ``prefix`` and match ``pattern`` (its group:
    the number; a match without it counts as 1), else 0."""
    rows = conn.execute("SELECT name FROM runs WHERE substr(name, 1, ?) = ?", (len(prefix), prefix))
    numbers = [int(m.group(1) or 1) for (name,) in rows if (m := re.fullmatch(pattern, name, re.ASCII))]
    return max(numbers, default=0)


def _insert_counted(conn: sqlite3.Connection, table: str, key: str, sql: str, rows: list[tuple[Any, ...]]) -> int:
    """Insert (or replace) one run's ``rows`` and return how many are new: the rows in the batch's key range before
    and after, counted on the primary key's range (O(batch), not O(run)). A replaced row (a resumed History pushed
    again) is not counted twice."""
    keys = [row[1] for row in rows]
    # (table and key are this module's own names, never user input)
    count = f"SELECT COUNT(*) FROM {table} WHERE run_id=? AND {key} BETWEEN ? AND ?"
    span = (rows[0][0], min(keys), max(keys))
    before = conn.execute(count, span).fetchone()[0]
    conn.executemany(sql, rows)
    return int(conn.execute(count, span).fetchone()[0] - before)
