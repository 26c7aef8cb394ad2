"""The panel's side actions: Save checkpoint, Profile and LR finder (in helper threads), and safe click handlers.

:meth:`PanelActions.close` (the panel's ``close()``) ends them: the LR finder's sweep stops at its next step (the
model and optimizer put back as always) and every helper thread is waited for.

:class:`PanelActions` is a part of the panel; what it needs from the panel (the trainer, which the memory
savers may rebuild at Start, the train loader, the run's status, the messages) is the :class:`ActionsHost`
protocol, so this module depends on no panel class.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from nbtrainer import Trainer, format_lr, start_training_thread

from ._controls import Controls
from ._lifecycle import close_widgets
from ._view import PanelView

__all__ = ["ActionsHost", "PanelActions"]

log = logging.getLogger(__name__)


def _trained_warning(steps: int) -> str:
    done = f"{steps:,} optimizer steps" if steps else "earlier training (the optimizer has state)"
    return (
        f"This model has already been trained ({done}): the LR finder's curve describes these trained weights, "
        "so its suggestion is not a starting LR for a fresh model. Re-create the model and optimizer (re-run "
        "their cell) for a meaningful range test. The weights and optimizer are restored after the sweep."
    )


# Actions that keep Start off while they run, with the message shown when they begin.
_EXCLUSIVE = {
    "profile": "profiling one batch (runs on copies of the model)...",
    "lrfind": "LR finder: sweeping the learning rate on the train loader (model and optimizer are "
    "restored afterwards)...",
}


@runtime_checkable
class ActionsHost(Protocol):
    """What the side actions need from the panel that owns them (``TrainerWidget`` implements it)."""

    @property
    def trainer(self) -> Trainer:
        """The panel's trainer now (the memory savers replace it at Start)."""
        ...

    @property
    def train_loader(self) -> Any:
        """The loader Profile and the LR finder take their batches from."""
        ...

    @property
    def running(self) -> bool:
        """A run started from the panel is alive, training or paused (the actions that train are refused)."""
        ...

    def notify(self, level: str, text: str, details: str | None = None) -> None:
        """A line in the panel's messages (``level``: info, warning or error)."""
        ...


