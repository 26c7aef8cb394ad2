"""What the loop keeps for a consumer that looks at a batch again, instead of calling it per micro-batch.

``nbtrainer.Health`` re-runs the batch of a skipped (non-finite) step with hooks, and measures its samples on
the batch a sampled step trained on. Per-batch hooks for that (``on_train_batch_start`` / ``_end``) cost a Python
call per micro-batch for every run; the loop keeps the references instead, once a consumer asked
(``FitLoop.keep_window_batches()``): two list appends per micro-batch and a clear per step, written inline in the
loop (no call, no copy; :meth:`KeptBatches.add` / :meth:`~KeptBatches.stepped` say what it does). The
batches of one window stay alive until its optimizer step's events were delivered (one step longer than
without), and the last micro-batch until the next step's.
"""

from __future__ import annotations

from typing import Any

__all__ = ["KeptBatches"]


class KeptBatches:
    """The open window's micro-batches (device tensors, references) and their detached losses.

    Attributes:
        batches: the micro-batches of the window being accumulated, in order (at an ``on_optimizer_step``
            delivery: the stepped window's).
        losses: their detached losses (device tensors, never read by the loop).
        last: the last micro-batch of the last stepped window.

    Example:
        >>> kept = KeptBatches()
        >>> kept.add("b0", 0.5); kept.add("b1", 0.7); kept.stepped()
        >>> kept.batches, kept.last
        ([], 'b1')
    """

    def __init__(self) -> None:
        self.batches: list[Any] = []
        self.losses: list[Any] = []
        self.last: Any = None

    def add(self, batch: Any, loss: Any) -> None:
        self.batches.append(batch)
        self.losses.append(loss)

    def stepped(self) -> None:
        """The window's optimizer step and its events are done: drop it (keep its last batch)."""
        if self.batches:
            self.last = self.batches[-1]
            self.batches.clear()
            self.losses.clear()

    def clear(self) -> None:
        self.batches.clear()
        self.losses.clear()
