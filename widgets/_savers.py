"""The panel's "memory savers" group: optimizer, quantized base, LoRA, offloading and the optimizer step in
backward, chosen before Start.

These switches change how the Trainer is built (a quantized base and adapters change the model in place, a
named optimizer is built over what trains afterwards), so they cannot be flipped on a live trainer like the LR:
Start builds a new Trainer from the panel's model-form arguments with them (:meth:`Savers.options`). Options the
environment cannot run (:func:`nbtrainer.memory_saver_support`) are marked unavailable in the menus and disabled
as checkboxes, with the reason as tooltip, the same way as the precision menu.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import ipywidgets as W

from nbtrainer import MemoryOptions, Trainer, memory_saver_support

from ._layouts import plain_html, shared_layout
from ._section import Section
from ._style import set_tooltip
from ._theme import FG2

if TYPE_CHECKING:
    from nbtrainer import Trainer

__all__ = ["AS_GIVEN", "OPTIMIZERS", "Savers"]

AS_GIVEN = "as given"
#: the memory switches' names, from the core's one list of them
S = MemoryOptions.SWITCH
#: the menu's optimizers the core builds by name: every kind a memory plan row may choose (a row the menu could not
#: show was applied with the optimizer as given), the k-bit ones marked where their library is missing
OPTIMIZERS = ("adamw", "adamw8bit", "paged_adamw8bit", "adamw4bit", "adafactor")
LORA_R = 8


def _menu(rows: list[tuple[str, bool]]) -> list[tuple[str, str]]:
    return [(name if ok else f"{name} (unavailable)", name) for name, ok in rows]


class Savers:
    """The widgets of the group (``root``: a collapsible section, class ``nbt-savers``) and their state.

    Args:
        trainer: the panel's Trainer (device and precision decide what can run).
        rebuildable: why the group cannot be used, or None (a panel built from a Trainer cannot rebuild it).
    """

    def __init__(self, trainer: Trainer, *, locked_reason: str | None = None) -> None:
        self._device, self._precision = trainer.device, trainer.precision
        # what is installed, without bitsandbytes' import (0.6 s of CPU in a fresh kernel, for a group most runs
        # never open): the quantized formats are checked on the device when the group is first opened, or at
        # Start when one was chosen (the plan view sets them too)
        self.support = memory_saver_support(self._device, self._precision, probe=False)
        self.probed = False
        self.reasons: dict[str, str] = {}  # option -> why it cannot run here (what the tooltips say)
        self._running = False
        self.optimizer = W.Dropdown(
            options=[(AS_GIVEN, AS_GIVEN)], value=AS_GIVEN, description="optimizer", layout=W.Layout(width="210px")
        )
        self.quantize = W.Dropdown(
            options=[("none", "none")], value="none", description=S.quantize, layout=W.Layout(width="190px")
        )
        self.lora = W.Checkbox(
            value=False, description=f"LoRA (r={LORA_R})", indent=False, layout=W.Layout(width="110px")
        )
        self.lora_settings: dict[str, Any] = {"r": LORA_R}  # the box's adapters (a plan row's own, once chosen)
        self.offload_activations = W.Checkbox(
            value=False, description="offload activations", indent=False, layout=W.Layout(width="160px")
        )
        self.offload_optimizer = W.Checkbox(
            value=False, description="offload optimizer", indent=False, layout=W.Layout(width="150px")
        )
        # frees each gradient as soon as its parameter is updated (needs no clipping, no accumulation, no fp16)
        self.in_backward = W.Checkbox(
            value=False, description="step in backward", indent=False, layout=W.Layout(width="150px")
        )
        self.note = plain_html()
        self.note.add_class("nbt-savers-note")
        self.locked_reason: str | None = None
        self.section = Section("memory savers", "nbt-savers", closable=False)
        self.section.show(
            W.HBox(
                [*self.widgets],
                layout=shared_layout(flex_flow="row wrap", align_items="center"),
            ),
            self.note,
            detail="applied at Start",
            is_open=False,
        )
        self.section.toggle.on_click(lambda _: self._probe_if_seen())
        self.root = self.section.root
        self._apply_support()
        if locked_reason:
            self.lock(locked_reason)

    def probe(self) -> None:
        """Check the quantized formats on the device (once) and mark what cannot run."""
        if not self.probed:
            self.probed = True
            self.support = memory_saver_support(self._device, self._precision)
            self._apply_support()

    def _probe_if_seen(self) -> None:
        """Probe once the group is open and no run trains: opened during a run, the check waits for its end. It runs
        a quantized layer with the device's RNG saved and restored around it, which must not interleave with a
        training thread's draws."""
        if self.section.is_open and not self._running:
            self.probe()

    def _apply_support(self) -> None:
        """Menus, boxes, tooltips and the note from ``self.support``; a menu's choice is kept."""
        s = self.support
        self.reasons = {}
        opt_rows = [(AS_GIVEN, True)]
        for name in OPTIMIZERS:
            ok, why = s.get(f"optimizer:{name}", (True, ""))
            opt_rows.append((name, ok))
            if not ok:
                self.reasons[f"optimizer:{name}"] = why
        q_rows = [("none", True)]
        for key, (ok, why) in s.items():  # the formats, in the core's order
            if key.startswith(f"{S.quantize}:"):
                q_rows.append((key.split(":", 1)[1], ok))
                if not ok:
                    self.reasons[key] = why
        for menu, rows in ((self.optimizer, opt_rows), (self.quantize, q_rows)):
            options = _menu(rows)
            if list(menu.options) != options:  # (re)setting options resets the choice on ipywidgets 7
                chosen = menu.value
                menu.options = options
                menu.value = chosen
        for key, box in self._boxes():
            ok, why = s.get(key, (False, "unknown switch"))
            if not ok:
                self.reasons[key] = why
            set_tooltip(box, why or box.description)  # a plain attribute on ipywidgets 7 (Colab) reaches no one
        for menu, prefix in ((self.optimizer, "optimizer:"), (self.quantize, f"{S.quantize}:")):
            off = [f"{k[len(prefix) :]}: {r}" for k, r in self.reasons.items() if k.startswith(prefix)]
            set_tooltip(menu, "; ".join(off) or f"all run on {self._device}")
        if self.locked_reason:
            self.lock(self.locked_reason)
        else:
            self._enable()
            self._show_note()

    @property
    def widgets(self) -> tuple[Any, ...]:
        return (self.optimizer, self.quantize, *(box for _, box in self._boxes()))

    def _boxes(self) -> tuple[tuple[str, Any], ...]:
        """The checkboxes by the Trainer option (and memory_saver_support key) each one sets."""
        return (
            (S.lora, self.lora),
            (S.offload_activations, self.offload_activations),
            (S.offload_optimizer, self.offload_optimizer),
            (S.optimizer_in_backward, self.in_backward),
        )

    def _show_note(self, extra: str = "") -> None:
        off = [f"{k}: {r}" for k, r in self.reasons.items()]
        parts = ([f"unavailable here: {'; '.join(off)}"] if off else []) + ([extra] if extra else [])
        self.note.value = f"<span style='font-size:11px;color:{FG2}'>{' · '.join(parts)}</span>" if parts else ""

    def set_lora(self, settings: Any) -> None:
        """Tick the LoRA box with these adapter settings (a plan row's ``lora``: ``{"r": 16, ...}``), or untick it
        (None); the box says the rank it will build."""
        if settings:
            self.lora_settings = dict(settings)
        self.lora.description = f"LoRA (r={self.lora_settings.get('r', LORA_R)})"
        self.lora.value = bool(settings)

    def lock(self, reason: str) -> None:
        """Keep the choices shown but refuse new ones (the model changed in place, or no model form)."""
        self.locked_reason = reason
        for w in self.widgets:
            w.disabled = True
        self._show_note(reason)

    def set_running(self, running: bool) -> None:
        self._running = running
        self._probe_if_seen()  # a run ended with the group open
        if not self.locked_reason:
            self._enable()

    def _enable(self) -> None:
        """What can be chosen now: nothing while a run trains, and never what cannot run here."""
        for w in (self.optimizer, self.quantize):
            w.disabled = self._running
        for key, box in self._boxes():
            box.disabled = self._running or key in self.reasons

    def options(self) -> dict[str, Any]:
        """The chosen Trainer options that differ from the defaults (``{}``: build nothing new).

        Raises:
            ValueError: an option this environment cannot run was picked (with the reason).
        """
        if self.quantize.value != "none":
            self.probe()  # chosen without the group opened (the plan view): check it runs before it is built
        # through the core's one declaration of the switches: .changed() keeps what differs from a plain run
        out: dict[str, Any] = MemoryOptions(
            optimizer=self.optimizer.value if self.optimizer.value != AS_GIVEN else None,
            quantize=self.quantize.value if self.quantize.value != "none" else None,
            lora=dict(self.lora_settings) if self.lora.value else None,
            offload_activations=bool(self.offload_activations.value),
            offload_optimizer=bool(self.offload_optimizer.value),
            optimizer_in_backward=bool(self.in_backward.value),
        ).changed()
        for key in ("optimizer", S.quantize):
            why = self.reasons.get(f"{key}:{out.get(key)}")
            if why:
                raise ValueError(f"{key} {out[key]!r} cannot run here: {why}")
        return out

    def rebuild(
        self, model: Any, old: Trainer, build: tuple[Any, ...] | None, *, lr: float, notify: Callable[[str, str], None]
    ) -> Trainer | None:
        """The run's Trainer with the savers chosen, or None (nothing chosen, or the group is locked).

        ``build`` is the panel's model form ``(criterion, optimizer, metrics, trainer_options)``; the old
        trainer's precision, accumulation, clipping and activation checkpointing carry over, and ``lr`` (the LR
        control) is the LR of an optimizer chosen by name. Quantizing and adapters change the model in place, so
        the group locks once a Trainer is built.

        Raises:
            ValueError: the core refuses the combination (its message), or an option cannot run here.
        """
        choice = self.options()
        if not choice or self.locked_reason or build is None:
            return None
        criterion, optimizer, metrics, options = build
        options = dict(options)
        options.update(
            precision=old.precision,
            grad_accum_steps=old.grad_accum_steps,
            max_grad_norm=old.max_grad_norm,
            activation_checkpointing=(options.get(S.activation_checkpointing) or True)
            if old.checkpointed_blocks
            else False,
        )
        chosen = ", ".join(f"{k}={v}" for k, v in choice.items())
        optimizer = choice.pop("optimizer", optimizer)
        if isinstance(optimizer, str):
            options["lr"] = lr
            if options.pop("scheduler", None) is not None:  # it is bound to the optimizer given
                notify("warning", "the scheduler given is bound to the optimizer given: pick one in the menu")
        try:
            trainer = Trainer(model, criterion, optimizer, metrics=metrics, **options, **choice)
        except Exception as exc:
            raise ValueError(f"memory savers: {exc}") from None
        self.lock(f"applied at Start ({trainer.param_counts}); build a new panel from a fresh model to change")
        notify("info", f"memory savers: {chosen} · {trainer.param_counts}")
        return trainer
