"""Progress output as a consumer of the trainer's events: live bars, or plain lines for logs.

``ProgressBar(mode="auto")`` (what ``Trainer(progress=True)`` adds) picks at the start of each fit:

* in a notebook: tqdm's notebook bars (ipywidgets; console bars with one warning when it is missing);
* on a terminal (the bar stream is a TTY): tqdm's console bars;
* otherwise (``python train.py > log 2>&1``, a batch scheduler, CI): **plain lines**, one per epoch
  (``epoch 3/10  loss=0.4123  ...  val_loss=0.3811``), optionally a ``step ...`` heartbeat every N seconds,
  and a final ``training ...`` line; no carriage returns, no escape codes, flushed line by line, so
  ``grep '^epoch' log`` finds every epoch.

Bars are touched only on ``on_refresh`` (already throttled by the trainer) and at epoch boundaries: no
call per step, and no device read of their own. Every number goes through :mod:`nbtrainer._report._format`.
"""

from __future__ import annotations

import math
import os
import sys
import time
import warnings
from typing import TYPE_CHECKING, Any

from nbtrainer._events._frontend import in_notebook
from nbtrainer._events._stream import CONTROL_KINDS, Progress
from nbtrainer._report._format import format_duration, format_lr, format_number, format_value

if TYPE_CHECKING:
    from nbtrainer._events._trainer_view import TrainerView

__all__ = ["MODES", "ProgressBar", "format_logs", "progress_callback", "replan", "start_progress"]

#: ``NBTRAINER_PROGRESS=bars|lines`` overrides ``mode="auto"`` (a pseudo-TTY that is really a log file, or
#: bars wanted in a pipe).
ENV = "NBTRAINER_PROGRESS"
MODES = ("auto", "bars", "lines")

_warned = False


def _tqdm_class() -> Any:
    global _warned
    if in_notebook():
        try:
            import ipywidgets  # noqa: F401
            from tqdm.notebook import tqdm

            return tqdm
        except ImportError:
            if not _warned:
                _warned = True
                warnings.warn(
                    "Notebook progress bars need ipywidgets>=8.1 (`pip install ipywidgets`); "
                    "showing console bars instead.",
                    stacklevel=3,
                )
    from tqdm.std import tqdm

    return tqdm


# Shown after the values a reader looks for first (loss, metrics, validation), in this order.
_TRAILING = ("lr", "time", "sample_time", "samples_per_s", "steps", "skipped_steps")


def format_logs(logs: dict[str, Any], skip: tuple[str, ...] = ("epoch",)) -> str:
    """``key=value`` pairs separated by two spaces, every value through :func:`format_value`; loss, metrics
    and validation values first, then the LR and the bookkeeping (time, samples/s, steps).

    Example:
        >>> format_logs({"epoch": 2, "lr": 1e-3, "loss": 0.5, "val_loss": 0.61, "steps": 12000})
        'loss=0.5  val_loss=0.61  lr=1.00e-3  steps=12,000'
    """
    keys = [k for k in logs if k not in skip]
    keys.sort(key=lambda k: _TRAILING.index(k) + 1 if k in _TRAILING else 0)  # stable: the rest keep their order
    # a duration keeps its unit, without the space (``time=2.30s``): one token per value for grep and awk
    return "  ".join(f"{k}={_token(format_value(k, logs[k]))}" for k in keys)


def _token(text: str) -> str:
    return text.replace(" ", "")


def _is_tty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or a closed stream
        return False


