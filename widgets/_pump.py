"""The panel's UI thread for one run: at most one batched push every ``interval`` seconds.

It drains the :class:`Feed` the training thread fills, feeds the charts (which decimate), and updates
the header, progress, stat cards, epoch table and charts inside ``hold_sync`` blocks, so each widget sends
one message per push. When the run has ended it makes one final push and writes the summary.

The status badge is honest because it is derived from the same ordered stream as the numbers: "paused"
comes from the progress snapshot the loop sends once it holds at a step boundary, "stopped" only after the
training thread has returned and its last progress has been drawn in the same push. A click shows
"pausing" / "stopping" at once (true: requested, not yet reached).

The pump draws into the panel's parts (view, charts, compare menu, controls), which it is given; what it needs
from the panel itself (messages, the buttons' running state, the summary, whether a pause was asked for) is the
small :class:`PumpHost` protocol, so this module depends on no panel class.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import math
import threading
import time
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from nbtrainer import format_duration, format_number, release_openmp_pool
from nbtrainer.plotting import change_label, higher_is_better

from ._charts import LiveCharts
from ._compare_runs import CompareRuns
from ._controls import Controls
from ._flow import PageFlow
from ._frontends import detect
from ._health_card import HealthCard
from ._runner import Feed, Run
from ._view import PanelView

__all__ = ["LivePart", "PumpHost", "UiPump", "skipped_words"]

log = logging.getLogger(__name__)

_LIVE = ("running", "pausing", "paused", "stopping")
# A browser redraws a bqplot mark from scratch for every message, and a loaded one falls behind a fast stream:
# the status badge then waits in the page's queue behind chart updates (measured: 11 s, with a 2,000-epoch run's
# charts sending ~35,000 points a second at ui_interval=0.1 next to two test suites). So the heavy parts have a
# budget: the charts send at most _POINTS_PER_S points a second, the epoch table _CELLS_PER_S cells ("show all"
# of 500 rows: every 2 s or so). A short run's charts still move at every push, a long run's (thousands of
# points per line) about once a second. The status, bars and stat cards, a few bytes each, go at every push.
_POINTS_PER_S = 8_000
_CELLS_PER_S = 2_000


@runtime_checkable
class PumpHost(Protocol):
    """What the UI thread needs from the panel that owns the run (``TrainerWidget`` implements it)."""

    @property
    def pause_requested(self) -> bool:
        """A pause was asked for and the run has not been resumed since (the badge says "pausing")."""
        ...

    def notify(self, level: str, text: str, details: str | None = None) -> None:
        """A line in the panel's messages (``level``: info, warning or error; ``details``: e.g. a traceback)."""
        ...

    def set_running(self, running: bool) -> None:
        """Buttons and controls for a run that is alive (``True``) or has ended (``False``)."""
        ...

    def publish_summary(self, history: Any = None) -> None:
        """Show the summary of ``history`` in the panel and in its static output slots."""
        ...

    @property
    def health_card(self) -> HealthCard:
        """The panel's health card (``_health_card``): the pump hands it the reports and has it redraw."""
        ...


class LivePart(Protocol):
    """A section the UI thread redraws at each push from what the run has made so far (the samples section reads
    ``history.samples``, the errors section its latest interpretation, the data section its map): ``refresh(final,
    whole)`` draws what is new (``final``: the run has ended), all of it when ``whole`` (the run holds or has ended),
    else what its budget allows; ``pending()``: something its budget held back is due (a paused run's pushes carry
    no new items to bring it)."""

    def refresh(self, final: bool = False, whole: bool = False) -> bool: ...

    def pending(self) -> bool: ...


