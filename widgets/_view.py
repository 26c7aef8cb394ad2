"""The panel's widgets and their stable CSS classes, plus the text they show. No training logic here.

Colours come from JupyterLab's CSS variables (``_theme``), numbers from ``nbtrainer``'s formatters, and
every side area (epoch table, profile card, LR finder, summary) is a collapsible :class:`Section`, so the
panel stays bounded however long it is used.
"""

from __future__ import annotations

import contextlib
import html
from collections.abc import Iterator
from typing import Any

import ipywidgets as W

from nbtrainer import format_bytes, format_count, format_duration, format_lr, format_number

from ._epoch_table import CSS, MAX_ALL, epoch_table
from ._layouts import plain_html, shared_layout, shared_style
from ._markup import text_html
from ._messages import MessageLog
from ._section import Section
from ._style import THEME_CSS, set_tooltip
from ._theme import FG, FG2, STATUS_COLORS, card_style

__all__ = ["STATUS_COLORS", "PanelView"]

_WIDE = {"description_width": "initial"}
_AUTO = {"width": "auto"}  # a button as wide as its text (ipywidgets' default is 148 px)
# Hides the plain-HTML summary left under the panel for front ends without widgets (GitHub, nbviewer, an
# export without JavaScript): where this widget renders, the panel's own summary section shows instead.
HIDE_STATIC = f"<style>.nbt-summary-static{{display:none}}{THEME_CSS}</style>"  # and the theme (_style)
FOLLOW_ROWS = 8  # the live epoch table shows the newest rows only (``_epoch_table``: bounded whatever the run)
# The box itself scrolls (it outlives each update, so a scroll position does too): sideways in a narrow panel
# (lr and time stay reachable) and, with "show all", down from the newest row: column-reverse anchors the
# scroll at the bottom, so it follows new rows unless the user has scrolled up.
_TABLE_CSS = CSS + ".nbt-epoch-table-box .nbt-epoch-table{line-height:1.4}"  # not a widget line's 28 px
_SCROLL_ALL_CSS = f"<style>{_TABLE_CSS}.nbt-epoch-table-box.nbt-epoch-scrolls{{flex-direction:column-reverse}}</style>"
_FOLLOW_CSS = f"<style>{_TABLE_CSS}</style>"


def _cls(widget: W.Widget, *names: str) -> W.Widget:
    for name in names:
        widget.add_class(name)
    return widget


def _card(label: str, value: str, sub: str = "", css: str = "") -> str:
    return (
        f"<div class='nbt-stat {css}' style='{card_style()}'>"
        f"<div style='font-size:10px;color:{FG2};line-height:14px'>{html.escape(label)}</div>"
        f"<div style='font-size:14px;font-weight:bold;line-height:20px'>{html.escape(value)}</div>"
        f"<div style='font-size:10px;color:{FG2};line-height:14px'>{html.escape(sub)}</div></div>"
    )


def _step_time_card(times: dict[str, float], accum: int) -> str:
    """The sampled step in ms (``Progress.step_times``: under accumulation the loop counts every micro-batch of the
    window as long as the one it timed)."""
    total = sum(times.values()) or 1.0
    short = {"forward": "fwd", "backward": "bwd", "optimizer": "opt"}
    sub = " · ".join(f"{short.get(k, k)} {v / total:.0%}" for k, v in times.items())
    if accum > 1:
        sub += f" · {accum} micro-batches"
    return _card("step time", format_duration(total / 1e3), sub, "nbt-stat-steptime")


