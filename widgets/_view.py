"""The panel's widgets and their stable CSS classes, plus the text they show. No training logic here."""

from __future__ import annotations

import html
import math
import threading
from typing import Any

import ipywidgets as W

from ._summary import fmt

__all__ = ["STATUS_COLORS", "PanelView", "fmt_duration"]

STATUS_COLORS = {
    "idle": "#777",
    "running": "#1a7f37",
    "paused": "#b08800",
    "stopping": "#b08800",
    "finished": "#0969da",
    "stopped": "#6e40c9",
    "failed": "#cf222e",
    "interrupted": "#6e40c9",
}
_WIDE = {"description_width": "initial"}
MAX_MESSAGES = 50


def fmt_duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "?"
    s = round(seconds)
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def _cls(widget: W.Widget, *names: str) -> W.Widget:
    for name in names:
        widget.add_class(name)
    return widget


def _card(label: str, value: str, sub: str = "") -> str:
    extra = f"<div style='font-size:10px;color:#666'>{html.escape(sub)}</div>" if sub else ""
    return (
        f"<div class='nbt-stat' style='display:inline-block;min-width:120px;margin:2px 6px 2px 0;padding:4px 8px;"
        f"border:1px solid #ddd;border-radius:4px'><div style='font-size:10px;color:#666'>{html.escape(label)}"
        f"</div><div style='font-size:14px;font-weight:bold'>{html.escape(value)}</div>{extra}</div>"
    )