class ProgressBar:
    """Training progress: live bars on a terminal or in a notebook, plain lines when output goes to a file.

    Args:
        mode: ``"auto"`` (default: notebook bars in a notebook, console bars when the bar stream is a
            TTY, else plain lines; ``NBTRAINER_PROGRESS=bars|lines`` overrides it), ``"bars"`` or
            ``"lines"``.
        heartbeat: lines mode only: also print a ``step ...`` line (position, running loss, LR,
            samples/s, ETA) every this many seconds during an epoch (default ``None``: epoch lines only).
        print_epochs: print one line of values per epoch (under bars: ``tqdm.write``, so bars stay intact).
        file: the stream for bars and lines (default: bars on stderr, epoch lines on stdout).

    Attributes:
        active_mode: ``"bars"`` or ``"lines"``: what the running fit uses (``None`` outside a fit, and on
            ranks other than 0).

    Lines are ``epoch 3/10  loss=...  acc=...  val_loss=...  lr=...  time=...`` (every logged value, LRs with
    :func:`~nbtrainer.format_lr`, the rest with :func:`~nbtrainer.format_number`), ``step ...`` for
    heartbeats, ``control ...`` when the LR or accumulation changes mid-run, ``health ...`` once per kind of
    :class:`~nbtrainer.Health` report, and a last ``training <status>`` line. Under DDP only rank 0 prints.

    Example:
        >>> from nbtrainer import ProgressBar
        >>> bar = ProgressBar(mode="lines", heartbeat=60)  # Trainer(..., progress=bar) or callbacks=[bar]
    """

    def __init__(
        self, *, mode: str = "auto", heartbeat: float | None = None, print_epochs: bool = True, file: Any = None
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"ProgressBar mode must be one of {MODES}, got {mode!r}.")
        if heartbeat is not None and not (
            isinstance(heartbeat, (int, float)) and not isinstance(heartbeat, bool) and heartbeat > 0
        ):
            raise ValueError(
                f"heartbeat must be a number of seconds > 0 or None, got {heartbeat!r} (e.g. heartbeat=60)."
            )
        self.mode = mode
        self.heartbeat = None if heartbeat is None else float(heartbeat)
        self.print_epochs = print_epochs
        self.file = file
        self.active_mode: str | None = None
        self._epoch_bar: Any = None
        self._step_bar: Any = None
        self._tqdm: Any = None
        self._next_beat = 0.0
        self._health_said: set[str] = set()

    # -- which output ---------------------------------------------------------------------------
    def resolve_mode(self) -> str:
        """``"bars"`` or ``"lines"``: what ``mode`` means here and now (see the class docstring)."""
        if self.mode != "auto":
            return self.mode
        forced = os.environ.get(ENV, "").strip().lower()
        if forced in ("bars", "lines"):
            return forced
        if in_notebook():
            return "bars"
        return "bars" if _is_tty(self.file if self.file is not None else sys.stderr) else "lines"

    def _write(self, text: str) -> None:
        if self._tqdm is not None:
            self._tqdm.write(text, file=self.file)
        else:
            print(text, file=self.file if self.file is not None else sys.stdout, flush=True)

    # -- events ---------------------------------------------------------------------------------
    def on_fit_start(self, trainer: TrainerView) -> None:
        self.active_mode = None
        self._health_said = set()
        if not trainer.is_global_zero:
            return
        self.active_mode = self.resolve_mode()
        progress = trainer.progress
        done = _completed_epochs(trainer, progress.epochs)
        if self.active_mode == "lines":
            self._tqdm = None
            self._next_beat = time.monotonic() + (self.heartbeat or 0.0)
            where = f"epoch {done + 1}/{progress.epochs}" if done else f"{progress.epochs} epoch(s)"
            resumed = " (resumed)" if done or progress.global_step else ""
            parts = [f"training {where}{resumed}"]
            if progress.batches:
                parts.append(f"batches={format_number(progress.batches)}")
            if progress.total_steps:
                parts.append(f"steps={format_number(progress.total_steps)}")
            parts.append(f"device={trainer.device}")
            parts.append(f"precision={trainer.precision}")
            parts.append(f"grad_accum_steps={progress.grad_accum_steps}")
            self._write("  ".join(parts))
            return
        self._tqdm = _tqdm_class()
        self._epoch_bar = self._tqdm(
            total=progress.epochs, desc="epochs", unit="epoch", file=self.file, dynamic_ncols=True, initial=done
        )

    def on_epoch_start(self, trainer: TrainerView, epoch: int) -> None:
        if self._tqdm is None:
            return
        total = trainer.progress.batches
        if self._step_bar is None:
            self._step_bar = self._tqdm(
                total=total, desc=f"epoch {epoch}", unit="batch", leave=False, file=self.file, dynamic_ncols=True
            )
        else:
            self._step_bar.reset(total=total)
            self._step_bar.set_description(f"epoch {epoch}", refresh=False)

    def on_refresh(self, trainer: TrainerView, progress: Progress) -> None:
        if self._step_bar is None and self._tqdm is not None and progress.stage == "train":
            # an epoch resumed mid-way gets no on_epoch_start (it started in the run that was saved)
            self.on_epoch_start(trainer, progress.epoch)
        bar = self._step_bar
        if bar is not None:
            bar.n = progress.batch
            post = {}
            if progress.loss is not None:
                post["loss"] = format_number(progress.loss)
            if progress.lr is not None:
                post["lr"] = format_lr(progress.lr)
            for k, v in progress.metrics.items():
                post[k] = format_value(k, v)
            post["samples/s"] = format_number(progress.samples_per_s)
            if progress.status == "paused":
                post["status"] = "paused"
            bar.set_postfix(post, refresh=False)
            bar.refresh()
        elif self.heartbeat is not None and self.active_mode == "lines" and progress.stage == "train":
            now = time.monotonic()
            if now >= self._next_beat:
                self._next_beat = now + self.heartbeat
                self._write(_heartbeat_line(progress))

    def on_control(self, trainer: TrainerView, event: dict[str, Any]) -> None:
        if event.get("kind") == "resume_from" and self.active_mode is not None:
            self._write(f"resume_from={event.get('old')!r}: {event.get('new')}")
            return
        if event.get("kind") == "sample_error" and self.active_mode is not None:  # Samples' fn raised; the run goes on
            self._write(f"sample {event.get('old')!r} failed at step {event.get('step')}: {event.get('new')}")
            return
        if event.get("kind") == "data_check" and self.active_mode is not None:  # Trainer(check_data=True): a line each
            self._write(str(event.get("new")))
            return
        if event.get("kind") in ("memory_plan", "memory_step_down", "memory_check") and self.active_mode is not None:
            self._write(f"{event['kind'].replace('_', ' ')}: {event.get('new')}")
            return
        if self.active_mode != "lines" or event.get("kind") not in (*CONTROL_KINDS, "pause", "resume"):
            return
        kind = event["kind"]
        text = f"control  step={format_number(event.get('step'))}  epoch={event.get('epoch')}  {kind}"
        if kind in CONTROL_KINDS:
            text += f" {format_value(kind, event.get('old'))} -> {format_value(kind, event.get('new'))}"
        self._write(text)

    def on_health(self, trainer: TrainerView, report: Any) -> None:
        """One line per kind of health report and fit (``Health``'s own throttle spaces the rest out)."""
        if self.active_mode is None or report.kind in self._health_said:
            return
        self._health_said.add(report.kind)
        self._write(str(report))

    def on_epoch_end(self, trainer: TrainerView, epoch: int, logs: dict[str, Any]) -> None:
        if self.active_mode is None:
            return
        if self._epoch_bar is not None:
            self._epoch_bar.update(1)
        if self.print_epochs:
            self._write(f"epoch {epoch}/{trainer.progress.epochs}  {format_logs(logs)}")

    def on_fit_end(self, trainer: TrainerView, history: Any) -> None:
        for bar in (self._step_bar, self._epoch_bar):
            if bar is not None:
                bar.close()
        self._step_bar = self._epoch_bar = None
        mode, self.active_mode = self.active_mode, None
        if mode is None:
            return
        # Bars show a normal finish themselves; a log gets a last line in every case.
        if self.print_epochs and (mode == "lines" or history.status != "finished" or history.stop_reason):
            self._write(_final_line(trainer, history))
        self._tqdm = None