class PanelView:
    """Every widget of the panel. ``root`` is what is displayed; classes are listed in the package docstring."""

    def __init__(self, charts_box: W.Widget) -> None:
        self.title = _cls(plain_html(), "nbt-title")
        self.status = _cls(plain_html(), "nbt-status")
        self.header = _cls(
            W.HBox(
                [self.title, self.status],
                layout=W.Layout(justify_content="space-between", align_items="center", flex_flow="row wrap"),
            ),
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
        # A log slider spanning two decades around the current LR (re-centred when a value nears an edge),
        # plus exact entry: 220 px for six decades made every drag a jump of several decades.
        self.lr = _cls(
            W.FloatLogSlider(
                value=1e-3,
                base=10,
                min=-4,
                max=-2,
                step=0.01,
                description="LR",
                readout=False,
                continuous_update=False,
                style=_WIDE,
                layout=W.Layout(width="240px"),
            ),
            "nbt-lr",
        )
        self.lr_exact = _cls(
            W.Text(
                value="1.00e-3",
                continuous_update=False,
                layout=W.Layout(width="88px"),
            ),
            "nbt-lr-exact",
        )
        set_tooltip(self.lr_exact, "type an exact learning rate, e.g. 3e-4")
        # several named optimizers: which one the LR control sets ("all": each), and every one's LR
        self.lr_target = _cls(
            W.Dropdown(options=[("all", "")], value="", layout=W.Layout(width="90px", display="none")),
            "nbt-lr-target",
        )
        self.lr_readout = _cls(W.HTML(layout=W.Layout(display="none")), "nbt-lr-readout")
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
        self.precision_note = _cls(plain_html(), "nbt-precision-note")
        self.controls = _cls(
            W.VBox(
                [
                    W.HBox(
                        [self.precision, self.accum, W.HBox([self.lr, self.lr_exact, self.lr_target]), self.epochs],
                        layout=shared_layout(flex_flow="row wrap", align_items="center"),
                    ),
                    W.HBox(
                        [self.scheduler, self.max_grad_norm, self.checkpointing],
                        layout=shared_layout(flex_flow="row wrap"),
                    ),
                    self.lr_readout,
                    self.precision_note,
                ]
            ),
            "nbt-controls",
        )

        plain = {"layout": shared_layout(width="auto"), "style": shared_style(W.Button)}  # as wide as the text
        # Explicit colours: ipywidgets' "success" green under white text is 4.1:1, below WCAG AA (4.5:1).
        self.start = _cls(
            W.Button(
                description="Start",
                icon="play",
                style={"button_color": "#1a7f37"},  # white text: _style.THEME_CSS
                layout=shared_layout(width="auto"),
            ),
            "nbt-start",
        )
        self.pause = _cls(W.Button(description="Pause", icon="pause", disabled=True, **plain), "nbt-pause")
        self.stop = _cls(
            W.Button(
                description="Stop",
                icon="stop",
                disabled=True,
                style={"button_color": "#cf222e"},
                layout=shared_layout(width="auto"),
            ),
            "nbt-stop",
        )
        self.save = _cls(W.Button(description="Save checkpoint", icon="save", **plain), "nbt-save")
        self.save_path = _cls(W.Text(placeholder="checkpoint path", layout=W.Layout(width="220px")), "nbt-save-path")
        self.profile = _cls(W.Button(description="Profile", icon="tachometer", **plain), "nbt-profile")
        self.lrfind = _cls(
            W.Button(
                description="LR finder",
                icon="search",
                tooltip="LR range test on the train loader; click its curve to set the LR",
                **plain,
            ),
            "nbt-lrfind",
        )
        # Buttons as wide as their text (ipywidgets' default is 148 px each, which pushed "LR finder" alone onto
        # a second row at full width).
        self.buttons = _cls(
            W.HBox(
                [
                    self.start,
                    self.pause,
                    self.stop,
                    self.save,
                    self.save_path,
                    self.profile,
                    self.lrfind,
                ],
                layout=shared_layout(flex_flow="row wrap", align_items="center"),
            ),
            "nbt-buttons",
        )

        half = shared_layout(width="48%")  # the two bars side by side
        self.epoch_bar, self.step_bar = (
            _cls(W.IntProgress(value=0, min=0, max=1, description=f"{what} 0/?", style=_WIDE, layout=half), css)
            for what, css in (("epoch", "nbt-progress-epoch"), ("batch", "nbt-progress-step"))
        )
        self.progress_info = _cls(plain_html(), "nbt-progress-info")
        self.progress = _cls(W.VBox([W.HBox([self.epoch_bar, self.step_bar]), self.progress_info]), "nbt-progress")

        self.stats = _cls(plain_html(), "nbt-stats")
        self.epoch_section = Section("epochs", "nbt-epochs-area", closable=False)
        self.epoch_table = _cls(
            W.HTML(layout=W.Layout(width="100%", overflow="auto")),
            "nbt-epoch-table-box",
            "nbt-epoch-follow",
        )
        self.epoch_note = _cls(plain_html(), "nbt-epoch-note")
        self.epoch_all = _cls(
            W.ToggleButton(value=False, description="show all", layout=W.Layout(width="auto", display="none")),
            "nbt-epoch-all",
        )
        self.epoch_area = W.VBox(
            [W.HBox([self.epoch_note, self.epoch_all], layout=shared_layout(align_items="center")), self.epoch_table]
        )
        self._epoch_rows: list[dict[str, Any]] = []
        self.epoch_all.observe(lambda _: self.set_epoch_rows(self._epoch_rows), "value")
        self.profile_section = Section("profile", "nbt-profile-area")
        self.profile_area = self.profile_section.body
        self.lrfinder_section = Section("LR finder", "nbt-lrfinder-area")
        self.lrfinder_area = self.lrfinder_section.body
        self.summary_section = Section("summary", "nbt-summary-area")
        self.summary = _cls(plain_html(), "nbt-summary-live")
        self.messages_log = MessageLog()
        self.messages = self.messages_log.root
        self.held: tuple[W.Widget, ...] = (self.epoch_area, self.summary, *self.messages_log.held)  # off-tree at times
        self.root = _cls(
            W.VBox(
                [
                    self.header,
                    self.controls,
                    self.buttons,
                    self.progress,
                    self.stats,
                    charts_box,
                    self.epoch_section.root,
                    self.profile_section.root,
                    self.lrfinder_section.root,
                    self.summary_section.root,
                    self.messages,
                ],
                layout=W.Layout(padding="6px"),  # border: _style.THEME_CSS
            ),
            "nbt-panel",
        )

    @property
    def message_log(self) -> list[tuple[str, str]]:
        return self.messages_log.log

    # -- text ----------------------------------------------------------------------------------------
    def show_title(self, name: str, model: Any, trainer: Any) -> None:
        """The title: the panel's name, the model's class, device, parameters and optimizer."""
        n_params = sum(p.numel() for p in model.parameters())
        self.title.value = (
            f"<b style='font-size:14px'>{html.escape(name)}</b> <span style='color:{FG2}'>· "
            f"{type(model).__name__} · {trainer.device} · {format_count(n_params, compact=False)} parameters · "
            f"{type(trainer.optimizer).__name__}</span>"
        )

    def set_epoch_rows(self, rows: list[dict[str, Any]]) -> int:
        """The live epoch table: the newest ``FOLLOW_ROWS`` rows and how many are hidden, or every row.

        Returns the number of cells sent (what the page has to lay out again)."""
        self._epoch_rows = rows
        hidden = max(0, len(rows) - FOLLOW_ROWS)
        show_all = bool(self.epoch_all.value)
        first = max(0, len(rows) - (MAX_ALL if show_all else FOLLOW_ROWS))
        table = epoch_table(rows, first)
        box = self.epoch_table
        with box.hold_sync():
            box.remove_class("nbt-epoch-follow" if show_all else "nbt-epoch-scrolls")
            box.add_class("nbt-epoch-scrolls" if show_all else "nbt-epoch-follow")
            box.value = (_SCROLL_ALL_CSS if show_all else _FOLLOW_CSS) + table
            box.layout.max_height = "240px" if show_all else None  # the newest rows alone need no scrolling
        if show_all:
            note = f"{'all' if not first else f'last {MAX_ALL} of'} {len(rows)} epochs, newest at the bottom"
        elif hidden:
            note = f"newest {FOLLOW_ROWS} of {len(rows)} epochs · {hidden} earlier hidden"
        else:
            note = ""
        self.epoch_note.value = f"<span style='font-size:11px;color:{FG2}'>{note}</span>" if note else ""
        self.epoch_all.description = "newest only" if show_all else f"show all {len(rows)}"
        self.epoch_all.layout.display = "flex" if hidden else "none"
        return (len(rows) - first) * (len(rows[-1]) if rows else 0)

    @contextlib.contextmanager
    def noting(self, note: str) -> Iterator[None]:
        """Inside the block, a live status carries ``note`` (class ``nbt-status-note``) after its detail."""
        self._note = note
        if note:
            self.set_status(*getattr(self, "_shown", ("idle", "")))
        try:
            yield
        finally:
            self._note = ""

    def set_status(self, status: str, detail: str = "") -> None:
        """The badge shows the status word alone (class ``nbt-status-<status>``); the detail sits beside it."""
        self._shown = (status, detail)
        color = STATUS_COLORS.get(status, STATUS_COLORS["idle"])
        tail = (
            f" <span class='nbt-status-detail' style='color:{FG2};font-size:12px'>{text_html(detail)}</span>"
            if detail
            else ""
        )
        note = getattr(self, "_note", "") if status in ("starting", "running", "pausing", "paused", "stopping") else ""
        # one line: "5" and "epoch(s)" must not wrap apart in a narrow panel (a note goes on its own lines below)
        self.status.value = (
            "<span style='white-space:nowrap'>"
            f"<span class='nbt-status-badge nbt-status-{status}' style='background:{color};color:white;"
            f"padding:2px 8px;border-radius:10px;font-weight:bold'>{status}</span>{tail}</span>"
        ) + (f"<div class='nbt-status-note' style='color:{FG2};font-size:12px'>{text_html(note)}</div>" if note else "")

    def set_progress(self, p: Any, skipped_as: str = "skipped steps") -> None:
        epochs = max(int(p.epochs or 1), 1)
        # Epochs done: the current one counts once it has ended (a finished run, or a stop at its boundary).
        done = max(0, min(epochs, int(p.epoch) - (0 if p.batch >= (p.batches or 0) and p.batches else 1)))
        self.epoch_bar.max, self.epoch_bar.value = epochs, done
        self.epoch_bar.description = f"epoch {p.epoch}/{epochs}"
        batches = p.batches if p.batches else max(int(p.batch), 1)
        self.step_bar.max, self.step_bar.value = max(int(batches), 1), min(int(p.batch), int(batches))
        self.step_bar.description = f"{'val ' if p.stage == 'val' else ''}batch {p.batch}/{p.batches or '?'}"
        parts = [f"step {p.global_step:,}" + (f"/{p.total_steps:,}" if p.total_steps else "")]
        if p.loss is not None:
            parts.append(f"loss {format_number(p.loss)}")
        parts += [f"{k} {format_number(v)}" for k, v in (p.metrics or {}).items()]
        if p.lr is not None:
            parts.append(f"lr {format_lr(p.lr)}")
        parts.append(f"{format_number(round(p.samples_per_s))} samples/s")
        parts.append(f"elapsed {format_duration(p.elapsed)}")
        if p.eta_epoch is not None and p.status == "running":
            parts.append(f"ETA epoch {format_duration(p.eta_epoch)} · fit {format_duration(p.eta_fit)}")
        if p.grad_accum_steps and p.grad_accum_steps > 1:
            parts.append(f"accum {p.grad_accum_steps}")
        if p.skipped_steps:
            parts.append(f"{p.skipped_steps} {skipped_as}")
        self.progress_info.value = f"<span style='font-size:12px;color:{FG}'>{html.escape(' · '.join(parts))}</span>"

    def set_stats(self, best: tuple[str, float, Any] | None, p: Any | None) -> None:
        cards = []
        if best is not None:
            key, value, epoch = best
            cards.append(_card(f"best {key}", format_number(value), f"epoch {epoch}", "nbt-stat-best"))
        else:
            cards.append(_card("best validation", "-", "no validation yet", "nbt-stat-best"))
        if p is not None:
            cards.append(
                _card(
                    "throughput",
                    f"{format_number(round(p.samples_per_s))} samples/s",
                    f"elapsed {format_duration(p.elapsed)}",
                    "nbt-stat-throughput",
                )
            )
            if p.step_times:
                cards.append(_step_time_card(p.step_times, max(int(p.grad_accum_steps or 1), 1)))
            if p.memory is not None:
                cap = p.memory_capacity
                sub = f"of {format_bytes(cap)} ({p.memory / cap:.0%})" if cap else ""
                what = "CUDA peak / window" if p.memory_kind == "cuda" else "process RSS"
                cards.append(_card(f"memory · {what}", format_bytes(p.memory), sub, "nbt-stat-memory"))
        self.stats.value = f"<div style='display:flex;flex-flow:row wrap;align-items:stretch'>{''.join(cards)}</div>"

    def add_message(self, level: str, text: str, details: str | None = None) -> None:
        self.messages_log.add(level, text, details)
