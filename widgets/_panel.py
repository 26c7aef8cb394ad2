"""``TrainerWidget``: the training panel. Trains in a background thread and steers it from the panel.

Threads: the *training thread* runs ``trainer.fit`` and only feeds a deque (:class:`Feed`); a *UI
thread* wakes at most every ``ui_interval`` seconds, decimates, and pushes one batched update
(``hold_sync``) to the widgets; the kernel's own thread handles clicks, also while a cell blocks in
``w.fit()`` / ``w.wait()`` (``_poll``: ``jupyter-ui-poll`` processes the widget messages from inside the
waiting cell). The training loop never waits on the UI and never syncs the device for it.
"""

from __future__ import annotations

import contextlib
import html
import os
import re
import sys
import threading
import time
import warnings
from typing import Any

import ipywidgets as W

from nbtrainer import ProgressBar, Trainer, format_count

from . import _frontend
from ._actions import PanelActions
from ._charts import LiveCharts
from ._compare_runs import CompareRuns
from ._controls import Controls
from ._display import SummaryDisplay
from ._poll import wait_until
from ._pump import UiPump
from ._runner import Feed, Run, claim_model
from ._savers import Savers
from ._theme import FG2
from ._view import HIDE_STATIC, PanelView

__all__ = ["TrainerWidget"]

_USAGE = (
    "TrainerWidget(model, criterion, optimizer, train_loader, val_loader=None, *, metrics=None, epochs=1, "
    "**trainer_options) or TrainerWidget(trainer, train_loader, val_loader=None, epochs=1)"
)
_counter = iter(range(1, 1 << 30))


