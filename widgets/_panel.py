"""``TrainerWidget``: the training panel. Trains in a background thread and steers it from the panel.

Threads: the *training thread* runs ``trainer.fit`` and only feeds a deque (:class:`Feed`); a *UI thread* wakes
at most every ``ui_interval`` seconds, decimates, and pushes one batched update (``hold_sync``) to the widgets; clicks
are handled also while a cell blocks in ``w.fit()`` / ``w.wait()`` (``_poll``). The training loop never waits on the
UI and never syncs the device for it. Front ends (Colab, VS Code) and the fallback where widgets cannot render:
``_frontends``, ``_fallback``.

Its parts (view, charts, compare menu, controls, memory savers, plan view, side actions, summary) call it back only
through small protocols of public members (``PumpHost``, ``ActionsHost``, ``PlanHost``), never its private names.
"""

from __future__ import annotations

import os
import re
import warnings
from typing import Any

import ipywidgets as W

from . import _fallback, _frontends, _notebook
from ._actions import PanelActions
from ._charts import LiveCharts
from ._compare_runs import CompareRuns
from ._controls import Controls
from ._display import SummaryDisplay
from ._forms import parse_panel_args
from ._health_card import HealthCard
from ._layouts import layout_scope
from ._lifecycle import close_widgets, end_run, on_close, say_foreground, wait_run
from ._looks import Looks
from ._plan_view import PlanView
from ._pump import UiPump
from ._restore import guard_restore
from ._runner import Feed, Run, claim_model
from ._savers import Savers
from ._view import HIDE_STATIC, PanelView

__all__ = ["TrainerWidget"]

_counter = iter(range(1, 1 << 30))