class UiPump:
    """The UI thread of one run: drains ``feed`` and draws into the panel's parts until ``run`` is done.

    Args:
        host: the panel (messages, running state, summary; see :class:`PumpHost`).
        run: the run whose training thread fills ``feed``.
        feed: the run's event feed.
        view, charts, compare, controls: the panel's parts it draws into.
        interval: at least this many seconds between two pushes.
        push_times: each push appends its ``time.monotonic()`` here (the panel's ``ui_update_times``).
        parts: sections redrawn at each push (:class:`LivePart`).

    Example:
        >>> pump = UiPump(w, run, feed, view=w.view, charts=w.charts, compare=w.compare,
        ...               controls=w.controls, interval=0.25, push_times=w.ui_update_times)  # doctest: +SKIP
        >>> pump.start(); run.join(); pump.join()  # doctest: +SKIP
    """

    def __init__(
        self,
        host: PumpHost,
        run: Run,
        feed: Feed,
        *,
        view: PanelView,
        charts: LiveCharts,
        compare: CompareRuns,
        controls: Controls,
        interval: float,
        push_times: list[float],
        parts: Sequence[LivePart] = (),
    ) -> None:
        self.host, self.run, self.feed = host, run, feed
        self.parts = tuple(parts)
        self.health: HealthCard = host.health_card  # reports in stream order, lights and norms at every push
        self.view, self.charts, self.compare, self.controls = view, charts, compare, controls
        self.interval = interval
        self._budget = detect().budget  # VS Code, Colab: half (_frontends)
        self.push_times = push_times
        self.progress: Any = None
        # the cause of a skipped step is the run's (precision and on_nonfinite do not change mid-run)
        self.skipped_as = skipped_words(run.trainer.precision, run.trainer.options.step.on_nonfinite)
        self.stream_status = "running"  # the status the last drained item implies
        self.best: tuple[str, float, Any] | None = None
        self._warned_nonfinite = False
        self._rollbacks = 0  # rollback events drawn so far (the History's events have them too, in the same order)
        self._table_pending = False  # epochs arrived that the table does not show yet
        self._table_next = self._charts_next = 0.0  # when the table / the charts may be sent again (budgets)
        self._charts_pending = False  # data the charts hold back until _charts_next
        self.cpu_live_s = 0.0  # CPU time of this thread while the run was alive (what it can take from training)
        self.cpu_total_s = 0.0  # ... including the final push and the summary
        # the page's answers: a push goes only once the page has drawn the one before (_flow); an answer wakes the loop
        self.flow = PageFlow(on_answer=feed.wake.set)
        self.thread = threading.Thread(target=self._main, name=f"nbtrainer-ui ({run.owner})", daemon=True)
        run.followers.append(self.thread)  # joined after the run if the interpreter exits while it trains

    def start(self) -> None:
        self.thread.start()

    def join(self, timeout: float | None = None) -> None:
        self.thread.join(timeout)

    def _main(self) -> None:
        cpu0 = time.thread_time()
        try:
            self._loop(cpu0)
        finally:
            self.cpu_total_s = time.thread_time() - cpu0

    def _loop(self, cpu0: float) -> None:
        run, feed, last = self.run, self.feed, 0.0
        while True:
            final = run.done.is_set()
            if not final:
                feed.wake.wait(self.interval)  # epoch ends / control changes wake it early...
                feed.wake.clear()
                rest = self.interval - (time.monotonic() - last)
                if rest > 0:  # ...but never more often than once per interval
                    run.done.wait(rest)
                final = run.done.is_set()
                if not final and not self.flow.ready():
                    continue  # the page is still drawing the last push: what comes meanwhile goes in the next
            items = feed.drain()
            if final:
                self.cpu_live_s = time.thread_time() - cpu0
            if items or final or self._deferred():
                try:
                    self._apply(items, final)
                except Exception as exc:  # the UI thread must outlive a drawing bug
                    log.debug(
                        "a panel update failed (the UI thread outlives a drawing bug): said in the panel", exc_info=True
                    )
                    self.host.notify("error", f"panel update failed: {type(exc).__name__}: {exc}")
                # a push's torch reads over every item (the data map's table) open an OpenMP pool of this thread's;
                # with two pools libgomp throttles the training thread's spin waits (a tiny MLP on a 96,000-item
                # DataLoader trained at 1.94x headless in the panel, 1.14x with the pool given back after each push)
                release_openmp_pool()
                self.flow.sent()
                last = time.monotonic()
            if final:
                try:
                    self._finish()  # after the last progress was drawn: only now the final status
                finally:
                    self.flow.close()
                return

    def _apply(self, items: list[tuple[str, Any]], final: bool) -> None:
        charts = self.charts
        epochs_changed = False
        for kind, payload in items:
            if kind == "progress":
                self.progress = payload
                self.stream_status = payload.status if payload.status in _LIVE else self.stream_status
                charts.add_memory(payload.global_step, payload.memory, payload.memory_capacity)
                if charts.add_steps(payload.step_points) and not self._warned_nonfinite:
                    self._warned_nonfinite = True
                    self.host.notify(
                        "warning",
                        f"non-finite loss by step {payload.global_step}: check the LR, the data and the precision",
                    )
            elif kind == "epoch":
                charts.add_epoch(payload)
                self._update_best(payload)
                epochs_changed = True
            elif kind == "control":
                self._control(payload)
            elif kind == "health":
                self.health.add(payload)
            elif kind == "start":
                self.health.clear()
        v, p = self.view, self.progress
        now = time.monotonic()
        status = None if final else self._live_status(p)
        # What the badge says holds for all on screen: a run that holds ("paused") or has ended gets the chart
        # and table data its budget held back in the same push, before the badge; otherwise the chart would
        # still move under a "paused" badge.
        whole = status is None or status[0] == "paused"
        with contextlib.ExitStack() as stack:
            for widget in (v.epoch_bar, v.step_bar, v.progress_info, v.stats, v.epoch_table):
                stack.enter_context(widget.hold_sync())
            if p is not None:
                if final:
                    p.status = self.run.status
                v.set_progress(p, self.skipped_as)
            v.set_stats(self.best, p)
            self._table_pending |= epochs_changed
            if self._table_pending and (whole or now >= self._table_next):
                self._table_pending = False
                cells = v.set_epoch_rows(charts.rows)
                self._table_next = now + cells / (_CELLS_PER_S * self._budget)
                if v.epoch_section.body.children != (v.epoch_area,):
                    v.epoch_section.show(v.epoch_area)
                v.epoch_section.set_title("epochs", f"{len(charts.rows)} so far")
        self._charts_pending = not (whole or now >= self._charts_next)
        if not self._charts_pending:
            if charts.render():  # the budget counts from when the data left (a slow render is not a head start)
                self._charts_next = time.monotonic() + sum(charts.sent_points().values()) / (
                    _POINTS_PER_S * self._budget
                )
            self.compare.draw()  # the overlays follow the loss axis (linear/log) and the live epoch length
        for part in self.parts:  # sections that read the run's History or a callback themselves (samples, errors, data)
            part.refresh(final, whole)
        self.health.draw()
        if status is not None:
            v.set_status(*status)
        self.push_times.append(time.monotonic())

    def _deferred(self) -> bool:
        """Data held back by a budget is due (a paused run sends no new items to carry it)."""
        now = time.monotonic()
        return (
            (self._table_pending and now >= self._table_next)
            or (self._charts_pending and now >= self._charts_next)
            or any(part.pending() for part in self.parts)
        )

    def _control(self, event: dict[str, Any]) -> None:
        kind = event["kind"]
        self.charts.add_event(event)
        self.controls.on_event(event)
        # "paused" comes only from the progress snapshot the loop sends once it holds (it carries the step it
        # holds at); the "pause" event is emitted just before it, so it would show a stale step.
        if kind == "resume":
            self.stream_status = "running"
        elif kind == "rollback":  # the charts go back to the checkpoint's step, from the History
            self._rewind_charts(event)
        elif kind in ("lr", "grad_accum_steps"):
            self.host.notify("info", change_label(event) or kind)

    def _rewind_charts(self, event: dict[str, Any]) -> None:
        """The charts back to the checkpoint's step, from the History: its steps and epochs, the LR / accumulation
        changes still in effect there (each marker after the steps before it, on their loss), the memory up to it."""
        history, step, charts = self.run.trainer.history, event["new"], self.charts
        self._rollbacks += 1
        changes: list[dict[str, Any]] = []
        seen = 0
        for e in list(history.events):  # in order: an earlier rollback undid the changes after the step it went to
            if e.get("kind") == "rollback":
                seen += 1
                if seen == self._rollbacks:  # this one (the later events arrive through the feed)
                    break
                changes = [c for c in changes if (c.get("step") or 0) <= e["new"]]
            else:  # the charts mark the LR and accumulation changes among them
                changes.append(e)
        s = history.steps
        points = [p for p in zip(s["step"], s["loss"], s["lr"], strict=False) if p[0] <= step]
        xs = [p[0] for p in points]
        charts.clear(memory_through=step)
        done = 0
        for change in (c for c in changes if (c.get("step") or 0) <= step):
            upto = bisect.bisect_right(xs, change.get("step") or 0)
            charts.add_steps(points[done:upto])
            done = max(done, upto)
            charts.add_event(change)
        charts.add_steps(points[done:])
        for row in [r for r in history.epochs if r.get("steps", 0) <= step]:
            charts.add_epoch(row)
        self.host.notify("info", f"rolled back to step {step} ({event.get('path')})")

    def _live_status(self, p: Any) -> tuple[str, str]:
        run = self.run
        status = self.stream_status
        # The loop tells the changes made while it held (LR, accumulation) at the boundary where it leaves the hold,
        # one event each, and "resume" last; a push that drains the first of them alone still has "paused" from the
        # stream, a stale badge flashed after Resume. The trainer's status leaves "paused" before those events go.
        stale = status == "paused" and run.trainer.status != "paused"
        if stale:
            status = "running"
        if run.stop_reason and status != "paused":
            return "stopping", run.stop_reason
        if status == "running" and self.host.pause_requested:
            return "pausing", "at the next optimizer step"
        if status == "paused":
            return "paused", f"at step {format_number(p.global_step)}" if p is not None else ""
        if stale:
            return "running", "resuming"
        return status, (f"epoch {p.epoch}/{p.epochs}" if p is not None else "")

    def _update_best(self, logs: dict[str, Any]) -> None:
        keys = [k for k in logs if k.startswith("val_") and isinstance(logs[k], (int, float))]
        key = "val_loss" if "val_loss" in keys else (keys[0] if keys else None)
        if key is None or not math.isfinite(logs[key]):
            return
        value = float(logs[key])
        best = self.best
        if best is None or (value > best[1] if higher_is_better(key) else value < best[1]):
            self.best = (key, value, logs.get("epoch"))

    def _finish(self) -> None:
        host, run = self.host, self.run
        h = run.history
        if h is None:  # fit refused the run before its first step: no summary (the last run's stays "previous")
            error = f"{type(run.error).__name__}: {run.error}"
            host.notify("error", f"training failed: {error}", run.traceback)
            self.view.set_status(run.status, error)
            host.set_running(False)
            return
        steps = h.steps["step"]
        n_steps = int(steps[-1]) if steps else 0
        if run.error is not None:
            host.notify("error", f"training failed: {type(run.error).__name__}: {run.error}", run.traceback)
        else:
            reason = f" ({h.stop_reason})" if h.stop_reason else ""
            took = format_duration(self.progress.elapsed) if self.progress is not None else "?"
            host.notify(
                "info",
                f"run {run.status}{reason} after {len(h.epochs)} epoch(s), "
                f"{format_number(n_steps)} optimizer steps, {took}",
            )
        detail = (h.stop_reason or "") if run.status != "finished" else f"{len(h.epochs)} epoch(s)"
        self.view.set_status(run.status, detail)
        host.set_running(False)
        try:
            host.publish_summary(h)
        except Exception as exc:
            log.debug("the summary could not be written: said in the panel", exc_info=True)
            host.notify("warning", f"could not write the summary: {type(exc).__name__}: {exc}")


def skipped_words(precision: str, on_nonfinite: str) -> str:
    """What skipped a run's steps, as the progress line says it: fp16's GradScaler (an overflow) or
    ``on_nonfinite="skip"``/``"stop"`` (a non-finite loss); an fp16 run that skips non-finite losses may have both,
    and the run total (``skipped_steps``) does not tell them apart."""
    fp16 = precision == "fp16-mixed"
    nonfinite = on_nonfinite in ("skip", "stop")
    if fp16 and nonfinite:
        return "skipped steps (fp16 overflow or non-finite loss)"
    if nonfinite:
        return "skipped steps (non-finite loss)"
    return "fp16-skipped steps (overflow)" if fp16 else "skipped steps"
