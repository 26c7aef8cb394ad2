"""What Health tells: :class:`HealthReport` (one finding, with its advice) and :class:`SignalState` (a light).

Plain data only (str, int, float, lists, dicts), so a report travels in the History, a ``weights_only=True``
checkpoint, the run store's JSON and MLflow's tags as it is.
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["KINDS", "LEVELS", "SIGNALS", "HealthReport", "SignalState"]

#: What a report can be about, and the light (signal) each kind belongs to.
KINDS: dict[str, str] = {
    "grad_norm": "gradients",  # a block's gradient vanished, exploded or turned non-finite
    "update_ratio": "learning rate",  # a step changed the weights by a large share of their norm
    "loss_spike": "loss",
    "loss_rise": "loss",
    "nonfinite": "non-finite",
    "dead_units": "dead units",
    "data_wait": "data",
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
            ``"nonfinite"``, ``"dead_units"`` or ``"data_wait"``.
        step: the optimizer step it concerns (for a loss spike, the step of the spiking loss).
        epoch: its epoch (1-based).
        message: what happened and where, in one sentence.
        advice: what to do about it (empty when there is nothing to do).
        data: the numbers behind it, plain values: e.g. ``{"lr": 1.2e-4}`` when a learning rate is advised
            (the panel's "apply LR" button uses it), ``{"batch": 17}`` the batch's index in its epoch,
            ``{"module": "encoder.layer.3.attention.query"}`` where a NaN first appears.
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


@dataclasses.dataclass
class SignalState:
    """A light of the health card: ``level`` (``"ok"``, ``"warning"``, ``"problem"``) and a one-line ``summary``."""

    level: str = "ok"
    summary: str = "no data yet"
