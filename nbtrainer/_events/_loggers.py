"""Loggers: ``TensorBoardLogger`` and ``CSVLogger``, callbacks fed by the trainer's events.

Per-step values (loss, LR) come from ``on_refresh``'s ``progress.step_points``: already on the host, read
by the trainer's throttled refresh, so a logger adds no device sync and nothing to the per-step path.
Epoch values (train and validation) come from ``on_epoch_end``; LR and accumulation changes made from the
panel (or ``set_lr`` / ``set_grad_accum_steps``) from ``on_control``. Only rank 0 writes under DDP.
"""

from __future__ import annotations

import csv
import io
import math
import os
from typing import TYPE_CHECKING, Any

from nbtrainer._events._callbacks import Callback
from nbtrainer._events._stream import Progress
from nbtrainer._optional import require
from nbtrainer._report._format import format_value

if TYPE_CHECKING:
    from nbtrainer._events._trainer_view import TrainerView

__all__ = ["CSVLogger", "TensorBoardLogger"]

_CONTROL_KINDS = ("lr", "grad_accum_steps")


def _scalars(logs: dict[str, Any]) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in logs.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))
    }


class TensorBoardLogger(Callback):
    """Write TensorBoard event files: per-step loss and LR, every epoch value, mid-run LR / accumulation changes.

    Tags (the x axis is the optimizer step everywhere): ``step/loss``, ``step/lr``; ``epoch/<key>`` for every
    value of the epoch's History row at the epoch's last step (``epoch/loss``, ``epoch/val_loss``,
    ``epoch/val_acc``, ``epoch/epoch``...); ``control/lr`` and ``control/grad_accum_steps`` where they change
    (the accumulation also at the start), with a ``control`` text entry. Event files are flushed at each
    epoch end and closed when the fit ends.

    One folder per run: a resumed or continued run appends to it, and TensorBoard discards the events of
    earlier files after the step the fit starts from (``purge_step``), so a resume after a crash shows no
    duplicates and a re-run from scratch into the same folder replaces the old curves.

    Args:
        log_dir: the run's folder; ``%tensorboard --logdir <log_dir or its parent>`` shows it.

    Raises:
        ImportError: ``tensorboard`` is not installed (``pip install "nbtrainer[tensorboard]"``).

    Example:
        >>> from nbtrainer import TensorBoardLogger
        >>> logger = TensorBoardLogger("runs/digits")  # Trainer(..., callbacks=[logger])
    """

    def __init__(self, log_dir: str | os.PathLike[str] = "runs") -> None:
        require(
            "tensorboard", "TensorBoardLogger", 'pip install "nbtrainer[tensorboard]"  (or: pip install tensorboard)'
        )
        self.log_dir = os.fspath(log_dir)
        self._writer: Any = None
        self._epoch_due: tuple[int, dict[str, Any]] | None = None  # an epoch row not written yet

    def on_fit_start(self, trainer: TrainerView) -> None:
        if not trainer.is_global_zero:
            return
        from torch.utils.tensorboard import SummaryWriter

        step = trainer.global_step
        # A resume keeps what its checkpoint had seen (up to `step`, the last epoch's values included);
        # a fresh run (step 0) replaces whatever an earlier run left in this folder.
        self._writer = SummaryWriter(self.log_dir, purge_step=step + 1 if step else 0)
        self._writer.add_scalar("control/grad_accum_steps", trainer.grad_accum_steps, step)

    def on_refresh(self, trainer: TrainerView, progress: Progress) -> None:
        writer = self._writer
        if writer is None:
            return
        for step, loss, lr in progress.step_points:
            if math.isfinite(loss):
                writer.add_scalar("step/loss", loss, step)
            writer.add_scalar("step/lr", lr, step)

    def on_control(self, trainer: TrainerView, event: dict[str, Any]) -> None:
        if self._writer is None or event.get("kind") not in _CONTROL_KINDS:
            return
        step = int(event.get("step") or 0)
        self._writer.add_scalar(f"control/{event['kind']}", float(event["new"]), step)
        kind = event["kind"]
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


