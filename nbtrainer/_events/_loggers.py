"""Loggers: ``TensorBoardLogger`` and ``CSVLogger``, callbacks fed by the trainer's events.

Per-step values (loss, LR) come from ``on_refresh``'s ``progress.step_points`` (each param group's LR from its
``step_group_lrs``): already on the host, read by the trainer's throttled refresh, so a logger adds no device sync
and nothing to the per-step path.
Epoch values (train and validation) come from ``on_epoch_end``; LR and accumulation changes made from the
panel (or ``set_lr`` / ``set_grad_accum_steps``) from ``on_control``. Only rank 0 writes under DDP.

Each fresh fit writes into a folder of its own under the logger's folder, ``version_0``, ``version_1``... (as
Lightning's loggers do), so runs that share a folder (an Optuna sweep's trials, two notebooks) never replace each
other's files; ``fit_more`` and a resume write into the folder of the run they continue (a checkpoint names it).
"""

from __future__ import annotations

import csv
import io
import math
import os
import re
import weakref
from typing import TYPE_CHECKING, Any

from nbtrainer._events._callbacks import Callback
from nbtrainer._events._history import group_lr_key, group_lr_keys, group_lrs_of
from nbtrainer._events._stream import CONTROL_KINDS, Progress
from nbtrainer._optional import require
from nbtrainer._report._format import format_value

if TYPE_CHECKING:
    from nbtrainer._events._trainer_view import TrainerView

__all__ = ["CSVLogger", "TensorBoardLogger"]


def _scalars(logs: dict[str, Any]) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in logs.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))
    }


_VERSION = re.compile(r"version_(\d+)")


def _claim_version(root: str, owner: str) -> str:
    """Create ``root/version_N``, ``N`` one past the highest there, and return its name."""
    try:
        os.makedirs(root, exist_ok=True)
        n = max((int(m.group(1)) for name in os.listdir(root) if (m := _VERSION.fullmatch(name))), default=-1) + 1
        while True:
            try:
                os.mkdir(os.path.join(root, f"version_{n}"))
                return f"version_{n}"
            except FileExistsError:  # another process (a parallel trial) took it between the listing and the mkdir
                n += 1
    except OSError as exc:
        raise PermissionError(
            f"{owner} cannot create a run folder in {root!r}: {exc.strerror}. Pass a writable folder."
        ) from exc


class _RunFolders(Callback):
    """A logger's run folders under ``root``: a new ``version_N`` for each fresh fit, the folder of the run it
    continues for ``fit_more`` and a resume. A checkpoint holds the folder's name (``state_dict``), so a resume in
    another process finds it; kept per trainer, because one logger may serve several (a sweep, a notebook)."""

    def __init__(self) -> None:
        self.version: str | None = None
        self._resumed: str | None = None  # the folder named by the checkpoint being resumed
        self._folders: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()

    @property
    def _root(self) -> str:
        raise NotImplementedError

    @property
    def run_dir(self) -> str | None:
        """The folder of the current (or last) run; ``None`` before the first fit."""
        return None if self.version is None else os.path.join(self._root, self.version)

    def _open_run(self, trainer: TrainerView) -> bool:
        """Choose the fit's folder (``self.version``); True when the fit continues a folder that exists."""
        resumed, self._resumed = self._resumed, None
        if not trainer.fresh_fit:
            version = resumed or self._folders.get(trainer)
            if version is not None and os.path.isdir(os.path.join(self._root, version)):
                self.version = self._folders[trainer] = version
                return True
        # A fresh fit, or a continuation whose folder is gone or unknown (a checkpoint written without this
        # logger): a new folder, which the caller fills with what the resumed History holds.
        self.version = self._folders[trainer] = _claim_version(self._root, type(self).__name__)
        return False

    def state_dict(self) -> dict[str, Any]:
        return {} if self.version is None else {"version": self.version}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        version = state.get("version")
        self._resumed = version if isinstance(version, str) and _VERSION.fullmatch(version) else None


