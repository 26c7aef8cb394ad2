"""tqdm progress bars as a consumer of the trainer's events.

Bars are touched only on ``on_refresh`` (already throttled by the trainer) and at epoch boundaries:
no tqdm call per step. The frontend is picked at run time like ``tqdm.auto``; in a notebook without
ipywidgets it falls back to console bars with one actionable warning.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

from nbtrainer._events import Progress
from nbtrainer._frontend import in_notebook

__all__ = ["ProgressBar", "format_logs"]

_warned = False


def _tqdm_class():
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


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e4) and math.isfinite(value):
            return f"{value:.3e}"
        return f"{value:.4f}"
    return str(value)


def format_logs(logs: dict[str, Any], skip: tuple[str, ...] = ("epoch",)) -> str:
    return "  ".join(f"{k}={_fmt(v)}" for k, v in logs.items() if k not in skip)


class ProgressBar:
    """Epoch bar + step bar (loss, lr, metrics, samples/s); prints each epoch's metrics.

    Args:
        print_epochs: print one line of metrics per epoch (``tqdm.write``, so bars stay intact).
        file: stream for console bars (default stderr).
    """

    def __init__(self, *, print_epochs: bool = True, file: Any = None) -> None:
        self.print_epochs = print_epochs
        self.file = file
        self._epoch_bar = None
        self._step_bar = None
        self._tqdm = None

    def on_fit_start(self, trainer: Any) -> None:
        if not getattr(trainer, "is_global_zero", True):
            return
        self._tqdm = _tqdm_class()
        epochs = trainer.progress.epochs
        self._epoch_bar = self._tqdm(
            total=epochs,
            desc="epochs",
            unit="epoch",
            file=self.file,
            dynamic_ncols=True,
            initial=trainer.progress.epoch - 1 if trainer.progress.epoch else 0,
        )

    def on_epoch_start(self, trainer: Any, epoch: int) -> None:
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

    def on_refresh(self, trainer: Any, progress: Progress) -> None:
        bar = self._step_bar
        if bar is None:
            return
        bar.n = progress.batch
        post = {}
        if progress.loss is not None:
            post["loss"] = _fmt(progress.loss)
        if progress.lr is not None:
            post["lr"] = f"{progress.lr:.2e}"
        for k, v in progress.metrics.items():
            post[k] = _fmt(v)
        post["samples/s"] = f"{progress.samples_per_s:,.0f}"
        if progress.status == "paused":
            post["status"] = "paused"
        bar.set_postfix(post, refresh=False)
        bar.refresh()

    def on_epoch_end(self, trainer: Any, epoch: int, logs: dict[str, Any]) -> None:
        if self._epoch_bar is None:
            return
        self._epoch_bar.update(1)
        if self.print_epochs:
            total = trainer.progress.epochs
            self._tqdm.write(f"epoch {epoch}/{total}  {format_logs(logs)}", file=self.file)

    def on_fit_end(self, trainer: Any, history: Any) -> None:
        for bar in (self._step_bar, self._epoch_bar):
            if bar is not None:
                bar.close()
        self._step_bar = self._epoch_bar = None
        if self._tqdm is not None and history.status not in ("finished",) and self.print_epochs:
            reason = f" ({history.stop_reason})" if history.stop_reason else ""
            self._tqdm.write(f"training {history.status}{reason}", file=self.file)
        self._tqdm = None
