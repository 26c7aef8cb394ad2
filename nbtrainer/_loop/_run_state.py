"""A run's progress from one ``fit`` to the next (:class:`RunState`), owned by its Trainer (``Trainer.run_state``).

A run outlives one ``fit`` call: ``fit_more`` continues it, a checkpoint saves it, a resume loads it back. What
it carries lives here, in one object with one owner, rather than as loose attributes of the Trainer that the
checkpoint, continue and profiling code would each reach into: where the loop is (:class:`LoopState`), the
training metrics' running state, the seconds trained before this fit, the RNG state a resume restores once, the
History being fed (through its :class:`~nbtrainer._events._callbacks.HistoryRecorder`, always the first callback),
and, while a fit runs, its :class:`~nbtrainer._loop._fit_loop.FitLoop` and thread.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

from nbtrainer._events._callbacks import HistoryRecorder
from nbtrainer._events._history import History
from nbtrainer._loop._loop_state import LoopState

if TYPE_CHECKING:
    import torch

    from nbtrainer._loop._kept import KeptBatches
    from nbtrainer._loop._metrics import MetricSet

__all__ = ["RunState", "RunningLoop"]


class RunningLoop(Protocol):
    """What the others read of and ask of a running fit's loop (``nbtrainer._loop._fit_loop.FitLoop``): the
    checkpoints, rollback, the live control, the OOM advice, the run store and ``nbtrainer.Health``. Typed here, not
    as the loop's class, so that the run's state (which the loop itself reads) does not depend on the loop.

    Attributes:
        train_loader: the fit's training loader, as the placement prepared it.
        epochs / max_steps: what the fit was asked for.
    """

    train_loader: Any
    epochs: int
    max_steps: int | None

    @property
    def grad_norm(self) -> torch.Tensor | None: ...  # the step's total norm before clipping (on the device)
    @property
    def data_mode(self) -> str: ...  # how batches reach the device (nbtrainer._data._prefetch.DataPath)
    def flush(self) -> None: ...
    def refresh(self) -> None: ...
    def read_memory(self) -> None: ...
    def fit_elapsed(self) -> float: ...
    def epoch_elapsed(self) -> float: ...
    def pending_points(self) -> tuple[list[tuple[int, float, float]], dict[int, tuple[float, ...]]]: ...
    def open_window(self) -> list[tuple[float, int]]: ...
    def last_batch_size(self) -> int | None: ...
    def release_pending(self) -> None: ...
    def at_step_boundary(self) -> bool: ...
    def rewind(self) -> None: ...
    def keep_window_batches(self) -> KeptBatches: ...  # the open window's batches, for Health (_kept)


class RunState:
    """A run's progress across ``fit`` calls (see the module docstring).

    Attributes:
        loop_state: where the run is: epoch, batch, global step, samples, running loss sums (a checkpoint's
            ``"loop"``).
        train_metrics: the training metrics and their running state (a checkpoint's ``"metrics"``).
        elapsed_before: seconds trained in the run's earlier fits (and before a resume).
        pending_rng: the RNG states a resumed fit restores once its data order has been replayed, else None.
        has_validation: whether the current (or last) fit validates.
        loop: the running fit's loop (its public methods: ``flush``, ``pending_points``, ``fit_elapsed``...);
            None between fits.
        fit_thread: the id of the thread running ``fit``; None between fits.
        recorder: the callback that feeds :attr:`history` from the event stream.
        lr_finder: the :class:`~nbtrainer.LRFinderResult` of the last ``lr_find`` (None before one): its valley is
            the LR ``nbtrainer.Health`` advises when the run goes wrong.
        called_at: ``time.monotonic()`` when the current (or last) ``fit`` was called: a stop requested since then
            is this fit's, kept through its set-up (batching arrays, planning), an older one is dropped.
    """

    def __init__(self, train_metrics: MetricSet, history: History | None = None) -> None:
        self.loop_state = LoopState()
        self.train_metrics = train_metrics
        self.elapsed_before = 0.0
        self.pending_rng: dict[str, Any] | None = None
        self.has_validation = False
        self.loop: RunningLoop | None = None
        self.fit_thread: int | None = None
        self.recorder = HistoryRecorder(History() if history is None else history)
        self.lr_finder: Any = None
        self.called_at = 0.0

    @property
    def history(self) -> History:
        """The History this run feeds (each ``fit`` gets its own object, returned by ``fit``)."""
        return self.recorder.history

    @history.setter
    def history(self, history: History) -> None:
        self.recorder.history = history

    @property
    def fitting(self) -> bool:
        """True while ``fit`` runs (in any thread)."""
        return self.fit_thread is not None

    def elapsed(self) -> float:
        """Seconds trained in the whole run, the running fit included."""
        return self.elapsed_before + (0.0 if self.loop is None else self.loop.fit_elapsed())

    def expected_log_keys(self, metric_spec: Any) -> set[str]:
        """The keys a fit's epoch rows will have (``Trainer.expected_log_keys``), given the metrics as specified."""
        from nbtrainer._loop._metrics import LOOP_KEYS, VAL_PREFIX, collection_names

        names = set(self.train_metrics.names) | collection_names(metric_spec)
        keys = set(LOOP_KEYS) | names
        if self.has_validation:
            keys |= {f"{VAL_PREFIX}{n}" for n in ("loss", *names)}
        return keys

    def start_fresh(self) -> None:
        """A new run: position, seconds and pending RNG back to the start, a new History."""
        self.pending_rng = None
        self.loop_state = LoopState()
        self.elapsed_before = 0.0
        self.history = History()

    def continue_history(self) -> None:
        """``fit_more`` on the run in place: its own History, a copy of the run so far (the History returned
        earlier stays as it was); nothing to restore."""
        history = History()
        history.load_state_dict(self.history.state_dict())
        self.history = history
        self.pending_rng = None

    def restore(
        self,
        *,
        loop: dict[str, Any],
        metrics: dict[str, Any],
        elapsed: float,
        history: dict[str, Any],
        rng: dict[str, Any],
        device: torch.device,
    ) -> None:
        """Load a checkpoint's run (its parts already checked): a fresh :class:`LoopState` (a checkpoint of an
        older version may lack newer fields), the metrics' state, a new History; the RNG waits in
        :attr:`pending_rng` until the loop has replayed the epoch's data order up to the saved batch."""
        self.elapsed_before = float(elapsed)
        self.loop_state = LoopState()
        self.loop_state.load_state_dict(loop)
        self.train_metrics.load_state_dict(metrics, device)
        self.history = History()  # the resumed fit's own History (an earlier fit's stays as it was)
        self.history.load_state_dict(history)
        self.pending_rng = rng

    def take_pending_rng(self) -> dict[str, Any] | None:
        rng, self.pending_rng = self.pending_rng, None
        return rng

    @contextlib.contextmanager
    def preserved(self) -> Iterator[None]:
        """Put back on exit what a fit inside replaces: position, seconds, pending RNG, History, validation
        flag (``profile_training`` steps through ``fit`` and leaves the run as it was)."""
        saved = (self.loop_state, self.elapsed_before, self.pending_rng, self.history, self.has_validation)
        try:
            yield
        finally:
            self.loop_state, self.elapsed_before, self.pending_rng, self.history, self.has_validation = saved