class CSVLogger(Callback):
    """Write a run as CSV files in ``dir``: ``epochs.csv``, ``steps.csv`` and ``events.csv``.

    * ``epochs.csv``: the History's epoch rows (train and validation values, time, samples/s...),
      rewritten **atomically** at each epoch end (temp file + ``os.replace``): small, its columns can grow
      (validation every n epochs, keys added by callbacks), and a reader never sees half a file.
    * ``steps.csv``: ``step,epoch,loss,lr`` per optimizer step, **append-only**, flushed at each epoch end
      and when the fit ends: it grows with every step, so rewriting it would cost O(steps) each time;
      its columns are fixed, so appending is safe. A resume first drops the rows after the checkpoint's step,
      then writes the checkpoint's steps the file lacks (the rows a killed run had not flushed yet), so the
      file stays contiguous.
    * ``events.csv``: LR / accumulation changes, pauses, ``fit_more`` (``step,epoch,kind,old,new``),
      rewritten atomically when one happens.

    Values are written in full precision (``repr`` of the float). Only rank 0 writes under DDP.

    Args:
        dir: the folder (created).

    Example:
        >>> from nbtrainer import CSVLogger
        >>> logger = CSVLogger("runs/digits-csv")  # Trainer(..., callbacks=[logger])
    """

    STEP_FIELDS = ("step", "epoch", "loss", "lr")
    EVENT_FIELDS = ("step", "epoch", "kind", "old", "new")

    def __init__(self, dir: str | os.PathLike[str] = "runs") -> None:
        self.dir = os.fspath(dir)
        self._steps: Any = None
        self._writer: Any = None

    @property
    def epochs_path(self) -> str:
        return os.path.join(self.dir, "epochs.csv")

    @property
    def steps_path(self) -> str:
        return os.path.join(self.dir, "steps.csv")

    @property
    def events_path(self) -> str:
        return os.path.join(self.dir, "events.csv")

    def on_fit_start(self, trainer: TrainerView) -> None:
        if not trainer.is_global_zero:
            return
        try:
            os.makedirs(self.dir, exist_ok=True)
        except OSError as exc:
            raise PermissionError(
                f"CSVLogger cannot create {self.dir!r}: {exc.strerror}. Pass a writable folder."
            ) from exc
        start = trainer.global_step
        written = 0
        if start and os.path.exists(self.steps_path):
            # A resume: the rows a killed run wrote after its checkpoint go.
            written = self._truncate_steps(start)
            self._steps = open(self.steps_path, "a", newline="", encoding="utf-8")  # noqa: SIM115 - closed in on_fit_end
        else:
            self._steps = open(self.steps_path, "w", newline="", encoding="utf-8")  # noqa: SIM115
            csv.writer(self._steps).writerow(self.STEP_FIELDS)
        self._writer = csv.writer(self._steps)
        if start:
            # Rows the killed run had not flushed yet (steps.csv is buffered until an epoch end) died with it,
            # but the checkpoint's History has every step up to `start`: write those after the file's last row.
            self._write_history_steps(trainer.history.steps, after=written, upto=start)
        trainer.history.to_csv(self.epochs_path)
        self._write_events(trainer.history.events)

    def _truncate_steps(self, last: int) -> int:
        """Drop the rows after step ``last``; returns the last step the file keeps (0: none)."""
        from nbtrainer._atomic import atomic_write_bytes

        with open(self.steps_path, newline="", encoding="utf-8") as fh:
            rows = list(csv.reader(fh))
        kept = rows[:1] + [r for r in rows[1:] if r and _step(r[0]) <= last]
        buf = io.StringIO()
        csv.writer(buf).writerows(kept)
        atomic_write_bytes(self.steps_path, buf.getvalue().encode())
        return max((int(r[0]) for r in kept[1:]), default=0)

    def _write_history_steps(self, steps: dict[str, list], *, after: int, upto: int) -> None:
        rows = zip(steps["step"], steps["epoch"], steps["loss"], steps["lr"], strict=False)
        self._writer.writerows(
            (step, epoch, repr(loss), repr(lr)) for step, epoch, loss, lr in rows if after < step <= upto
        )
        self._steps.flush()

    def on_refresh(self, trainer: TrainerView, progress: Progress) -> None:
        if self._writer is None or not progress.step_points:
            return
        epoch = progress.epoch
        self._writer.writerows((step, epoch, repr(loss), repr(lr)) for step, loss, lr in progress.step_points)

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