class TrainerWidget:
    """A training panel: live charts, progress, controls (LR, accumulation, precision...) and buttons.

    Args:
        model: the model (model form: the panel builds the Trainer) or a built :class:`nbtrainer.Trainer`
            (trainer form: steered as configured).
        *args: ``criterion, optimizer, train_loader[, val_loader]`` (model form) or
            ``train_loader[, val_loader]`` (trainer form).
        train_loader, val_loader: the loaders, when not given positionally; or arrays (``(x, y)``, a dict of
            arrays) with ``batch_size`` and ``shuffle`` as for ``Trainer.fit``.
        metrics: the Trainer's ``metrics=`` (model form only).
        epochs: the epochs of a run (the panel's epochs control starts there).
        max_steps: stop a run after this many optimizer steps (default: no limit).
        ui_interval: seconds between two pushes of the UI thread (default 0.25, at least 0.05; 0.5 in VS Code, Colab).
        max_points: the points kept per chart series (min/max decimated; default 2000).
        smoothing: the EMA weight of the smoothed loss curve (default 0.9).
        save_path: the Save button's checkpoint path (default ``checkpoints/<name>.ckpt``, the name file-safe).
        name: the panel's name (``w.name``): its title, messages, errors, default checkpoint path and, given, its
            runs' name in the run store (``nbtrainer.Runs``) and every compare menu. Default ``"<model class> #<n>"``
            (``n`` counting this kernel's panels), so two panels are told apart and never save to one file.
        interpret: the errors section: ``trainer.interpret(val_loader)`` after each validation (``_looks``).
        **trainer_options: any other :class:`nbtrainer.Trainer` option (model form only): ``precision=``,
            ``grad_accum_steps=``...

    Example:
        >>> w = TrainerWidget(model, torch.nn.CrossEntropyLoss(), torch.optim.AdamW(model.parameters()),
        ...                   train_loader, val_loader, epochs=3)          # doctest: +SKIP
        >>> w                     # shows the panel; click Start (or w.start(); w.wait())  # doctest: +SKIP
        >>> TrainerWidget(other_model, loss, optimizer, train_loader, name="baseline")  # doctest: +SKIP
    """

    def __init__(
        self,
        model: Any,
        *args: Any,
        train_loader: Any = None,
        val_loader: Any = None,
        batch_size: int | None = None,
        shuffle: bool | None = None,
        metrics: Any = None,
        epochs: int = 1,
        max_steps: int | None = None,
        ui_interval: float = 0.25,
        max_points: int = 2000,
        smoothing: float = 0.9,
        save_path: str | None = None,
        name: str | None = None,
        interpret: bool | dict[str, Any] = False,
        **trainer_options: Any,
    ) -> None:
        guard_restore()  # before the first widget: a page's restore must not take their comms over (_restore)
        a = parse_panel_args(  # its own keywords (panel=): a misspelt one is named with the closest valid one
            model, args, train_loader=train_loader, val_loader=val_loader, batch_size=batch_size, shuffle=shuffle,
            metrics=metrics, epochs=epochs, trainer_options=trainer_options, panel=TrainerWidget.__init__,
        )  # fmt: skip
        trainer, user_model, self._build, self._rebatch = a.trainer, a.model, a.build, a.rebatch
        self.trainer, self.train_loader, self.val_loader = trainer, a.train_loader, a.val_loader
        self.max_steps = max_steps
        self.ui_interval = _frontends.detect().ui_interval(max(0.05, float(ui_interval)))  # VS Code, Colab: >= 0.5 s
        self._model = user_model
        self.name = str(name) if name else f"{type(user_model).__name__} #{next(_counter)}"
        self._run_name = self.name if name else None  # a name given here names the runs in the run store too
        self._label = f"TrainerWidget '{self.name}'"
        self._run: Run | None = None
        self._pump: UiPump | None = None
        self._paused_requested = self._closed = False
        self._refused: str | None = None  # why the last start() did not train (wait() says so)
        self.ui_update_times: list[float] = []  # when the UI thread pushed (time.monotonic()), every run
        with layout_scope() as self._shared_layouts:  # one Layout per setting for the widgets built here (_layouts)
            self.charts = LiveCharts(max_points=max_points, smoothing=smoothing, lr=trainer.lr)
            store = trainer_options.get("run_store")  # a Trainer passed in records where no public name reports
            self.compare = CompareRuns(self.charts, trainer, run_store=store, max_points=max_points)  # the menu
            looks = {"interpret": interpret, "val_loader": a.val_loader}
            self.looks = Looks(self.charts, lambda: self.trainer, self.notify, **looks)
            self.data_map = self.looks.data.data_map  # the runs' DataMap: its edits are the data section's cleaner's
            self.view = v = PanelView(W.VBox([self.compare.root, self.charts.box, *self.looks.roots]))
            self.panel: W.VBox = v.root
            self.controls = Controls(v, trainer, epochs, self.notify)
            self._actions = PanelActions(
                self, model=user_model, view=v, controls=self.controls, settle=self.looks.data.wait_check
            )
            self._summary = SummaryDisplay(v, label=self._label)
            built = "the panel was given a built Trainer: pass these options to Trainer(...) instead"
            self.savers = Savers(trainer, locked_reason=None if self._build is not None else built)
            self.plan_view = PlanView(self, model=user_model, view=v, savers=self.savers)
            v.controls.children = (*v.controls.children, self.savers.root, self.plan_view.root)
            self.health_card = HealthCard(self, view=v)  # nbtrainer.Health's lights, norms, advice and buttons
            self._show_title()
            slug = re.sub(r"[^\w.-]+", "-", self.name.lower()).strip("-.") or "run"
            v.save_path.value = save_path or os.path.join("checkpoints", f"{slug}.ckpt")
            guarded = self._actions.guarded  # Save, Profile and the LR finder: wired by PanelActions
            v.start.on_click(lambda _: guarded(self.start))
            v.pause.on_click(lambda _: guarded(self.resume if self._paused_requested else self.pause))
            v.stop.on_click(lambda _: guarded(self.stop))
            v.set_status("idle")
            v.set_stats(None, None)
            self._hide_static = W.HTML(HIDE_STATIC, layout=W.Layout(height="0px", margin="0px"))
            self._hide_static.add_class("nbt-style")  # first: asked for before the text it colours (issue 57)
            self.panel.children = (self._hide_static, *self.panel.children)
        self._cell = _notebook.cell_id()
        try:
            msg = claim_model(user_model, owner=self._label, cell=self._cell)
            if msg:
                self.notify("warning", msg)
                warnings.warn(msg, RuntimeWarning, stacklevel=2)
        except RuntimeError as exc:
            self.notify("error", str(exc))
            warnings.warn(str(exc), RuntimeWarning, stacklevel=2)
        self.looks.data.start_check(trainer, self.train_loader, self.val_loader)  # its lights show before Start
        on_close(self.panel, self.close)  # a panel closed (w.panel.close(), Widget.close_all()) ends its run

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
        if self._closed:
            raise RuntimeError(f"{self._label} was closed: make a new panel to train again.")
        if self._run is not None and self._run.alive:
            raise RuntimeError(f"{self._label} is already running; stop() or wait() first.")
        if self._actions.lr_find_running:  # the sweep is training the model (and restores it when it ends)
            raise RuntimeError("The LR finder is running; start when it has finished.")
        if self._pump is not None:
            self._pump.join()  # the previous run's final UI update
        self._refused = None
        self._apply_savers()
        if refused := self.looks.refused():  # waits for the data check (the fit reuses its report)
            self._refused = f"not started: {refused}"
            self.notify("error", self._refused)
            return
        msg = claim_model(self._model, owner=self._label, cell=self._cell)
        if msg:
            self.notify("warning", msg)
        self._before_run()
        self.charts.clear()
        self._summary.mark_previous()  # the last run's summary must not read as this run's
        self._paused_requested = False
        feed = Feed()
        feed.attach(self.trainer)  # the panel is the progress display
        self.looks.attach(self.trainer, self.val_loader)
        kwargs = {"train_loader": self.train_loader, "val_loader": self.val_loader}
        kwargs |= {"epochs": self.epochs, "max_steps": self.max_steps}
        done = lambda r: feed.detach(r.trainer)  # noqa: E731
        self._run = run = Run(self.trainer, id(self._model), kwargs, owner=self._label, on_done=done, cell=self._cell)
        self.set_running(True)
        self.view.set_status("running", "starting")
        try:
            run.start()
        except BaseException:
            feed.detach(run.trainer)
            self.looks.detach(run.trainer)
            self._run = None
            self.set_running(False)
            raise
        t = self.trainer
        self.notify("info", f"run started: {self.epochs} epoch(s), {t.precision}, accumulation {t.grad_accum_steps}")
        self._pump = UiPump(
            self,
            run,
            feed,
            view=self.view,
            charts=self.charts,
            compare=self.compare,
            controls=self.controls,
            interval=self.ui_interval,
            push_times=self.ui_update_times,
            parts=self.looks.parts,
        )
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
        """Stop the run at its next optimizer step (also when paused), or the LR finder's sweep at its next step."""
        run = self._run
        if run is not None and run.alive:
            run.stop(reason)
            self.view.set_status("stopping", reason)
        else:
            self._actions.stop_lr_find()  # the button is the sweep's while it runs (nothing when none runs)

    def wait(self, timeout: float | None = None) -> Any:
        """Block until the run ends; return its History, or re-raise the error that ended it."""
        run = self._run
        if self._refused:  # the last start() trained nothing: neither an error of "no run" nor an earlier run's History
            raise RuntimeError(f"{self._label} {self._refused}")
        if run is None:
            raise RuntimeError(f"{self._label} has not been started: call start() or fit().")
        wait_run(run, label=self._label, view=self.view, timeout=timeout)  # clicks keep working meanwhile
        if self._pump is not None:
            self._pump.join()
        self.publish_summary()  # again from this cell's thread, so it lands in the notebook for sure
        if run.error is not None:
            raise run.error
        return run.history

    def fit(self) -> Any:
        """``start()`` + ``wait()``; without a notebook front end, train in the foreground with console bars.

        While the cell waits, the panel's clicks are handled at once, and a page reloaded (or a second tab)
        gets the panel back live: the front end's requests are answered beside the waiting cell (``_poll``).
        """
        if not _notebook.in_notebook():
            say_foreground(self._model)
            claim_model(self._model, owner=self._label)
            self.looks.data.wait_check()  # its forward must not run beside the fit's (DistillationLoss sees both)
            self._before_run()
            return self.trainer.fit(self.train_loader, self.val_loader, epochs=self.epochs, max_steps=self.max_steps)
        if not self._summary.display_ids:
            from IPython.display import display

            display(self)
        self.start()
        return self.wait()

    def close(self) -> None:
        """Stop the run or the LR finder's sweep (waiting for their threads, and a plan's) and close the panel's
        widgets; the panel cannot start again. Closing ``w.panel`` itself (or ``Widget.close_all()``) does the same."""
        if not self._closed:
            self._closed = True
            self._actions.close()  # the sweep stops at its next step, the model put back; Profile and Save end
            self.plan_view.close()  # a plan being made is cancelled (its row waited for), not drawn
            end_run(self._run, self._pump, "the panel was closed")
            self.looks.data.close_check()  # cancelled at its next batch, not read to the end
            parts = (self.view, self.charts, self.compare, self.looks, self.health_card, self._actions)  # their own
            close_widgets(self.panel, *(w for part in parts for w in part.held), *self._shared_layouts.values())

    def __repr__(self) -> str:
        return f"<{self._label}: {self.status}, {self.trainer!r}>"

    def save_checkpoint(self, path: str | None = None) -> str:
        """Write a checkpoint to ``path`` (default: the panel's save path); mid-run at the next step boundary."""
        return self._actions.save_checkpoint(path)

    def profile(self, **kwargs: Any) -> Any:
        """``nbtrainer.profile_model`` on one batch of the train loader; shown as a ProfileCard in the panel."""
        return self._actions.profile(**kwargs)

    def lr_find(self, **kwargs: Any) -> Any:
        """The LR range test (``Trainer.lr_find``, its ``kwargs``) on the train loader, between runs; returns its
        result. The curve is shown below the charts (``self.lr_finder``): click a point or a "use ..." button to set
        the LR control there. The model and optimizer are put back after the sweep; Stop ends it early."""
        return self._actions.lr_find(**kwargs)

    @property
    def lr_finder(self) -> Any:
        """The ``LRFinderView`` of the last ``lr_find()`` (``None`` before the first)."""
        return self._actions.lr_finder

    @property
    def summary_html(self) -> str | None:
        """The HTML summary of the last run that ended (``None`` before the first)."""
        return self._summary.html

    @property
    def ui_updates(self) -> int:
        """How many batched pushes the UI thread has made to the widgets (all runs of this panel)."""
        return len(self.ui_update_times)

    # -- what the panel's parts call back (UiPump's PumpHost, PanelActions' ActionsHost) ----------------
    @property
    def running(self) -> bool:
        """A run started here is alive (training or paused)."""
        return self._run is not None and self._run.alive

    @property
    def pause_requested(self) -> bool:
        """Pause was pressed (or ``pause()`` called) and the run has not been resumed since."""
        return self._paused_requested

    def use_batch_size(self, batch_size: int) -> bool:
        """Train on batches of ``batch_size`` (a memory plan row's micro-batch): the panel's own loader of the arrays
        given is rebuilt, and checked again; False where the train loader was given (not the panel's to change)."""
        if self._rebatch is None:
            return False
        if getattr(self.train_loader, "batch_size", None) != batch_size:
            self.train_loader = self._rebatch(batch_size)
            self.looks.data.start_check(self.trainer, self.train_loader, self.val_loader)
        return True

    def notify(self, level: str, text: str, details: str | None = None) -> None:
        """Add a line to the panel's messages (``level``: info, warning or error; ``details``: a traceback)."""
        self.view.add_message(level, text, details)

    def set_running(self, running: bool) -> None:
        """Buttons, controls, compare menu and memory savers for a run that is alive or has ended."""
        v = self.view
        v.start.disabled = running
        v.pause.disabled = v.stop.disabled = not running
        v.profile.disabled = v.lrfind.disabled = running
        v.pause.description, v.pause.icon = "Pause", "pause"
        self._paused_requested = False
        self.controls.set_running(running)
        self.compare.follow(self.trainer, running, self.notify)
        self.savers.set_running(running)

    def publish_summary(self, history: Any = None) -> None:
        """Show the summary of ``history`` (if given) in the panel and in every static output slot."""
        self._summary.publish(history, title=f"{type(self._model).__name__} on {self.trainer.device}")

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:  # the panel, with text/plain and text/html (_fallback)
        return _fallback.panel_view(self)._repr_mimebundle_(**kwargs)

    def _ipython_display_(self) -> None:
        """The panel, then a plain-HTML slot that receives the static summary (and its charts) when a run ends."""
        self._summary.display(_fallback.panel_view(self, charts=False))

    # -- internals -------------------------------------------------------------------------------------
    def _show_title(self) -> None:
        self.view.show_title(self.name, self._model, self.trainer)

    def _before_run(self) -> None:  # the LR schedule for this run's length; name= names its runs in the store
        self.controls.apply_schedule(self.train_loader, self.epochs)
        self.trainer.run_recorder.name = self._run_name or self.trainer.run_recorder.name

    def _apply_savers(self) -> None:
        """At Start: the Trainer rebuilt with the memory savers chosen (nothing chosen: keep it)."""
        trainer = self.savers.rebuild(
            self._model, self.trainer, self._build, lr=float(self.view.lr.value), notify=self.notify
        )
        if trainer is not None:
            self.trainer = trainer
            self.controls.use_trainer(trainer)
            self.health_card.watch(trainer)
            self._show_title()