class TensorBoardLogger(_RunFolders):
    """Write TensorBoard event files: per-step loss and LR, every epoch value, mid-run LR / accumulation changes.

    Tags (the x axis is the optimizer step everywhere): ``step/loss``, ``step/lr`` (param group 0's; with several
    groups also ``step/lr_group1``..., each group's LR); ``epoch/<key>`` for every
    value of the epoch's History row at the epoch's last step (``epoch/loss``, ``epoch/val_loss``,
    ``epoch/val_acc``, ``epoch/epoch``...); ``control/lr`` and ``control/grad_accum_steps`` where they change
    (the accumulation also at the start), with a ``control`` text entry. Event files are flushed at each
    epoch end and closed when the fit ends.

    One folder per run, under ``log_dir``: each fresh fit creates the next ``version_N`` (``version_0``,
    ``version_1``...), so fits that share ``log_dir`` (a sweep's trials, a second ``fit``) each keep their curves,
    and ``%tensorboard --logdir <log_dir>`` shows them side by side. ``fit_more`` and a resume (``resume_from=``,
    also in a new process: the checkpoint names the folder) append to the run's own folder, and TensorBoard
    discards the events of its earlier files after the step the fit starts from (``purge_step``), so a resume after
    a crash shows no duplicates. A resume whose folder is unknown (a checkpoint saved without this logger) gets a
    new folder that starts with the checkpoint's History.

    Args:
        log_dir: the folder of the runs; ``%tensorboard --logdir <log_dir or its parent>`` shows them.

    Attributes:
        log_dir: the folder given.
        version: the current (or last) run's folder name, ``"version_0"``...; ``None`` before the first fit.
        run_dir: ``log_dir/version``, where the event files of that run are.

    Raises:
        ImportError: ``tensorboard`` is not installed (``pip install "nbtrainer[tensorboard]"``).

    Example:
        >>> from nbtrainer import TensorBoardLogger
        >>> logger = TensorBoardLogger("runs/digits")  # Trainer(..., callbacks=[logger]); runs/digits/version_0
    """

    def __init__(self, log_dir: str | os.PathLike[str] = "runs") -> None:
        require(
            "tensorboard", "TensorBoardLogger", 'pip install "nbtrainer[tensorboard]"  (or: pip install tensorboard)'
        )
        super().__init__()
        self.log_dir = os.fspath(log_dir)
        self._writer: Any = None
        self._epoch_due: tuple[int, dict[str, Any]] | None = None  # an epoch row not written yet

    @property
    def _root(self) -> str:
        return self.log_dir

    def on_fit_start(self, trainer: TrainerView) -> None:
        if not trainer.is_global_zero:
            return
        from torch.utils.tensorboard import SummaryWriter

        step = trainer.global_step
        continuing = self._open_run(trainer)
        # A continuation keeps what its checkpoint had seen (up to `step`, the last epoch's values included) and
        # drops what a crashed process logged after it.
        self._writer = SummaryWriter(self.run_dir, purge_step=step + 1 if continuing and step else None)
        if step and not continuing:
            self._write_history(trainer.history, step)
        self._writer.add_scalar("control/grad_accum_steps", trainer.grad_accum_steps, step)

    def _write_history(self, history: Any, upto: int) -> None:
        """A resumed run's History up to its step ``upto``, into a new folder, as the fits before wrote it."""
        steps = history.steps
        points = [p for p in zip(steps["step"], steps["loss"], steps["lr"], strict=False) if p[0] <= upto]
        self._write_steps(points, group_lrs_of(steps))
        for row in history.epochs:
            for key, value in _scalars(row).items():
                self._writer.add_scalar(f"epoch/{key}", value, int(row.get("steps") or 0))
        for event in history.events:
            if event.get("kind") in CONTROL_KINDS:
                self._write_control(event)

    def _write_steps(self, points: list[tuple[int, float, float]], group_lrs: dict[int, tuple[float, ...]]) -> None:
        writer = self._writer
        for step, loss, lr in points:
            if math.isfinite(loss):
                writer.add_scalar("step/loss", loss, step)
            writer.add_scalar("step/lr", lr, step)
            for i, value in enumerate(group_lrs.get(step, ())[1:], 1):
                if math.isfinite(value):  # NaN: the step had no such group
                    writer.add_scalar(f"step/{group_lr_key(i)}", value, step)

    def on_refresh(self, trainer: TrainerView, progress: Progress) -> None:
        if self._writer is not None:
            self._write_steps(progress.step_points, progress.step_group_lrs)

    def on_control(self, trainer: TrainerView, event: dict[str, Any]) -> None:
        if self._writer is not None and event.get("kind") in CONTROL_KINDS:
            self._write_control(event)

    def _write_control(self, event: dict[str, Any]) -> None:
        step, kind = int(event.get("step") or 0), event["kind"]
        self._writer.add_scalar(f"control/{kind}", float(event["new"]), step)
        change = f"{format_value(kind, event.get('old'))} -> {format_value(kind, event['new'])}"
        self._writer.add_text("control", f"step {step}: {kind} {change}", step)

    def on_epoch_end(self, trainer: TrainerView, epoch: int, logs: dict[str, Any]) -> None:
        if self._writer is None:
            return
        # After every callback has seen the row (LRMonitor adds keys to it), like ModelCheckpoint's saves. A
        # callback that ends the fit from this event (OptunaPruning raises) drops the deferred calls: the row
        # stays due and on_fit_end writes it.
        self._epoch_due = (trainer.global_step, logs)
        trainer.defer(self._write_epoch)

    def _write_epoch(self) -> None:
        due, self._epoch_due = self._epoch_due, None
        if self._writer is None or due is None:
            return
        step, logs = due
        for key, value in _scalars(logs).items():
            self._writer.add_scalar(f"epoch/{key}", value, step)
        self._writer.flush()

    def on_fit_end(self, trainer: TrainerView, history: Any) -> None:
        self._write_epoch()  # the last epoch's row, when the fit ended before its deferred write
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.add_text("status", f"{history.status}" + (f": {history.stop_reason}" if history.stop_reason else ""))
            writer.close()