class PanelActions:
    """Save, Profile and the LR finder of one panel (it wires their buttons), and click handlers that run safely.

    Args:
        host: the panel (see :class:`ActionsHost`).
        model: the user's model (Profile copies it).
        view: the panel's view (buttons, save path, the profile and LR finder sections).
        controls: the panel's controls (the LR finder sets the LR through them).
        settle: called before Profile or the LR finder uses the model: waits for what the panel started with it at
            construction (the data check's forward must not run beside the sweep's training steps).

    Example:
        >>> actions = PanelActions(w, model=model, view=w.view, controls=w.controls)  # doctest: +SKIP
        >>> w.view.stop.on_click(lambda _: actions.guarded(w.stop))  # errors: panel messages  # doctest: +SKIP
    """

    def __init__(
        self,
        host: ActionsHost,
        *,
        model: Any,
        view: PanelView,
        controls: Controls,
        settle: Callable[[], None] = lambda: None,
    ) -> None:
        self.host, self.model, self.view, self.controls, self.settle = host, model, view, controls, settle
        self.lr_finder: Any = None  # the LRFinderView of the last lr_find()
        self.profile_card: Any = None  # the ProfileCard of the last profile()
        self.busy: set[str] = set()  # the actions running in helper threads now
        self.threads: dict[str, threading.Thread] = {}  # each action's last helper thread
        self.closed = False  # the panel was closed: nothing more is shown
        self._lr_find_lock = threading.Lock()
        self._lr_find_stop = threading.Event()  # set: the sweep ends at its next step
        view.save.on_click(lambda _: self.in_background("save", self.save_checkpoint))
        view.profile.on_click(lambda _: self.in_background("profile", self.profile))
        view.lrfind.on_click(lambda _: self.guarded(self.click_lr_find))

    @property
    def lr_find_running(self) -> bool:
        """The LR finder is sweeping: it trains the model and puts it back at its end."""
        return self._lr_find_lock.locked()

    def save_checkpoint(self, path: str | None = None) -> str:
        """Write a checkpoint (mid-run: at the next step boundary, from the training thread)."""
        if self.lr_find_running:  # the sweep's weights are not the model's: they are put back at its end
            raise RuntimeError("The LR finder is running: save when it has finished.")
        path = path or self.view.save_path.value
        out = self.host.trainer.save_checkpoint(path)
        self.host.notify("info", f"checkpoint saved to {out} (step {self.host.trainer.global_step})")
        return out

    def profile(self, **kwargs: Any) -> Any:
        """``nbtrainer.profile_model`` on one batch of the train loader; shown as a ProfileCard in the panel."""
        from nbtrainer import precision_support, profile_model
        from nbtrainer.profile import example_batch

        from ._profile_card import ProfileCard

        if self.host.running:
            raise RuntimeError("Profile between runs: it would compete with training for the device.")
        self.settle()
        t = self.host.trainer
        # not next(iter(loader)): a DataLoader's iterator draws its seed from the global RNG, and the next run's data
        # order and dropout would differ from a run without Profile
        args, kw, targets = t.batch_spec.split(example_batch(self.host.train_loader))
        inputs = kw if (kw and not args) else (args[0] if len(args) == 1 else tuple(args))
        kwargs.setdefault("precisions", tuple(p for p, (ok, _) in precision_support(t.device).items() if ok))
        kwargs.setdefault("time_budget_s", 0.5)
        if t.criterion is not None and targets is not None:
            kwargs.setdefault("criterion", t.criterion)
            kwargs.setdefault("targets", targets)
        prof = profile_model(self.model, inputs, devices=(str(t.device),), optimizer=t.optimizer, **kwargs)
        old, self.profile_card = self.profile_card, ProfileCard(prof)
        self.view.profile_section.show(self.profile_card, detail=f"batch size {prof.batch_size}")
        if old is not None:  # replaced: closed (shown or not, its comms would outlive it)
            close_widgets(old)
        return prof

    def lr_find(self, **kwargs: Any) -> Any:
        """The LR range test (``Trainer.lr_find``) on the train loader, shown below the charts.

        Click a point of the curve, or a "use ..." button, to set the LR control to that learning rate.
        The model and optimizer are restored after the sweep. Runs between runs only.

        Args:
            **kwargs: ``min_lr``, ``max_lr``, ``steps``, ``smoothing``, ``diverge``, ``rule`` of
                ``Trainer.lr_find``.

        Returns:
            The ``nbtrainer.LRFinderResult``; the chart is ``self.lr_finder`` (an ``LRFinderView``). ``None`` when
            the panel was closed meanwhile (``close()`` stops the sweep).
        """
        from ._lr_finder import LRFinderView

        if self.host.running:
            raise RuntimeError(
                "The LR finder runs between runs (it trains the model, then restores it): "
                "stop the run or wait for it to end."
            )
        if self.closed:
            raise RuntimeError("The panel was closed: make a new panel to run the LR finder.")
        if not self._lr_find_lock.acquire(blocking=False):
            raise RuntimeError("The LR finder is already running.")
        try:
            self._lr_find_stop.clear()  # a Stop of an earlier sweep; one pressed from here on (settle too) counts
            self.settle()
            t = self.host.trainer
            # Optimizer steps already taken on these weights: a range test on a trained model describes that
            # model, not a fresh start, so its suggestion must not be read as a starting LR.
            trained = t.global_step or (1 if t.optimizer is not None and len(t.optimizer.state) else 0)
            warning = _trained_warning(t.global_step) if trained else None  # the sweep restores global_step
            if warning:
                self.host.notify("warning", warning)
            if self.closed:  # closed while it waited for the data check (close() sets the event after this flag)
                return None
            result = t.lr_find(self.host.train_loader, stop=self._lr_find_stop, **kwargs)
        finally:
            self._lr_find_lock.release()
        if self.closed:  # stopped by close(): its widgets are going
            return None
        old = self.lr_finder
        self.lr_finder = LRFinderView(
            result,
            on_choose=self.controls.choose_lr,
            lr=self.controls.lr.value,
            warning=warning,
        )
        self.view.lrfinder_section.show(self.lr_finder.root, detail=f"{len(result.lrs)} steps")
        if old is not None:  # replaced: closed (shown or not, its comms would outlive it)
            close_widgets(old.root)
        sug = "none" if result.suggestion is None else format_lr(result.suggestion)
        self.host.notify(
            "info",
            f"LR finder: {len(result.lrs)} steps, {result.stop_reason}; suggestion {sug} "
            f"({result.rule}). Click the curve or a 'use' button to set the LR.",
        )
        return result

    def guarded(self, fn: Callable[[], Any]) -> None:
        """Click handlers: an error becomes a panel message (an exception there would be lost in a log)."""
        try:
            fn()
        except Exception as exc:
            log.debug("a panel action failed: said in the panel (a click never takes the kernel down)", exc_info=True)
            self.host.notify("error", f"{type(exc).__name__}: {exc}")

    def in_background(self, name: str, fn: Callable[[], Any]) -> None:
        """Run action ``name`` (save, profile or lrfind) in a helper thread, its buttons off meanwhile."""
        if name in self.busy:
            return
        self.busy.add(name)
        v = self.view
        button = {"save": v.save, "profile": v.profile, "lrfind": v.lrfind}[name]
        exclusive = (v.start, v.profile, v.lrfind)  # Profile and the LR finder: one at a time, never with a run
        # The sweep trains the real model: no Save (it would write the sweep's weights) and no LR control
        # (the restore at its end would silently undo a change made meanwhile).
        locked = (
            button,
            *(exclusive if name in _EXCLUSIVE else ()),
            *((v.save, v.lr, v.lr_exact) if name == "lrfind" else ()),
        )
        for widget in locked:
            widget.disabled = True
        if name == "lrfind":
            v.stop.disabled = False  # Stop ends the sweep (stop_lr_find)
        if name in _EXCLUSIVE:
            self.host.notify("info", _EXCLUSIVE[name])

        def target() -> None:
            try:
                fn()
            except Exception as exc:
                log.debug("a panel action's thread failed: said in the panel", exc_info=True)
                self.host.notify("error", f"{name} failed: {type(exc).__name__}: {exc}")
            finally:
                self.busy.discard(name)
                off = self.host.running or bool(self.busy & _EXCLUSIVE.keys())
                button.disabled = False
                for widget in exclusive:
                    widget.disabled = off
                if name == "lrfind":
                    # Stop first, the LR control last: one that is usable again means the sweep has ended (a click,
                    # or a test, that reads the LR control on saw Stop still on under load)
                    v.stop.disabled = not self.host.running
                    v.save.disabled = "save" in self.busy
                    v.lr.disabled = v.lr_exact.disabled = False

        # Profile and the LR finder train (and Profile times steps): their thread must not be throttled by the
        # kernel thread's idle OpenMP pool (nbtrainer.start_training_thread gives it back first; issue 49).
        stop = self._lr_find_stop.set if name == "lrfind" else None  # at interpreter exit, ends the sweep first
        self.threads[name] = start_training_thread(target, name=f"nbtrainer-{name}", stop=stop)

    def stop_lr_find(self) -> bool:
        """Stop pressed while the LR finder sweeps: it ends at its next step, the model and optimizer put back, and
        its curve so far is shown. False when no sweep is running."""
        if not self.lr_find_running:
            return False
        self._lr_find_stop.set()
        self.host.notify("info", "LR finder: stopping at its next step (the model and optimizer are put back)")
        return True

    @property
    def held(self) -> tuple[Any, ...]:
        """The last profile card and LR finder chart: out of the panel's tree once a person closes their area (the
        panel closes them with itself)."""
        return tuple(w for w in (self.profile_card, getattr(self.lr_finder, "root", None)) if w is not None)

    def close(self) -> None:
        """Stop the LR finder's sweep (at its next step; the model and optimizer are put back) and wait for every
        helper thread (the sweep, Profile, Save), so that nothing of this panel's runs after it is closed."""
        self.closed = True
        self._lr_find_stop.set()
        for thread in list(self.threads.values()):
            if thread is not threading.current_thread():
                thread.join()

    def click_lr_find(self) -> None:
        """The LR finder button: refused at once (a panel message) while a run is alive, else a helper thread."""
        if self.host.running:
            raise RuntimeError("LR finder: stop the run first (the sweep trains the model, then restores it).")
        if "save" in self.busy:
            raise RuntimeError("LR finder: a checkpoint is being written; try again when it is saved.")
        self.in_background("lrfind", self.lr_find)
