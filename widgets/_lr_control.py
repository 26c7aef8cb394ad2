"""The LR control: a log slider of useful resolution around the current LR, plus exact entry.

Six decades in 220 px made an 80 px drag move the LR by 2.6 decades. The slider now spans two decades
centred on the current LR (about 120 px per decade, 2.3 % per step); when a value lands near either end the
range is re-centred on it, so any LR is reachable in a few drags. The text box takes an exact value
(``3e-4``, ``0.0003``) and re-centres the slider on it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from nbtrainer import format_lr

__all__ = ["LRControl"]

SPAN = 1.0  # decades on each side of the centre
EDGE = 0.1  # re-centre when a value is within this fraction of the range from an end


class LRControl:
    """Binds a ``FloatLogSlider`` and a ``Text`` to one learning rate; ``on_change(lr, source)`` on user edits
    (``source``: ``"dragged"`` from the slider, ``"typed"`` from the text box)."""

    def __init__(
        self, slider: Any, text: Any, on_change: Callable[[float, str], None], notify: Callable[[str, str], None]
    ) -> None:
        self.slider, self.text, self.on_change, self.notify = slider, text, on_change, notify
        self._syncing = False
        slider.observe(self._on_slider, "value")
        text.observe(self._on_text, "value")

    @property
    def value(self) -> float:
        return float(self.slider.value)

    def show(self, lr: float) -> None:
        """Display ``lr`` (re-centring the slider when needed) without calling ``on_change``."""
        self._syncing = True
        try:
            self._place(float(lr))
            self.text.value = format_lr(lr)
        finally:
            self._syncing = False

    def _place(self, lr: float) -> None:
        s, e = self.slider, math.log10(lr)
        lo, hi = s.min, s.max
        margin = (hi - lo) * EDGE
        # Cross-validation is held until the block ends, so min/max/value can move in any order.
        with s.hold_trait_notifications():
            if not (lo + margin <= e <= hi - margin) or (hi - lo) != 2 * SPAN:
                s.min, s.max = round(e - SPAN, 2), round(e + SPAN, 2)
            s.value = lr

    def _on_slider(self, change: Any) -> None:
        if self._syncing:
            return
        lr = float(change["new"])
        self.show(lr)  # text, and a re-centred range when the drag ended near an end
        self.on_change(lr, "dragged")

    def _on_text(self, change: Any) -> None:
        if self._syncing:
            return
        raw = str(change["new"]).strip()
        try:
            lr = float(raw)
            if not (math.isfinite(lr) and lr > 0):
                raise ValueError
        except ValueError:
            self.notify("warning", f"learning rate {raw!r} is not a positive number: type e.g. 3e-4 or 0.0003.")
            self.show(self.value)
            return
        self.show(lr)
        self.on_change(lr, "typed")