class TrainerWidget(PanelActions, SummaryDisplay):
    """A training panel: live charts, progress, controls (LR, accumulation, precision...) and buttons.

    Args (model form): ``model, criterion, optimizer, train_loader, val_loader=None``, then ``metrics=``,
        ``epochs=`` and any :class:`nbtrainer.Trainer` option (``precision=``, ``grad_accum_steps=``...).
    Args (trainer form): ``trainer, train_loader, val_loader=None, epochs=1``.
    Panel options: ``max_steps=``, ``ui_interval=`` (seconds between UI pushes, default 0.25),
        ``max_points=`` (per chart series, default 2000), ``smoothing=`` (EMA weight of the smoothed loss),
        ``save_path=`` (default checkpoint path of the Save button), ``name=`` (the run's name in the title,
        messages and the default checkpoint path; default ``"<model class> #<n>"``, ``n`` counting the panels
        made in this kernel, so two panels in one notebook never save to one file).

    Example:
        >>> w = TrainerWidget(model, torch.nn.CrossEntropyLoss(), torch.optim.AdamW(model.parameters()),
        ...                   train_loader, val_loader, epochs=3)          # doctest: +SKIP
        >>> w                     # shows the panel; click Start (or w.start(); w.wait())  # doctest: +SKIP
    """

    def __init__(
        self,
        model: Any,
        *args: Any,
        train_loader: Any = None,
        val_loader: Any = None,
        metrics: Any = None,
        epochs: int = 1,
        max_steps: int | None = None,
        ui_interval: float = 0.25,
        max_points: int = 2000,
        smoothing: float = 0.9,
        save_path: str | None = None,
        name: str | None = None,
        **trainer_options: Any,
    ) -> None:
        if isinstance(model, Trainer):
            if metrics is not None or trainer_options:
                raise TypeError(
                    "TrainerWidget(trainer, ...) uses the trainer as configured; pass metrics and "
                    f"options to Trainer(...). Got {sorted(trainer_options) or ['metrics']}. {_USAGE}"
                )
            if len(args) > 2:
                raise TypeError(f"Too many positional arguments. {_USAGE}")
            trainer, user_model = model, getattr(model.model, "_orig_mod", model.model)  # torch.compile
            self._build: tuple[Any, ...] | None = None  # a built Trainer: the memory savers cannot rebuild it
        else:
            if len(args) < 2 or len(args) > 4:
                raise TypeError(f"Expected criterion, optimizer and train_loader after the model. {_USAGE}")
            criterion, optimizer, *loaders = args
            args = tuple(loaders)
            trainer = Trainer(model, criterion, optimizer, metrics=metrics, **trainer_options)
            user_model = model
            self._build = (criterion, optimizer, metrics, dict(trainer_options))
        train_loader = args[0] if len(args) > 0 else train_loader
        val_loader = args[1] if len(args) > 1 else val_loader
        if train_loader is None:
            raise TypeError(f"train_loader is required. {_USAGE}")
        if not isinstance(epochs, int) or isinstance(epochs, bool) or epochs < 1:
            raise ValueError(f"epochs must be an int >= 1, got {epochs!r}.")
        if trainer.optimizer is None:
            raise ValueError(
                "TrainerWidget trains, and this Trainer was built with optimizer=None (evaluate / predict only). "
                "Pass an optimizer, e.g. Trainer(model, criterion, torch.optim.AdamW(model.parameters(), lr=1e-3)); "
                "for evaluation alone call trainer.evaluate(loader) without a panel."
            )
        self.trainer, self.train_loader, self.val_loader = trainer, train_loader, val_loader
        self.max_steps = max_steps
        self.ui_interval = max(0.05, float(ui_interval))
        self._model = user_model
        self.name = str(name) if name else f"{type(user_model).__name__} #{next(_counter)}"
        self._label = f"TrainerWidget '{self.name}'"
        self._run: Run | None = None
        self._pump: UiPump | None = None
        self._feed = Feed()
        self._detached: list[Any] = []
        self._paused_requested = False
        self._busy: set[str] = set()
        self._lr_find_lock = threading.Lock()
        self.lr_finder: Any = None  # the LRFinderView of the last lr_find()
        self._display_ids: list[str] = []
        self.summary_html: str | None = None
        self.ui_updates = 0
        self.ui_update_times: list[float] = []

        self.charts = LiveCharts(max_points=max_points, smoothing=smoothing, lr=trainer.lr)
        # The compare menu over the charts; its store is the run_store given here (a Trainer passed in records
        # where it was told to, which no public name reports: NBTRAINER_RUNS or this session's runs).
        self.compare = CompareRuns(
            self.charts, trainer, run_store=trainer_options.get("run_store"), max_points=max_points
        )
        self.view = v = PanelView(W.VBox([self.compare.root, self.charts.box]))
        self.panel: W.VBox = v.root
        self.controls = Controls(v, trainer, epochs, self._notify)
        self.savers = Savers(
            trainer,
            locked_reason=None
            if self._build is not None
            else "the panel was given a built Trainer: pass these options to Trainer(...) instead",
        )
        v.controls.children = (*v.controls.children, self.savers.root)
        self._show_title()
        slug = re.sub(r"[^\w.-]+", "-", self.name.lower()).strip("-.") or "run"
        v.save_path.value = save_path or os.path.join("checkpoints", f"{slug}.ckpt")
        v.start.on_click(lambda _: self._guarded(self.start))
        v.pause.on_click(lambda _: self._guarded(self.resume if self._paused_requested else self.pause))
        v.stop.on_click(lambda _: self._guarded(self.stop))
        v.save.on_click(lambda _: self._in_background("save", self.save_checkpoint))
        v.profile.on_click(lambda _: self._in_background("profile", self.profile))
        v.lrfind.on_click(lambda _: self._guarded(self._click_lr_find))
        v.set_status("idle")
        v.set_stats(None, None)
        self._hide_static = W.HTML(HIDE_STATIC, layout=W.Layout(height="0px", margin="0px"))
        self.panel.children = (*self.panel.children, self._hide_static)
        self._cell = _frontend.cell_id()
        try:
            msg = claim_model(user_model, owner=self._label, cell=self._cell)
            if msg:
                self._notify("warning", msg)
                warnings.warn(msg, RuntimeWarning, stacklevel=2)
        except RuntimeError as exc:
            self._notify("error", str(exc))
            warnings.warn(str(exc), RuntimeWarning, stacklevel=2)

    # -- public API ------------------------------------------------------------------------------------
    @property
    def history(self) -> Any:
        return self.trainer.history

    @property
    def epochs(self) -> int:
        return int(self.view.epochs.value)

    @property
    def status(self) -> str:
        """``idle``, ``running``, ``paused``, then ``finished``, ``stopped`` or ``failed``."""
        run = self._run
        if run is None:  # never started here (or trained by the headless fallback)
            return self.trainer.status
        if run.alive:
            return "paused" if self.trainer.status == "paused" else "running"
        return run.status

    def start(self) -> None:
        """Start training in a background thread (the kernel stays free for clicks)."""
        if self._run is not None and self._run.alive:
            raise RuntimeError(f"{self._label} is already running; stop() or wait() first.")
        if self._lr_find_lock.locked():  # the sweep is training the model (and restores it when it ends)
            raise RuntimeError("The LR finder is running; start when it has finished.")
        if self._pump is not None:
            self._pump.join()  # the previous run's final UI update
        self._apply_savers()
        msg = claim_model(self._model, owner=self._label, cell=self._cell)
        if msg:
            self._notify("warning", msg)
        self.controls.apply_schedule(self.train_loader, self.epochs)
        self.charts.clear()
        self._summary_is_previous()  # the last run's summary must not read as this run's
        self._paused_requested = False
        self._feed = feed = Feed()
        self._detached = [cb for cb in self.trainer.callbacks.callbacks if isinstance(cb, ProgressBar)]
        for cb in self._detached:  # the panel is the progress display
            self.trainer.remove_callback(cb)
        self.trainer.add_callback(feed)
        kwargs = {
            "train_loader": self.train_loader,
            "val_loader": self.val_loader,
            "epochs": self.epochs,
            "max_steps": self.max_steps,
        }
        run = Run(self.trainer, id(self._model), kwargs, owner=self._label, on_done=self._on_run_done, cell=self._cell)
        self._run = run
        self._set_running(True)
        self.view.set_status("running", "starting")
        try:
            run.start()
        except BaseException:
            self._on_run_done(run)
            self._run = None
            self._set_running(False)
            raise
        self._notify(
            "info",
            f"run started: {self.epochs} epoch(s), {self.trainer.precision}, "
            f"accumulation {self.trainer.grad_accum_steps}",
        )
        self._pump = UiPump(self, run, feed)
        self._pump.start()

    def pause(self) -> None:
        """Hold at the next optimizer-step boundary."""
        if self._run is None or not self._run.alive:
            return
        self._paused_requested = True
        self.trainer.pause()
        self.view.pause.description, self.view.pause.icon = "Resume", "play"
        self.view.set_status("pausing", "at the next optimizer step")  # "paused" once the loop holds

    def resume(self) -> None:
        """Continue a paused run (or cancel a pause not reached yet)."""
        self._paused_requested = False
        self.trainer.resume()
        self.view.pause.description, self.view.pause.icon = "Pause", "pause"
        if self._run is not None and self._run.alive and not self._run.stop_reason:
            self.view.set_status("running", "resuming")

    def stop(self, reason: str = "Stop pressed in the panel") -> None:
        """Stop at the next optimizer step (also when paused); ``wait()`` then returns the History."""
        run = self._run
        if run is not None and run.alive:
            run.stop(reason)
            self.view.set_status("stopping", reason)

    def wait(self, timeout: float | None = None) -> Any:
        """Block until the run ends; return its History, or re-raise the error that ended it."""
        run = self._run
        if run is None:
            raise RuntimeError(f"{self._label} has not been started: call start() or fit().")
        deadline = None if timeout is None else time.monotonic() + timeout

        def done(wait_s: float) -> bool:
            if run.join(wait_s):
                return True
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"{self._label} still running after {timeout} s")
            return False

        try:
            # From a notebook cell, clicks on Pause / Stop / the LR keep working while this waits.
            wait_until(done)
        except KeyboardInterrupt:  # interrupting the cell stops the run; the kernel lives on
            run.stop("interrupted (KeyboardInterrupt)")
            run.join()
        if self._pump is not None:
            self._pump.join()
        self._publish_summary()  # again from this cell's thread, so it lands in the notebook for sure
        if run.error is not None:
            raise run.error
        return run.history

    def fit(self) -> Any:
        """``start()`` + ``wait()``; without a notebook front end, train in the foreground with console bars.

        While the cell waits, the panel's clicks are handled at once, and a page reloaded (or a second tab)
        gets the panel back live: the front end's requests are answered beside the waiting cell (``_poll``).
        """
        if not _frontend.in_notebook():
            print(
                f"nbtrainer: no notebook front end here, so {type(self._model).__name__} trains in the "
                "foreground with console progress.",
                file=sys.stderr,
                flush=True,
            )
            claim_model(self._model, owner=self._label)
            self.controls.apply_schedule(self.train_loader, self.epochs)
            return self.trainer.fit(self.train_loader, self.val_loader, epochs=self.epochs, max_steps=self.max_steps)
        if not self._display_ids:
            from IPython.display import display

            display(self)
        self.start()
        return self.wait()

    def __repr__(self) -> str:
        return f"<{self._label}: {self.status}, {self.trainer!r}>"

    # -- internals -------------------------------------------------------------------------------------
    def _notify(self, level: str, text: str, details: str | None = None) -> None:
        self.view.add_message(level, text, details)

    def _show_title(self) -> None:
        t, n_params = self.trainer, sum(p.numel() for p in self._model.parameters())
        self.view.title.value = (
            f"<b style='font-size:14px'>{html.escape(self.name)}</b> <span style='color:{FG2}'>· "
            f"{type(self._model).__name__} · {t.device} · {format_count(n_params, compact=False)} parameters · "
            f"{type(t.optimizer).__name__}</span>"
        )

    def _apply_savers(self) -> None:
        """Build the run's Trainer with the memory savers chosen in the panel (nothing chosen: keep it).

        The old trainer's precision, accumulation, clipping, checkpointing and LR (the controls) carry over.
        Quantizing and adapters change the model in place, so the group locks once they are applied. A
        combination the core refuses raises ValueError with the core's message (a panel message on click).
        """
        choice = self.savers.options()
        if not choice or self.savers.locked_reason or self._build is None:
            return
        old = self.trainer
        criterion, optimizer, metrics, options = self._build
        options = dict(options)
        options.update(
            precision=old.precision,
            grad_accum_steps=old.grad_accum_steps,
            max_grad_norm=old.max_grad_norm,
            activation_checkpointing=(options.get("activation_checkpointing") or True)
            if old.checkpointed_blocks
            else False,
        )
        chosen = ", ".join(f"{k}={v}" for k, v in choice.items())
        optimizer = choice.pop("optimizer", optimizer)
        if isinstance(optimizer, str):
            options["lr"] = float(self.view.lr.value)
            if options.pop("scheduler", None) is not None:  # it is bound to the optimizer given
                self._notify("warning", "the scheduler given is bound to the optimizer given: pick one in the menu")
        try:
            trainer = Trainer(self._model, criterion, optimizer, metrics=metrics, **options, **choice)
        except Exception as exc:
            raise ValueError(f"memory savers: {exc}") from None
        self.trainer = self.controls.trainer = trainer
        self.controls._user_scheduler, self.controls._user_interval = trainer.scheduler, trainer.scheduler_interval
        self.savers.lock(f"applied at Start ({trainer.param_counts}); build a new panel from a fresh model to change")
        self._show_title()
        self._notify("info", f"memory savers: {chosen} · {trainer.param_counts}")

    def _set_running(self, running: bool) -> None:
        v = self.view
        v.start.disabled = running
        v.pause.disabled = v.stop.disabled = not running
        v.profile.disabled = v.lrfind.disabled = running
        v.pause.description, v.pause.icon = "Pause", "pause"
        self._paused_requested = False
        self.controls.set_running(running)
        self.compare.trainer, self.compare.running = self.trainer, running  # the savers may rebuild it
        try:  # a run starts or ends: the menu lists the runs before it (never the live one)
            self.compare.refresh()
        except Exception as exc:  # a store that cannot be read must not block training
            self._notify("warning", f"compare: could not read the run store: {type(exc).__name__}: {exc}")
        self.savers.set_running(running)

    def _on_run_done(self, run: Run) -> None:
        """On the training thread, right after fit: give the trainer back as it was."""
        with contextlib.suppress(Exception):
            self.trainer.remove_callback(self._feed)
        for cb in self._detached:
            if cb not in self.trainer.callbacks.callbacks:
                self.trainer.add_callback(cb)
        self._detached = []
        self._feed.wake.set()
