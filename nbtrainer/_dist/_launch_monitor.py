"""A live view of a launched run: rank 0's progress to the launching process, a stop back to every rank.

``nbtrainer.launch(fn, nprocs=N, view=...)`` creates the channel before the processes start: a
multiprocessing queue (rank 0 -> launcher) and two shared integers (launcher -> ranks: "stop requested" and
the optimizer step every rank stops after). In each rank a ``RankMonitor`` (``nbtrainer._events._launched``) is added to
every ``Trainer`` built there on the rank's :class:`LaunchChannel` (:func:`launched_channels`), so ``fn`` changes
nothing:

* rank 0 sends each :class:`~nbtrainer.Progress` snapshot of ``on_refresh`` (already throttled, host values
  only), each epoch's logs and the end of the fit, as plain dicts;
* a stop must happen at the same optimizer step on every rank, or one rank would wait forever in a collective.
  Rank 0 sees the request at its optimizer step ``s`` and sets the stop step to ``s + 1``; every rank stops
  (``trainer.request_stop``) once it has finished a step ``>= s + 1``. No rank can finish step ``s + 1``
  before rank 0 has finished step ``s`` (each optimizer step all-reduces the gradients), so every rank sees the
  stop step in time; there is no extra collective and no device sync. The fit then ends as a stopped fit
  does: ``status == "stopped"``, the same weights on every rank.

The launching process sees it through a :class:`LaunchMonitor` (``nbtrainer.widgets.LaunchView`` is one with a
panel and a Stop button; a headless one records the snapshots).
"""

from __future__ import annotations

import dataclasses
import queue
from collections.abc import Callable
from typing import Any

__all__ = ["LaunchChannel", "LaunchMonitor", "launched_channels"]


@dataclasses.dataclass(frozen=True)
class LaunchChannel:
    """A launched rank's end of the channel: its rank, the world's size, the queue to the launching process and the
    shared integers back (``shared[0]``: a stop was requested; ``shared[1]``: the step every rank stops after)."""

    rank: int
    world_size: int
    channel: Any
    shared: Any


_ACTIVE: list[LaunchChannel] = []  # this process's channel (set in a launched rank before fn runs)


def launched_channels() -> list[LaunchChannel]:
    """The channel of a launched rank, to which each Trainer built here reports (none elsewhere)."""
    return list(_ACTIVE)


class LaunchMonitor:
    """Rank 0's progress in the launching process, and a stop for every rank: ``launch(..., view=monitor)``.

    Subclass it and override :meth:`on_progress` / :meth:`on_epoch` / :meth:`on_end` to show the run (as
    ``nbtrainer.widgets.LaunchView`` does), or read :attr:`snapshots` afterwards. :meth:`request_stop` may be
    called from any thread of the launching process (a button's click handler, a hook).

    Attributes:
        snapshots: Every progress snapshot received from rank 0 (``Progress.to_dict()`` plus ``rank`` and
            ``world_size``), in order.
        epochs: Rank 0's epoch logs (History rows), in order.
        final: The last snapshot, sent when rank 0's fit ended (its ``status`` is the fit's), or None.

    Example:
        >>> class Stopper(LaunchMonitor):
        ...     def on_progress(self, snapshot):
        ...         if snapshot["global_step"] >= 100:
        ...             self.request_stop()
        >>> # nbtrainer.launch(train, nprocs=2, view=Stopper())  # both ranks stop at the same step
    """

    def __init__(self) -> None:
        self.snapshots: list[dict[str, Any]] = []
        self.epochs: list[dict[str, Any]] = []
        self.final: dict[str, Any] | None = None
        self._queue: Any = None
        self._shared: Any = None
        self._pending_stop = False

    # -- what a view overrides --------------------------------------------------------------------
    def on_progress(self, snapshot: dict[str, Any]) -> None:
        """One of rank 0's ``on_refresh`` snapshots (plain values)."""

    def on_epoch(self, logs: dict[str, Any]) -> None:
        """Rank 0's History row of an epoch that ended."""

    def on_end(self, snapshot: dict[str, Any] | None, error: BaseException | None) -> None:
        """The launch is over (``error``: what it raised, or None)."""

    def wait(self, done: Callable[[float], bool]) -> None:
        """Block until ``done(timeout)`` is True (a notebook view keeps handling its clicks meanwhile)."""
        while not done(0.1):
            pass

    # -- stop -------------------------------------------------------------------------------------
    def request_stop(self) -> None:
        """Stop every rank after the same optimizer step (the next one rank 0 finishes, plus one)."""
        if self._shared is None:
            self._pending_stop = True  # before the launch started: sent when it does
        else:
            self._shared[0] = 1

    @property
    def stop_requested(self) -> bool:
        return self._pending_stop or (self._shared is not None and bool(self._shared[0]))

    # -- used by launch ---------------------------------------------------------------------------
    def on_start(self, nprocs: int) -> None:
        """The launch is about to start ``nprocs`` processes."""

    def attach(self, context: Any, nprocs: int) -> tuple[Any, Any]:
        """Create the channel in ``context`` (a multiprocessing context); returns what each rank gets."""
        self.snapshots, self.epochs, self.final = [], [], None
        self._queue = context.Queue()
        self._shared = context.RawArray("q", 2)  # [stop requested, the step every rank stops after]
        if self._pending_stop:
            self._shared[0] = 1
        self._pending_stop = False
        self.on_start(nprocs)
        return self._queue, self._shared

    def drain(self) -> None:
        """Hand every message waiting in the queue to the hooks (in the launching process)."""
        while self._queue is not None:
            try:
                kind, payload = self._queue.get_nowait()
            except queue.Empty:
                return
            if kind == "progress":
                self.snapshots.append(payload)
                self.on_progress(payload)
            elif kind == "epoch":
                self.epochs.append(payload)
                self.on_epoch(payload)
            elif kind == "end":
                self.final = payload

    def close(self, error: BaseException | None = None) -> None:
        self.drain()
        try:
            self.on_end(self.final, error)
        finally:
            if self._queue is not None:
                self._queue.close()
                self._queue = None


def install(rank: int, world_size: int, channel: Any, shared: Any) -> None:
    """In a launched rank, before ``fn`` runs: every Trainer built from now on gets a ``RankMonitor`` on this channel
    (``nbtrainer._events._launched``)."""
    _ACTIVE[:] = [LaunchChannel(rank, world_size, channel, shared)]