def _completed_epochs(trainer: TrainerView, planned: int) -> int:
    """Epochs already done when a fit starts (a resumed run's History holds one row per finished epoch)."""
    return min(len(trainer.history.epochs), planned)


def _heartbeat_line(p: Progress) -> str:
    parts = [f"step {format_number(p.global_step)}" + (f"/{format_number(p.total_steps)}" if p.total_steps else "")]
    parts.append(f"epoch={p.epoch}/{p.epochs}")
    parts.append(f"batch={p.batch}" + (f"/{p.batches}" if p.batches else ""))
    if p.loss is not None:
        parts.append(f"loss={format_number(p.loss)}")
    parts.extend(f"{k}={format_value(k, v)}" for k, v in p.metrics.items())
    if p.lr is not None:
        parts.append(f"lr={format_lr(p.lr)}")
    parts.append(f"samples_per_s={format_number(p.samples_per_s)}")
    if p.eta_fit is not None:
        parts.append(f"eta={format_duration(p.eta_fit).replace(' ', '')}")
    if p.status != "running":
        parts.append(f"status={p.status}")
    return "  ".join(parts)


def _final_line(trainer: TrainerView, history: Any) -> str:
    p = trainer.progress
    reason = f" ({history.stop_reason})" if history.stop_reason else ""
    parts = [f"training {history.status}{reason}"]
    parts.append(f"epochs={len(history.epochs)}/{p.epochs}")
    parts.append(f"steps={format_number(trainer.global_step)}")
    if p.elapsed:
        parts.append(f"time={format_duration(p.elapsed).replace(' ', '')}")
    return "  ".join(parts)


