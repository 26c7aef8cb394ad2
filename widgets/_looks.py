"""The panel's sections that look at what the model does (issue 46) and at its data (issue 55): samples beside the
loss, errors, and the data section.

:class:`Looks` composes them for ``TrainerWidget``: the data section (``_data_view``: the data check before Start, a
batch, the run's data map and its cleaner), the samples section (``_samples_view``, always there, shown once
a ``nbtrainer.Samples`` callback has taken something) and the errors section (``_errors_view``, with
``TrainerWidget(..., interpret=True)`` or a dict of ``interpret`` options). The UI thread redraws both at each push
(``parts``, the pump's :class:`~nbtrainer.widgets._pump.LivePart`); the errors section's callback rides on each
run (``attach`` at Start; it leaves at the run's end, or with ``detach`` when the run could not start).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._charts import LiveCharts
from ._data_view import DataView
from ._errors_view import ErrorsView, interpret_options
from ._samples_view import SamplesView

__all__ = ["Looks"]


class Looks:
    """The samples (:attr:`samples`), errors (:attr:`errors`) and data (:attr:`data`) sections of one panel.

    Args:
        charts: the panel's live charts (a click on the loss chart picks a sample).
        source: returns the panel's current trainer.
        notify: the panel's messages.
        interpret: ``TrainerWidget(interpret=...)``: ``False``, ``True`` or a dict of ``interpret`` options.
        val_loader: the panel's validation loader (what the errors section analyses).

    Example:
        >>> looks = Looks(w.charts, lambda: w.trainer, w.notify, interpret=True, val_loader=val)  # doctest: +SKIP
        >>> W.VBox([*looks.roots]); looks.attach(trainer, val)  # doctest: +SKIP
    """

    def __init__(
        self,
        charts: LiveCharts,
        source: Callable[[], Any],
        notify: Callable[[str, str], None],
        *,
        interpret: Any,
        val_loader: Any,
    ) -> None:
        options = interpret_options(interpret)
        if options is not None and val_loader is None:
            raise ValueError("TrainerWidget(interpret=...) analyses the validation set: pass a val_loader.")
        self.samples = SamplesView(charts, source, notify)
        self.errors = ErrorsView(notify, options)
        self.data = DataView(notify)
        self.roots = (self.data.root, self.samples.root, self.errors.root)
        self.parts = (self.samples, self.errors, self.data)
        self.held: tuple[Any, ...] = (*self.data.held, *self.samples.held, *self.errors.held)

    def refused(self) -> str | None:
        """Why Start must not train, said before any step (labels past the model's outputs), or None; waits for the
        data check first."""
        self.data.wait_check()
        return self.data.refused()

    def attach(self, trainer: Any, val_loader: Any) -> None:
        """A run starts: the errors section's callback and the data map ride on it."""
        self.errors.attach(trainer, val_loader)
        self.data.attach(trainer)

    def detach(self, trainer: Any) -> None:
        """The run could not start: the trainer as it was."""
        self.errors.detach(trainer)
