"""``TrainerWidget``: the training panel. Trains in a background thread and steers it from the panel.

Threads: the *training thread* runs ``trainer.fit`` and only feeds a deque (:class:`Feed`); a *UI
thread* wakes at most every ``ui_interval`` seconds, decimates, and pushes one batched update
(``hold_sync``) to the widgets; the kernel's own thread handles clicks. The training loop never waits
on the UI and never syncs the device for it.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import threading
import time
import warnings
from typing import Any

import ipywidgets as W

from nbtrainer import ProgressBar, Trainer

from ._charts import LiveCharts
from ._controls import Controls
from ._frontend import in_notebook
from ._runner import Feed, Run, claim_model
from ._summary import higher_is_better, summary_html
from ._view import PanelView, fmt_duration

__all__ = ["TrainerWidget"]

_USAGE = ("TrainerWidget(model, criterion, optimizer, train_loader, val_loader=None, *, metrics=None, epochs=1, "
          "**trainer_options) or TrainerWidget(trainer, train_loader, val_loader=None, epochs=1)")
_counter = iter(range(1, 1 << 30))


def _peak_memory(device: Any) -> str:
    try:
        import torch

        if device.type == "cuda":  # allocator counters, read on the host: no device sync
            return f"{torch.cuda.max_memory_allocated(device) / 2**30:.2f} GiB (CUDA)"
        import resource

        return f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB (process RSS)"
    except Exception:  # noqa: BLE001 - a stat card is never worth an error
        return "n/a"


class TrainerWidget:
    """A training panel: live charts, progress, controls (LR, accumulation, precision...) and buttons.

    Args (model form): ``model, criterion, optimizer, train_loader, val_loader=None``, then ``metrics=``,
        ``epochs=`` and any :class:`nbtrainer.Trainer` option (``precision=``, ``grad_accum_steps=``...).
    Args (trainer form): ``trainer, train_loader, val_loader=None, epochs=1``.
    Panel options: ``max_steps=``, ``ui_interval=`` (seconds between UI pushes, default 0.25),
        ``max_points=`` (per chart series, default 2000), ``smoothing=`` (EMA weight of the smoothed loss),
        ``save_path=`` (default checkpoint path of the Save button).

    Example:
        >>> w = TrainerWidget(model, torch.nn.CrossEntropyLoss(), torch.optim.AdamW(model.parameters()),
        ...                   train_loader, val_loader, epochs=3)          # doctest: +SKIP
        >>> w                     # shows the panel; click Start (or w.start(); w.wait())  # doctest: +SKIP
    """

    def __init__(self, model: Any, *args: Any, train_loader: Any = None, val_loader: Any = None,
                 metrics: Any = None, epochs: int = 1, max_steps: int | None = None, ui_interval: float = 0.25,
                 max_points: int = 2000, smoothing: float = 0.9, save_path: str | None = None,
                 **trainer_options: Any) -> None:
        if isinstance(model, Trainer):
            if metrics is not None or trainer_options:
                raise TypeError("TrainerWidget(trainer, ...) uses the trainer as configured; pass metrics and "
                                f"options to Trainer(...). Got {sorted(trainer_options) or ['metrics']}. {_USAGE}")
            if len(args) > 2:
                raise TypeError(f"Too many positional arguments. {_USAGE}")
            trainer, user_model = model, model.model
        else:
            if len(args) < 2 or len(args) > 4:
                raise TypeError(f"Expected criterion, optimizer and train_loader after the model. {_USAGE}")
            criterion, optimizer, *args = args
            trainer = Trainer(model, criterion, optimizer, metrics=metrics, **trainer_options)
            user_model = model
        train_loader = args[0] if len(args) > 0 else train_loader
        val_loader = args[1] if len(args) > 1 else val_loader
        if train_loader is None:
            raise TypeError(f"train_loader is required. {_USAGE}")
        if not isinstance(epochs, int) or isinstance(epochs, bool) or epochs < 1:
            raise ValueError(f"epochs must be an int >= 1, got {epochs!r}.")
        self.trainer, self.train_loader, self.val_loader = trainer, train_loader, val_loader
        self.max_steps = max_steps
        self.ui_interval = max(0.05, float(ui_interval))
        self._model = user_model
        self._label = f"TrainerWidget #{next(_counter)} ({type(user_model).__name__})"
        self._run: Run | None = None
        self._pump: threading.Thread | None = None
        self._feed = Feed()
        self._detached: list[Any] = []
        self._paused_requested = False
        self._progress: Any = None
        self._best: tuple[str, float, Any] | None = None
        self._warned_nonfinite = False
        self._busy: set[str] = set()
        self._display_ids: list[str] = []
        self.summary_html: str | None = None
        self.ui_updates = 0
        self.ui_update_times: list[float] = []

        self.charts = LiveCharts(max_points=max_points, smoothing=smoothing)
        self.view = v = PanelView(self.charts.box)
        self.panel: W.VBox = v.root
        self.controls = Controls(v, trainer, epochs, self._notify)
        name = type(user_model).__name__
        n_params = sum(p.numel() for p in user_model.parameters())
        v.title.value = (f"<b style='font-size:14px'>{name}</b> <span style='color:#666'>· {trainer.device} · "
                         f"{n_params:,} parameters · {type(trainer.optimizer).__name__}</span>")
        v.save_path.value = save_path or os.path.join("checkpoints", f"{name.lower()}-widget.ckpt")
        v.start.on_click(lambda _: self._guarded(self.start))
        v.pause.on_click(lambda _: self._guarded(self.resume if self._paused_requested else self.pause))
        v.stop.on_click(lambda _: self._guarded(self.stop))
        v.save.on_click(lambda _: self._in_background("save", self.save_checkpoint))
        v.profile.on_click(lambda _: self._in_background("profile", self.profile))
        v.set_status("idle")
        v.set_stats(None, _peak_memory(trainer.device), None)
        try:
            msg = claim_model(user_model, owner=self._label)
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
        if run is None:
            return "idle"
        if run.alive:
            return "paused" if self.trainer.status == "paused" else "running"
        return "failed" if run.error is not None else self.trainer.status

    def start(self) -> None:
        """Start training in a background thread (the kernel stays free for clicks)."""
        if self._run is not None and self._run.alive:
            raise RuntimeError(f"{self._label} is already running; stop() or wait() first.")
        if self._pump is not None:
            self._pump.join()  # the previous run's final UI update
        msg = claim_model(self._model, owner=self._label)
        if msg:
            self._notify("warning", msg)
        self.controls.apply_schedule(self.train_loader, self.epochs)
        self.charts.clear()
        self._best, self._progress, self._warned_nonfinite, self._paused_requested = None, None, False, False
        self._feed = feed = Feed()
        self._detached = [cb for cb in self.trainer.callbacks.callbacks if isinstance(cb, ProgressBar)]
        for cb in self._detached:  # the panel is the progress display
            self.trainer.remove_callback(cb)
        self.trainer.add_callback(feed)
        kwargs = dict(train_loader=self.train_loader, val_loader=self.val_loader, epochs=self.epochs,
                      max_steps=self.max_steps)
        run = Run(self.trainer, id(self._model), kwargs, owner=self._label, on_done=self._on_run_done)
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
        self._notify("info", f"run started: {self.epochs} epoch(s), {self.trainer.precision}, "
                             f"accumulation {self.trainer.grad_accum_steps}")
        self._pump = threading.Thread(target=self._pump_main, args=(run, feed), name=f"nbtrainer-ui ({self._label})",
                                      daemon=True)
        self._pump.start()

    def pause(self) -> None:
        """Hold at the next optimizer-step boundary."""
        if self._run is None or not self._run.alive:
            return
        self._paused_requested = True
        self.trainer.pause()
        self.view.pause.description, self.view.pause.icon = "Resume", "play"
        self.view.set_status("running", "pausing at the next step")

    def resume(self) -> None:
        self._paused_requested = False
        self.trainer.resume()
        self.view.pause.description, self.view.pause.icon = "Pause", "pause"

    def stop(self, reason: str = "stopped from the panel") -> None:
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
        try:
            while not run.join(0.1):
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"{self._label} still running after {timeout} s")
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
        """``start()`` + ``wait()``; without a notebook front end, train in the foreground with console bars."""
        if not in_notebook():
            print(f"nbtrainer: no notebook front end here, so {type(self._model).__name__} trains in the "
                  "foreground with console progress bars.", file=sys.stderr, flush=True)
            claim_model(self._model, owner=self._label)
            self.controls.apply_schedule(self.train_loader, self.epochs)
            return self.trainer.fit(self.train_loader, self.val_loader, epochs=self.epochs, max_steps=self.max_steps)
        if not self._display_ids:
            from IPython.display import display

            display(self)
        self.start()
        return self.wait()

    def save_checkpoint(self, path: str | None = None) -> str:
        """Write a checkpoint (mid-run: at the next step boundary, from the training thread)."""
        path = path or self.view.save_path.value
        out = self.trainer.save_checkpoint(path)
        self._notify("info", f"checkpoint saved to {out} (step {self.trainer.global_step})")
        return out

    def profile(self, **kwargs: Any) -> Any:
        """``nbtrainer.profile_model`` on one batch of the train loader; shown as a ProfileCard in the panel."""
        from nbtrainer import precision_support, profile_model

        from ._profile_card import ProfileCard

        if self._run is not None and self._run.alive:
            raise RuntimeError("Profile between runs: it would compete with training for the device.")
        t = self.trainer
        args, kw, targets = t.batch_spec.split(next(iter(self.train_loader)))
        inputs = kw if (kw and not args) else (args[0] if len(args) == 1 else tuple(args))
        kwargs.setdefault("precisions", tuple(p for p, (ok, _) in precision_support(t.device).items() if ok))
        kwargs.setdefault("time_budget_s", 0.5)
        if t.criterion is not None and targets is not None:
            kwargs.setdefault("criterion", t.criterion)
            kwargs.setdefault("targets", targets)
        prof = profile_model(self._model, inputs, devices=(str(t.device),), optimizer=t.optimizer, **kwargs)
        self.view.profile_area.children = (ProfileCard(prof),)
        return prof

    # -- display ---------------------------------------------------------------------------------------
    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.panel._repr_mimebundle_(**kwargs)

    def _ipython_display_(self) -> None:
        """The panel, then a plain-HTML slot that receives the static summary when a run ends."""
        from IPython.display import display

        display(self.panel)
        display_id = f"nbtrainer-summary-{id(self)}-{len(self._display_ids)}"
        display(self._summary_bundle(), raw=True, display_id=display_id)
        self._display_ids.append(display_id)

    def _summary_bundle(self) -> dict[str, str]:
        if self.summary_html is None:
            return {"text/html": "<div class='nbt-summary-slot'></div>", "text/plain": ""}
        h = self.history
        last = ", ".join(f"{k}={v:.4g}" for k, v in h.last.items() if isinstance(v, float))
        return {"text/html": self.summary_html, "text/plain": f"{self._label}: {h.status}; {last}"}

    def _publish_summary(self) -> None:
        if not self._display_ids or self.summary_html is None:
            return
        from IPython.display import update_display

        for display_id in self._display_ids:
            update_display(self._summary_bundle(), raw=True, display_id=display_id)

    def __repr__(self) -> str:
        return f"<{self._label}: {self.status}, {self.trainer!r}>"

    # -- internals -------------------------------------------------------------------------------------
    def _notify(self, level: str, text: str, details: str | None = None) -> None:
        self.view.add_message(level, text, details)

    def _guarded(self, fn: Any) -> None:
        """Click handlers: an error becomes a panel message (an exception there would be lost in a log)."""
        try:
            fn()
        except Exception as exc:  # noqa: BLE001
            self._notify("error", f"{type(exc).__name__}: {exc}")

    def _in_background(self, name: str, fn: Any) -> None:
        if name in self._busy:
            return
        self._busy.add(name)
        button = self.view.save if name == "save" else self.view.profile
        button.disabled = True
        if name == "profile":
            self.view.start.disabled = True
            self._notify("info", "profiling one batch (runs on copies of the model)...")

        def target() -> None:
            try:
                fn()
            except Exception as exc:  # noqa: BLE001
                self._notify("error", f"{name} failed: {type(exc).__name__}: {exc}")
            finally:
                self._busy.discard(name)
                running = self._run is not None and self._run.alive
                button.disabled = name == "profile" and running
                self.view.start.disabled = running

        threading.Thread(target=target, name=f"nbtrainer-{name}", daemon=True).start()

    def _set_running(self, running: bool) -> None:
        v = self.view
        v.start.disabled = running
        v.pause.disabled = v.stop.disabled = not running
        v.profile.disabled = running
        v.pause.description, v.pause.icon = "Pause", "pause"
        self.controls.set_running(running)

    def _on_run_done(self, run: Run) -> None:
        """On the training thread, right after fit: give the trainer back as it was."""
        with contextlib.suppress(Exception):
            self.trainer.remove_callback(self._feed)
        for cb in self._detached:
            if cb not in self.trainer.callbacks.callbacks:
                self.trainer.add_callback(cb)
        self._detached = []
        self._feed.wake.set()

    def _pump_main(self, run: Run, feed: Feed) -> None:
        last = 0.0
        while True:
            final = run.done.is_set()
            if not final:
                feed.wake.wait(self.ui_interval)
                feed.wake.clear()
                rest = self.ui_interval - (time.monotonic() - last)
                if rest > 0:
                    run.done.wait(rest)
                final = run.done.is_set()
            items = feed.drain()
            if items or final:
                try:
                    self._apply(items, run, final)
                except Exception as exc:  # noqa: BLE001 - the UI thread must outlive a drawing bug
                    self._notify("error", f"panel update failed: {type(exc).__name__}: {exc}")
                last = time.monotonic()
            if final:
                return

    def _apply(self, items: list[tuple[str, Any]], run: Run, final: bool) -> None:
        for kind, payload in items:
            if kind == "progress":
                self._progress = payload
                bad = self.charts.add_steps(payload.step_points)
                if bad and not self._warned_nonfinite:
                    self._warned_nonfinite = True
                    self._notify("warning", f"non-finite loss at step <= {payload.global_step}: check the LR, "
                                            "the data and the precision")
            elif kind == "epoch":
                self.charts.add_epoch(payload)
                self._update_best(payload)
            elif kind == "control":
                self.charts.add_event(payload)
                self.controls.on_event(payload)
                if payload["kind"] in ("lr", "grad_accum_steps"):
                    self._notify("info", f"step {payload['step']}: {payload['kind']} {payload['old']:.4g} -> "
                                         f"{payload['new']:.4g}")
        v = self.view
        with contextlib.ExitStack() as stack:
            for w in (v.status, v.epoch_bar, v.step_bar, v.progress_info, v.stats):
                stack.enter_context(w.hold_sync())
            p = self._progress
            if p is not None:
                if final:
                    p.status = self.trainer.status
                v.set_progress(p)
            v.set_stats(self._best, _peak_memory(self.trainer.device), p)
            if not final:
                status = self.status
                detail = run.stop_reason if run.stop_reason else (
                    f"epoch {p.epoch}/{p.epochs}" if p is not None else "")
                v.set_status("stopping" if run.stop_reason else status, detail or "")
            self.charts.render()
        self.ui_updates += 1
        self.ui_update_times.append(time.monotonic())
        if final:
            self._finish(run)

    def _update_best(self, logs: dict[str, Any]) -> None:
        keys = [k for k in logs if k.startswith("val_") and isinstance(logs[k], (int, float))]
        key = "val_loss" if "val_loss" in keys else (keys[0] if keys else None)
        if key is None or not math.isfinite(logs[key]):
            return
        value = float(logs[key])
        better = self._best is None or (value > self._best[1] if higher_is_better(key) else value < self._best[1])
        if better:
            self._best = (key, value, logs.get("epoch"))

    def _finish(self, run: Run) -> None:
        h = run.history if run.history is not None else self.trainer.history
        status = "failed" if run.error is not None else self.trainer.status
        if run.error is not None:
            self._notify("error", f"training failed: {type(run.error).__name__}: {run.error}", run.traceback)
        else:
            reason = f" ({h.stop_reason})" if h.stop_reason else ""
            took = fmt_duration(self._progress.elapsed) if self._progress is not None else "?"
            self._notify("info", f"run {status}{reason} after {len(h.epochs)} epoch(s), "
                                 f"{len(h.steps['step']):,} steps, {took}")
        self.view.set_status(status, (h.stop_reason or "") if status != "finished" else "")
        self._set_running(False)
        self._paused_requested = False
        try:
            self.summary_html = summary_html(h, title=f"{type(self._model).__name__} on {self.trainer.device}")
            self._publish_summary()
        except Exception as exc:  # noqa: BLE001
            self._notify("warning", f"could not write the static summary: {exc}")