class CSVLogger(_RunFolders):
    """Write each run as CSV files in a folder of its own under ``dir``: ``epochs.csv``, ``steps.csv``, ``events.csv``.

    * ``epochs.csv``: the History's epoch rows (train and validation values, time, samples/s...),
      rewritten **atomically** at each epoch end (temp file + ``os.replace``): small, its columns can grow
      (validation every n epochs, keys added by callbacks), and a reader never sees half a file.
    * ``steps.csv``: ``step,epoch,loss,lr`` per optimizer step (with several param groups also ``lr_group1``...,
      each group's LR; ``lr`` is group 0's), **append-only**, flushed at each epoch end
      and when the fit ends: it grows with every step, so rewriting it would cost O(steps) each time;
      its columns are fixed, so appending is safe. A resume first drops the rows after the checkpoint's step,
      then writes the checkpoint's steps the file lacks (the rows a killed run had not flushed yet), so the
      file stays contiguous.
    * ``events.csv``: LR / accumulation changes, pauses, ``fit_more`` (``step,epoch,kind,old,new``),
      rewritten atomically when one happens.

    The folder: each fresh fit creates the next ``dir/version_N`` (``version_0``, ``version_1``...), so fits that
    share ``dir`` (a sweep's trials, a second ``fit``) each keep their files. ``fit_more`` and a resume
    (``resume_from=``, also in a new process: the checkpoint names the folder) continue the run's own folder; a resume
    whose folder is unknown (a checkpoint saved without this logger) gets a new one, written from the checkpoint's
    History.

    Values are written in full precision (``repr`` of the float). Only rank 0 writes under DDP.

    Args:
        dir: the folder of the runs (created).

    Attributes:
        dir: the folder given.
        version: the current (or last) run's folder name, ``"version_0"``...; ``None`` before the first fit.
        run_dir: ``dir/version``, the folder of that run's files (``epochs_path``, ``steps_path``,
            ``events_path`` are in it).

    Example:
        >>> from nbtrainer import CSVLogger
        >>> logger = CSVLogger("runs/digits-csv")  # Trainer(..., callbacks=[logger]); runs/digits-csv/version_0
    """

    STEP_FIELDS = ("step", "epoch", "loss", "lr")
    EVENT_FIELDS = ("step", "epoch", "kind", "old", "new")

    def __init__(self, dir: str | os.PathLike[str] = "runs") -> None:
        super().__init__()
        self.dir = os.fspath(dir)
        self._steps: Any = None
        self._writer: Any = None
        self._groups = 0  # the param groups after group 0 that steps.csv has a column for

    @property
    def _root(self) -> str:
        return self.dir

    def _path(self, name: str) -> str:
        folder = self.run_dir
        if folder is None:
            raise RuntimeError(
                f"CSVLogger({self.dir!r}) has written no run yet: each fit writes its files into a new "
                f"{os.path.join(self.dir, 'version_N')} folder. Read the paths once a fit has started."
            )
        return os.path.join(folder, name)

    @property
    def epochs_path(self) -> str:
        return self._path("epochs.csv")

    @property
    def steps_path(self) -> str:
        return self._path("steps.csv")

    @property
    def events_path(self) -> str:
        return self._path("events.csv")

    def on_fit_start(self, trainer: TrainerView) -> None:
        if not trainer.is_global_zero:
            return
        start = trainer.global_step
        written = 0
        if self._open_run(trainer) and start and os.path.exists(self.steps_path):
            # A resume: the rows a killed run wrote after its checkpoint go.
            written, header = self._truncate_steps(start)
            self._groups = max(len(header) - len(self.STEP_FIELDS), 0)  # the file's columns stay
            self._steps = open(self.steps_path, "a", newline="", encoding="utf-8")  # noqa: SIM115 - closed in on_fit_end
        else:
            optimizer = trainer.optimizer
            n = max(len(optimizer.param_groups) if optimizer is not None else 1, 1)
            self._groups = max(n - 1, len(group_lr_keys(trainer.history.steps)))
            self._steps = open(self.steps_path, "w", newline="", encoding="utf-8")  # noqa: SIM115
            groups = [group_lr_key(i) for i in range(1, self._groups + 1)]
            csv.writer(self._steps).writerow([*self.STEP_FIELDS, *groups])
        self._writer = csv.writer(self._steps)
        if start:
            # Rows the killed run had not flushed yet (steps.csv is buffered until an epoch end) died with it,
            # but the checkpoint's History has every step up to `start`: write those after the file's last row.
            self._write_history_steps(trainer.history.steps, after=written, upto=start)
        trainer.history.to_csv(self.epochs_path)
        self._write_events(trainer.history.events)

    def _truncate_steps(self, last: int) -> tuple[int, list[str]]:
        """Drop the rows after step ``last``; returns the last step the file keeps (0: none) and its header."""
        from nbtrainer._atomic import atomic_write_bytes

        with open(self.steps_path, newline="", encoding="utf-8") as fh:
            rows = list(csv.reader(fh))
        kept = rows[:1] + [r for r in rows[1:] if r and _step(r[0]) <= last]
        buf = io.StringIO()
        csv.writer(buf).writerows(kept)
        atomic_write_bytes(self.steps_path, buf.getvalue().encode())
        return max((int(r[0]) for r in kept[1:]), default=0), (rows[0] if rows else [])

    def _rows(self, points: Any, group_lrs: dict[int, tuple[float, ...]]) -> list[tuple[Any, ...]]:
        """``(step, epoch, loss, lr)`` points as rows: full precision, and each param group's LR in its column (empty
        where the step had no such group; a group added after the file began has no column: the History has it)."""
        n = self._groups
        rows = []
        for step, epoch, loss, lr in points:
            lrs = group_lrs.get(step, ()) if n else ()
            groups = (repr(lrs[i]) if i < len(lrs) and math.isfinite(lrs[i]) else "" for i in range(1, n + 1))
            rows.append((step, epoch, repr(loss), repr(lr), *groups))
        return rows

    def _write_history_steps(self, steps: dict[str, list], *, after: int, upto: int) -> None:
        points = zip(steps["step"], steps["epoch"], steps["loss"], steps["lr"], strict=False)
        self._writer.writerows(self._rows([p for p in points if after < p[0] <= upto], group_lrs_of(steps)))
        self._steps.flush()

    def on_refresh(self, trainer: TrainerView, progress: Progress) -> None:
        if self._writer is None or not progress.step_points:
            return
        epoch = progress.epoch
        points = [(step, epoch, loss, lr) for step, loss, lr in progress.step_points]
        self._writer.writerows(self._rows(points, progress.step_group_lrs))

    def on_control(self, trainer: TrainerView, event: dict[str, Any]) -> None:
        if self._writer is not None:
            self._write_events(trainer.history.events)

    def on_epoch_end(self, trainer: TrainerView, epoch: int, logs: dict[str, Any]) -> None:
        if self._writer is None:
            return
        self._steps.flush()

        def write() -> None:  # after every callback has added its keys to the row
            trainer.history.to_csv(self.epochs_path)

        trainer.defer(write)

    def on_fit_end(self, trainer: TrainerView, history: Any) -> None:
        steps, self._steps, self._writer = self._steps, None, None
        if steps is None:
            return
        steps.close()
        history.to_csv(self.epochs_path)
        self._write_events(history.events)

    def _write_events(self, events: list[dict[str, Any]]) -> None:
        # (the epoch table is History.to_csv's; csv writes floats in full, as repr does)
        from nbtrainer._atomic import atomic_write_bytes

        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=list(self.EVENT_FIELDS), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(events)
        atomic_write_bytes(self.events_path, buf.getvalue().encode())


def _step(text: str) -> float:
    """A row's step; a damaged row (a half line of a killed run) sorts after every checkpoint."""
    try:
        return int(text)
    except ValueError:
        return math.inf
