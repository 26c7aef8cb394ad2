"""The panel's UI thread for one run: at most one batched push every ``interval`` seconds.

It drains the :class:`Feed` the training thread fills, feeds the charts (which decimate), and updates
the header, progress, stat cards and charts inside ``hold_sync`` blocks, so each widget sends one
message per push. When the run has ended it makes one final push and writes the static summary.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from typing import Any

from ._runner import Feed, Run
from ._summary import higher_is_better, summary_html
from ._view import fmt_duration

__all__ = ["UiPump", "peak_memory"]


def peak_memory(device: Any) -> str:
    try:
        import torch

        if device.type == "cuda":  # allocator counters, read on the host: no device sync
            return f"{torch.cuda.max_memory_allocated(device) / 2**30:.2f} GiB (CUDA)"
        import resource

        return f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB (process RSS)"
    except Exception:
        return "n/a"


class UiPump:
    def __init__(self, widget: Any, run: Run, feed: Feed) -> None:
        self.w, self.run, self.feed = widget, run, feed
        self.interval = widget.ui_interval
        self.progress: Any = None
        self.best: tuple[str, float, Any] | None = None
        self._warned_nonfinite = False
        self.cpu_live_s = 0.0  # CPU time of this thread while the run was alive (what it can take from training)
        self.cpu_total_s = 0.0  # ... including the final push and the static summary
        self.thread = threading.Thread(target=self._main, name=f"nbtrainer-ui ({run.owner})", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def join(self, timeout: float | None = None) -> None:
        self.thread.join(timeout)

    def _main(self) -> None:
        run, feed, last = self.run, self.feed, 0.0
        cpu0 = time.thread_time()
        try:
            self._loop(run, feed, last, cpu0)
        finally:
            self.cpu_total_s = time.thread_time() - cpu0

    def _loop(self, run: Run, feed: Feed, last: float, cpu0: float) -> None:
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
                except Exception as exc:
                    self.w._notify("error", f"panel update failed: {type(exc).__name__}: {exc}")
                last = time.monotonic()
            if final:
                return

    def _apply(self, items: list[tuple[str, Any]], final: bool) -> None:
        w, charts, run = self.w, self.w.charts, self.run
        for kind, payload in items:
            if kind == "progress":
                self.progress = payload
                if charts.add_steps(payload.step_points) and not self._warned_nonfinite:
                    self._warned_nonfinite = True
                    w._notify(
                        "warning",
                        f"non-finite loss by step {payload.global_step}: check the LR, the data and the precision",
                    )
            elif kind == "epoch":
                charts.add_epoch(payload)
                self._update_best(payload)
            elif kind == "control":
                charts.add_event(payload)
                w.controls.on_event(payload)
                if payload["kind"] in ("lr", "grad_accum_steps"):
                    w._notify(
                        "info",
                        f"step {payload['step']}: {payload['kind']} {payload['old']:.4g} -> {payload['new']:.4g}",
                    )
        v, p = w.view, self.progress
        with contextlib.ExitStack() as stack:
            for widget in (v.status, v.epoch_bar, v.step_bar, v.progress_info, v.stats):
                stack.enter_context(widget.hold_sync())
            if p is not None:
                if final:
                    p.status = run.status
                v.set_progress(p)
            v.set_stats(self.best, peak_memory(w.trainer.device), p)
            if not final:
                status = "stopping" if run.stop_reason else w.status
                detail = run.stop_reason or (f"epoch {p.epoch}/{p.epochs}" if p is not None else "")
                if status == "running" and w._paused_requested:
                    detail = "pausing at the next step"
                v.set_status(status, detail)
            charts.render()
        w.ui_updates += 1
        w.ui_update_times.append(time.monotonic())
        if final:
            self._finish()

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
        if run.error is not None:
            w._notify("error", f"training failed: {type(run.error).__name__}: {run.error}", run.traceback)
        else:
            reason = f" ({h.stop_reason})" if h.stop_reason else ""
            took = fmt_duration(self.progress.elapsed) if self.progress is not None else "?"
            w._notify(
                "info",
                f"run {run.status}{reason} after {len(h.epochs)} epoch(s), {len(h.steps['step']):,} steps, {took}",
            )
        w.view.set_status(run.status, (h.stop_reason or "") if run.status != "finished" else "")
        w._set_running(False)
        try:
            w.summary_html = summary_html(h, title=f"{type(w._model).__name__} on {w.trainer.device}")
            w._publish_summary()
        except Exception as exc:
            w._notify("warning", f"could not write the static summary: {exc}")
