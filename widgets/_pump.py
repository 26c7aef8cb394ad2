"""The panel's UI thread for one run: at most one batched push every ``interval`` seconds.

It drains the :class:`Feed` the training thread fills, feeds the charts (which decimate), and updates
the header, progress, stat cards, epoch table and charts inside ``hold_sync`` blocks, so each widget sends
one message per push. When the run has ended it makes one final push and writes the summary.

The status badge is honest because it is derived from the same ordered stream as the numbers: "paused"
comes from the progress snapshot the loop sends once it holds at a step boundary, "stopped" only after the
training thread has returned and its last progress has been drawn in the same push. A click shows
"pausing" / "stopping" at once (true: requested, not yet reached).
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from typing import Any

from nbtrainer import format_duration, format_number
from nbtrainer.plotting import change_label, higher_is_better

from ._runner import Feed, Run

__all__ = ["UiPump"]

_LIVE = ("running", "pausing", "paused", "stopping")


class UiPump:
    def __init__(self, widget: Any, run: Run, feed: Feed) -> None:
        self.w, self.run, self.feed = widget, run, feed
        self.interval = widget.ui_interval
        self.progress: Any = None
        self.stream_status = "running"  # the status the last drained item implies
        self.best: tuple[str, float, Any] | None = None
        self._warned_nonfinite = False
        self._table_pending, self._table_at = False, 0.0  # the epoch table's last push (rate-limited)
        self.cpu_live_s = 0.0  # CPU time of this thread while the run was alive (what it can take from training)
        self.cpu_total_s = 0.0  # ... including the final push and the summary
        self.thread = threading.Thread(target=self._main, name=f"nbtrainer-ui ({run.owner})", daemon=True)

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
            items = feed.drain()
            if final:
                self.cpu_live_s = time.thread_time() - cpu0
            if items or final:
                try:
                    self._apply(items, final)
                except Exception as exc:  # the UI thread must outlive a drawing bug
                    self.w._notify("error", f"panel update failed: {type(exc).__name__}: {exc}")
                last = time.monotonic()
            if final:
                self._finish()  # after the last progress was drawn: only now the final status
                return

    def _apply(self, items: list[tuple[str, Any]], final: bool) -> None:
        w, charts = self.w, self.w.charts
        epochs_changed = False
        for kind, payload in items:
            if kind == "progress":
                self.progress = payload
                self.stream_status = payload.status if payload.status in _LIVE else self.stream_status
                charts.add_memory(payload.global_step, payload.memory, payload.memory_capacity)
                if charts.add_steps(payload.step_points) and not self._warned_nonfinite:
                    self._warned_nonfinite = True
                    w._notify(
                        "warning",
                        f"non-finite loss by step {payload.global_step}: check the LR, the data and the precision",
                    )
            elif kind == "epoch":
                charts.add_epoch(payload)
                self._update_best(payload)
                epochs_changed = True
            elif kind == "control":
                self._control(payload)
        v, p = w.view, self.progress
        with contextlib.ExitStack() as stack:
            for widget in (v.status, v.epoch_bar, v.step_bar, v.progress_info, v.stats, v.epoch_table):
                stack.enter_context(widget.hold_sync())
            if p is not None:
                if final:
                    p.status = self.run.status
                v.set_progress(p)
            v.set_stats(self.best, p)
            # "show all" resends every row: at most once a second (the newest rows alone: each epoch)
            table_due = epochs_changed or self._table_pending
            if table_due and v.epoch_all.value and not final and time.monotonic() - self._table_at < 1.0:
                self._table_pending, table_due = True, False
            if table_due:
                self._table_pending, self._table_at = False, time.monotonic()
                v.set_epoch_rows(charts.rows)
                if v.epoch_section.body.children != (v.epoch_area,):
                    v.epoch_section.show(v.epoch_area)
                v.epoch_section.set_title("epochs", f"{len(charts.rows)} so far")
            if not final:
                v.set_status(*self._live_status(p))
            charts.render()
            w.compare.draw()  # the overlays follow the loss axis (linear/log) and the live epoch length
        w.ui_updates += 1
        w.ui_update_times.append(time.monotonic())

    def _control(self, event: dict[str, Any]) -> None:
        w, kind = self.w, event["kind"]
        w.charts.add_event(event)
        w.controls.on_event(event)
        # "paused" comes only from the progress snapshot the loop sends once it holds (it carries the step it
        # holds at); the "pause" event is emitted just before it, so it would show a stale step.
        if kind == "resume":
            self.stream_status = "running"
        elif kind in ("lr", "grad_accum_steps"):
            w._notify("info", change_label(event) or kind)

    def _live_status(self, p: Any) -> tuple[str, str]:
        run, w = self.run, self.w
        status = self.stream_status
        if run.stop_reason and status != "paused":
            return "stopping", run.stop_reason
        if status == "running" and w._paused_requested:
            return "pausing", "at the next optimizer step"
        if status == "paused":
            return "paused", f"at step {format_number(p.global_step)}" if p is not None else ""
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
        w, run = self.w, self.run
        h = run.history if run.history is not None else w.trainer.history
        steps = h.steps["step"]
        n_steps = int(steps[-1]) if steps else 0
        if run.error is not None:
            w._notify("error", f"training failed: {type(run.error).__name__}: {run.error}", run.traceback)
        else:
            reason = f" ({h.stop_reason})" if h.stop_reason else ""
            took = format_duration(self.progress.elapsed) if self.progress is not None else "?"
            w._notify(
                "info",
                f"run {run.status}{reason} after {len(h.epochs)} epoch(s), "
                f"{format_number(n_steps)} optimizer steps, {took}",
            )
        detail = (h.stop_reason or "") if run.status != "finished" else f"{len(h.epochs)} epoch(s)"
        w.view.set_status(run.status, detail)
        w._set_running(False)
        try:
            w._publish_summary(h)
        except Exception as exc:
            w._notify("warning", f"could not write the summary: {type(exc).__name__}: {exc}")