def start_progress(state: Any, n: int | None, accum: int, epochs: int, max_steps: int | None) -> Progress:
    """The snapshot at the start of a fit: the epoch about to run, and the epochs and steps it plans
    (``max_steps`` can end it before ``epochs``: the bar and ``Progress.epochs`` count what it reaches)."""
    per_epoch = math.ceil(n / accum) if n else None
    total_steps = per_epoch * epochs if per_epoch else None
    planned = epochs
    if max_steps is not None:
        total_steps = min(total_steps, max_steps) if total_steps else max_steps
        if per_epoch:
            planned = max(1, min(epochs, math.ceil(max_steps / per_epoch)))
    done = state.epoch + (1 if state.epoch_complete else 0)
    return Progress(
        epochs=planned,
        epoch=min(done + 1, planned),
        batches=n,
        global_step=state.global_step,
        total_steps=total_steps,
        grad_accum_steps=accum,
    )


def replan(progress: Progress, state: Any, accum: int, epochs: int, max_steps: int | None) -> None:
    """The steps (and, under ``max_steps``, the epochs) the fit plans, counted again when its accumulation changes at
    a step boundary: the steps taken, then the rest of this epoch's micro-batches and the later epochs in windows of
    ``accum``. :func:`start_progress` counted every epoch in the windows the fit started with: the total, the epochs
    and the ETA kept them (a finished run read "step 233/456")."""
    n = progress.batches
    if not n:
        return  # a loader without len(): no total to count
    per_epoch = math.ceil(n / accum)
    left = 0 if state.epoch_complete else math.ceil(max(n - state.batch, 0) / accum)
    epoch_end = state.global_step + left  # where the epoch in progress (or just finished) ends
    total = epoch_end + max(epochs - state.epoch - 1, 0) * per_epoch
    if max_steps is not None:
        total = min(total, max_steps)
        later = math.ceil(max(max_steps - epoch_end, 0) / per_epoch)  # the epochs it reaches after this one
        progress.epochs = min(epochs, state.epoch + 1 + later)
    progress.total_steps = total


def progress_callback(progress: Any) -> ProgressBar:
    """The ProgressBar for ``Trainer(progress=...)``: ``True``, ``"auto"``, ``"bars"``, ``"lines"`` or your own."""
    if isinstance(progress, ProgressBar):
        return progress
    if progress is True:
        return ProgressBar()
    if isinstance(progress, str) and progress in MODES:
        return ProgressBar(mode=progress)
    raise ValueError(
        f"progress must be True, False, one of {MODES} or a ProgressBar(...), got {progress!r}. "
        "Use progress='lines' for plain epoch lines, progress=False for no output."
    )