class PanelView:
    """Every widget of the panel. ``root`` is what is displayed; classes are listed in the package docstring."""

    def __init__(self, charts_box: W.Widget) -> None:
        self.title = _cls(W.HTML(), "nbt-title")
        self.status = _cls(W.HTML(), "nbt-status")
        self.header = _cls(
            W.HBox([self.title, self.status], layout=W.Layout(justify_content="space-between", align_items="center")),
            "nbt-header",
        )
        self.precision = _cls(
            W.Dropdown(description="precision", style=_WIDE, layout=W.Layout(width="210px")), "nbt-precision"
        )
        self.accum = _cls(
            W.BoundedIntText(
                value=1, min=1, max=4096, description="grad accum", style=_WIDE, layout=W.Layout(width="150px")
            ),
            "nbt-accum",
        )
        self.lr = _cls(
            W.FloatLogSlider(
                value=1e-3,
                base=10,
                min=-6,
                max=0,
                step=0.01,
                description="LR",
                readout_format=".2e",
                continuous_update=False,
                style=_WIDE,
                layout=W.Layout(width="330px"),
            ),
            "nbt-lr",
        )
        self.epochs = _cls(
            W.BoundedIntText(
                value=1, min=1, max=1_000_000, description="epochs", style=_WIDE, layout=W.Layout(width="140px")
            ),
            "nbt-epochs",
        )
        self.scheduler = _cls(
            W.Dropdown(description="schedule", style=_WIDE, layout=W.Layout(width="230px")), "nbt-scheduler"
        )
        self.max_grad_norm = _cls(
            W.BoundedFloatText(
                value=0.0,
                min=0.0,
                max=1e9,
                step=0.1,
                description="clip grad norm (0: off)",
                style=_WIDE,
                layout=W.Layout(width="230px"),
            ),
            "nbt-clip",
        )
        self.checkpointing = _cls(
            W.Checkbox(
                value=False, description="activation checkpointing", indent=False, layout=W.Layout(width="210px")
            ),
            "nbt-checkpointing",
        )
        self.precision_note = _cls(W.HTML(), "nbt-precision-note")
        self.controls = _cls(
            W.VBox(
                [
                    W.HBox([self.precision, self.accum, self.lr, self.epochs], layout=W.Layout(flex_flow="row wrap")),
                    W.HBox(
                        [self.scheduler, self.max_grad_norm, self.checkpointing], layout=W.Layout(flex_flow="row wrap")
                    ),
                    self.precision_note,
                ]
            ),
            "nbt-controls",
        )

        self.start = _cls(W.Button(description="Start", icon="play", button_style="success"), "nbt-start")
        self.pause = _cls(W.Button(description="Pause", icon="pause", disabled=True), "nbt-pause")
        self.stop = _cls(W.Button(description="Stop", icon="stop", button_style="danger", disabled=True), "nbt-stop")
        self.save = _cls(W.Button(description="Save checkpoint", icon="save"), "nbt-save")
        self.save_path = _cls(W.Text(placeholder="checkpoint path", layout=W.Layout(width="240px")), "nbt-save-path")
        self.profile = _cls(W.Button(description="Profile", icon="tachometer"), "nbt-profile")
        self.lrfind = _cls(
            W.Button(
                description="LR finder",
                icon="search",
                tooltip="LR range test on the train loader; click its curve to set the LR",
            ),
            "nbt-lrfind",
        )
        self.buttons = _cls(
            W.HBox(
                [self.start, self.pause, self.stop, self.save, self.save_path, self.profile, self.lrfind],
                layout=W.Layout(flex_flow="row wrap"),
            ),
            "nbt-buttons",
        )

        self.epoch_bar = _cls(
            W.IntProgress(value=0, min=0, max=1, description="epoch 0/?", style=_WIDE, layout=W.Layout(width="48%")),
            "nbt-progress-epoch",
        )
        self.step_bar = _cls(
            W.IntProgress(value=0, min=0, max=1, description="batch 0/?", style=_WIDE, layout=W.Layout(width="48%")),
            "nbt-progress-step",
        )
        self.progress_info = _cls(W.HTML(), "nbt-progress-info")
        self.progress = _cls(W.VBox([W.HBox([self.epoch_bar, self.step_bar]), self.progress_info]), "nbt-progress")

        self.stats = _cls(W.HTML(), "nbt-stats")
        self.profile_area = _cls(W.VBox(), "nbt-profile-area")
        self.lrfinder_area = _cls(W.VBox(), "nbt-lrfinder-area")
        self.messages = _cls(W.VBox(), "nbt-messages")
        self.message_log: list[tuple[str, str]] = []
        self._msg_lock = threading.Lock()
        self.root = _cls(
            W.VBox(
                [
                    self.header,
                    self.controls,
                    self.buttons,
                    self.progress,
                    charts_box,
                    self.stats,
                    self.profile_area,
                    self.lrfinder_area,
                    self.messages,
                ],
                layout=W.Layout(border="1px solid #ddd", padding="6px"),
            ),
            "nbt-panel",
        )

    # -- text ----------------------------------------------------------------------------------------
    def set_status(self, status: str, detail: str = "") -> None:
        color = STATUS_COLORS.get(status, "#777")
        tail = f" <span style='color:#666'>{html.escape(detail)}</span>" if detail else ""
        self.status.value = (
            f"<span class='nbt-status-{status}' style='background:{color};color:white;"
            f"padding:2px 8px;border-radius:10px;font-weight:bold'>{status}</span>{tail}"
        )

    def set_progress(self, p: Any) -> None:
        epochs = max(int(p.epochs or 1), 1)
        done = max(0, min(epochs, int(p.epoch) - (0 if p.status in ("finished",) else 1)))
        self.epoch_bar.max, self.epoch_bar.value = epochs, done
        self.epoch_bar.description = f"epoch {p.epoch}/{epochs}"
        batches = p.batches if p.batches else max(int(p.batch), 1)
        self.step_bar.max, self.step_bar.value = max(int(batches), 1), min(int(p.batch), int(batches))
        self.step_bar.description = f"{'val ' if p.stage == 'val' else ''}batch {p.batch}/{p.batches or '?'}"
        parts = [f"step {p.global_step:,}" + (f"/{p.total_steps:,}" if p.total_steps else "")]
        if p.loss is not None:
            parts.append(f"loss {fmt(p.loss)}")
        parts += [f"{k} {fmt(v)}" for k, v in (p.metrics or {}).items()]
        if p.lr is not None:
            parts.append(f"lr {p.lr:.2e}")
        parts.append(f"{p.samples_per_s:,.0f} samples/s")
        parts.append(f"elapsed {fmt_duration(p.elapsed)}")
        if p.eta_epoch is not None and p.status == "running":
            parts.append(f"ETA epoch {fmt_duration(p.eta_epoch)} · fit {fmt_duration(p.eta_fit)}")
        if p.grad_accum_steps and p.grad_accum_steps > 1:
            parts.append(f"accum {p.grad_accum_steps}")
        if p.skipped_steps:
            parts.append(f"{p.skipped_steps} fp16-skipped steps")
        self.progress_info.value = f"<span style='font-size:12px'>{html.escape(' · '.join(parts))}</span>"

    def set_stats(self, best: tuple[str, float, Any] | None, peak_memory: str, p: Any | None) -> None:
        cards = []
        if best is not None:
            key, value, epoch = best
            cards.append(_card(f"best {key}", fmt(value), f"epoch {epoch}"))
        else:
            cards.append(_card("best validation", "-", "no validation yet"))
        cards.append(_card("peak memory", peak_memory))
        if p is not None:
            cards.append(_card("throughput", f"{p.samples_per_s:,.0f} samples/s"))
            if p.step_times:
                total = sum(p.step_times.values()) or 1.0
                split = " / ".join(f"{k} {v / total:.0%}" for k, v in p.step_times.items())
                cards.append(_card("step time", f"{total:.2f} ms", split))
        self.stats.value = "<div>" + "".join(cards) + "</div>"

    def add_message(self, level: str, text: str, details: str | None = None) -> None:
        color = {"error": "#cf222e", "warning": "#9a6700", "info": "#444"}.get(level, "#444")
        body = f"<span style='color:{color}'><b>{level}</b>: {html.escape(text)}</span>"
        if details:
            body += (
                f"<details class='nbt-traceback'><summary>traceback</summary><pre style='font-size:11px;"
                f"white-space:pre-wrap'>{html.escape(details)}</pre></details>"
            )
        msg = _cls(W.HTML(f"<div style='font-size:12px'>{body}</div>"), f"nbt-message-{level}")
        with self._msg_lock:  # the UI thread and click handlers both add messages
            self.message_log.append((level, text))
            self.messages.children = (*self.messages.children, msg)[-MAX_MESSAGES:]
