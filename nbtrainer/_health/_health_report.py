"""What Health tells: :class:`HealthReport` (one finding, with its advice) and :class:`SignalState` (a light).

Plain data only (str, int, float, lists, dicts), so a report travels in the History, a ``weights_only=True``
checkpoint, the run store's JSON and MLflow's tags as it is.
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["KINDS", "LEVELS", "SIGNALS", "HealthReport", "SignalState", "action_label", "action_parts", "readable"]

#: What a report can be about, and the light (signal) each kind belongs to.
KINDS: dict[str, str] = {
    "grad_norm": "gradients",  # a block's gradient vanished, exploded or turned non-finite
    "update_ratio": "learning rate",  # a step changed the weights by a large share of their norm
    "loss_spike": "loss",
    "loss_rise": "loss",
    "nonfinite": "non-finite",
    "dead_units": "dead units",
    "data_wait": "data",
    "not_learning": "learning rate",  # the loss stays above the chance level, or flat where it started
    "fix_failed": "learning rate",  # the window after Health.apply_advice was no better than the one before
}
#: The panel's lights, in the order it shows them.
SIGNALS: tuple[str, ...] = ("gradients", "loss", "non-finite", "learning rate", "dead units", "data")
#: ``"problem"`` acts (``Health(on_problem=...)``); ``"warning"`` only tells.
LEVELS: tuple[str, ...] = ("ok", "warning", "problem")


@dataclasses.dataclass
class HealthReport:
    """One finding of :class:`~nbtrainer.Health`, delivered by the ``on_health(trainer, report)`` event.

    Attributes:
        kind: what was found: ``"grad_norm"``, ``"update_ratio"``, ``"loss_spike"``, ``"loss_rise"``,
            ``"nonfinite"``, ``"dead_units"``, ``"data_wait"``, ``"not_learning"`` or ``"fix_failed"``.
        step: the optimizer step it concerns (for a loss spike, the step of the spiking loss).
        epoch: its epoch (1-based).
        message: what happened and where, in one sentence.
        advice: what to do about it (empty when there is nothing to do).
        data: the numbers behind it, plain values: e.g. ``{"batch": 17}`` the batch's index in its epoch,
            ``{"module": "encoder.layer.3.attention.query"}`` where a NaN first appears; and the advised action,
            which :meth:`Health.apply_advice <nbtrainer.Health.apply_advice>` applies (the panel's button):
            ``"lr"`` (the LR to set; ``"lr_factor"`` its ratio to the current one, for several optimizers),
            ``"max_grad_norm"`` (clip there), ``"restore"`` (``"snapshot"``: Health's copy of the weights and
            optimizer state before step ``"restore_step"``; ``"checkpoint"``: the ModelCheckpoint's last.ckpt),
            ``"reinit"`` (modules to re-initialize), ``"restart"`` (True: damaged with nothing to go back to).
        level: ``"problem"`` (``on_problem`` acts on it) or ``"warning"``.

    Example:
        >>> r = HealthReport("loss_spike", 812, 2, "loss spiked", "lower the LR", {"lr": 1e-4, "batch": 17})
        >>> r.to_dict()["data"]["lr"]
        0.0001
    """

    kind: str
    step: int
    epoch: int
    message: str
    advice: str = ""
    data: dict[str, Any] = dataclasses.field(default_factory=dict)
    level: str = "problem"

    @property
    def signal(self) -> str:
        """The light this report belongs to (``KINDS``)."""
        return KINDS.get(self.kind, self.kind)

    @property
    def action(self) -> str:
        """What :meth:`Health.apply_advice <nbtrainer.Health.apply_advice>` would do, in a few words (the panel's
        button), or ``""`` when there is nothing to apply.

        Example:
            >>> HealthReport("update_ratio", 1, 1, "...", data={"lr": 0.1, "restore": "snapshot",
            ...              "restore_step": 1}).action
            'restore the weights before step 1 and apply LR 0.1'
        """
        return action_label(self.data)

    @property
    def action_steps(self) -> list[str]:
        """:attr:`action` as its steps (``["restore the weights before step 1", "apply LR 0.1"]``)."""
        return action_parts(self.data)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> HealthReport:
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in state.items() if k in fields})

    def __str__(self) -> str:
        tail = f" {self.advice}" if self.advice else ""
        return f"health {self.level}: {self.message}{tail}"

    def _repr_html_(self) -> str:
        from nbtrainer._report._format import text_html

        where = f"step {self.step}, epoch {self.epoch}"
        advice = f"<div><b>What to do:</b> {text_html(self.advice)}</div>" if self.advice else ""
        return (
            f"<div class='nbtrainer-health-report'><b>health {text_html(self.level)}</b> · {text_html(self.kind)} · "
            f"{where}<div>{text_html(self.message)}</div>{advice}</div>"
        )


def readable(value: float) -> str:
    """A rounded advised value as a person writes it: ``0.1``, ``20``, ``5e-4``.

    Example:
        >>> readable(0.1), readable(0.02), readable(20.0), readable(5e-4), readable(3e5)
        ('0.1', '0.02', '20', '5e-4', '3e5')
    """
    if 1e-3 <= abs(value) < 1e4:
        return f"{value:.6g}"
    mantissa, exponent = f"{value:.0e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def action_parts(data: dict[str, Any]) -> list[str]:
    """The steps of the advised action in a report's ``data``, in the order they are applied (none: nothing to
    apply, or ``"restart"``: nothing can repair the weights).

    Example:
        >>> action_parts({"lr": 0.1, "restore": "snapshot", "restore_step": 1})
        ['restore the weights before step 1', 'apply LR 0.1']
    """
    if data.get("restart"):
        return []
    parts = []
    if data.get("restore") == "snapshot":
        parts.append(f"restore the weights before step {data.get('restore_step')}")
    elif data.get("restore") == "checkpoint":
        parts.append("roll back to the last checkpoint")
    reinit = data.get("reinit")
    if reinit:
        parts.append("re-initialize " + ", ".join(str(n) for n in reinit))
    if isinstance(data.get("max_grad_norm"), (int, float)):
        parts.append(f"clip gradients at {readable(float(data['max_grad_norm']))}")
    if isinstance(data.get("lr"), (int, float)):
        parts.append(f"apply LR {readable(float(data['lr']))}")
    return parts


def action_label(data: dict[str, Any]) -> str:
    """The words of :attr:`HealthReport.action` for a report's ``data``: its parts, the last joined by "and"."""
    parts = action_parts(data)
    if not parts:
        return ""
    return ", ".join(parts[:-1]) + (" and " if len(parts) > 1 else "") + parts[-1]


@dataclasses.dataclass
class SignalState:
    """A light of the health card: ``level`` (``"ok"``, ``"warning"``, ``"problem"``) and a one-line ``summary``."""

    level: str = "ok"
    summary: str = "no data yet"
