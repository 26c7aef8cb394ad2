"""``nbtrainer.Health``: training health as a consumer of the event stream, which says what went wrong and acts.

Signals and what each costs (none adds a host read per step; ``tests/loop/test_sync_budget.py`` holds it):

* gradient and update norms (``_norms``) and dead ReLU units (``_units``): on the device at the first step of a fit
  and every ``every_n_steps`` steps, on that step's own forward and update, read at the refresh with one
  ``tolist()``;
* loss spikes, a rising loss, a run that does not learn (``_loss_watch``): from the per-step losses the refresh has
  already read, and the chance level the first sampled forward tells;
* non-finite values (``_locate``): a window whose step was skipped (``on_nonfinite="skip"/"stop"``, or fp16's
  scaler) has its losses read (a skipped step is rare) and, when one is non-finite, its batch is run once more with
  forward hooks that name the first module whose output is non-finite;
* data wait: the step-time samples the loop already takes (``Progress.step_samples``);
* advice (``_advice``) and the one-click fix (``_fix``): from what was measured; a problem gets one diagnostic
  forward of the last batch, to tell damaged weights; healthy states are kept at sampled steps (``_snapshot``).

Per step it costs nothing: it takes no per-batch hook and gets ``on_optimizer_step`` only at its sampled steps and
the one before each (scheduled deliveries, ``nbtrainer._events._stream``); the loop keeps the open window's batches
for it (``FitLoop.keep_window_batches``).
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from nbtrainer._dist._placement import unwrap_model
from nbtrainer._events._callbacks import Callback
from nbtrainer._events._model_checkpoint import ModelCheckpoint
from nbtrainer._health._fix import Fixer
from nbtrainer._health._health_report import KINDS, SIGNALS, HealthReport, SignalState
from nbtrainer._health._judge import Draft
from nbtrainer._health._locate import dead_units
from nbtrainer._health._loss_watch import LossWatch
from nbtrainer._health._norms import NormProbe
from nbtrainer._health._readings import Readings
from nbtrainer._health._remedy import Remedy
from nbtrainer._health._snapshot import Snapshots, available_bytes
from nbtrainer._health._units import UnitWatch, is_compiled
from nbtrainer._loop._closure import needs_closure
from nbtrainer._loop._nonfinite import NonFiniteLossError

if TYPE_CHECKING:
    from nbtrainer._loop._host import LoopHost

__all__ = ["ON_PROBLEM", "Health"]

log = logging.getLogger(__name__)

ON_PROBLEM = ("warn", "pause", "stop")
_LEVEL = {"ok": 0, "warning": 1, "problem": 2}
SAMPLE_BUDGET = 0.01  # the samples' share of the training time, at most (a small model's steps are short)


def _check(every_n_steps: Any, on_problem: Any, spike_zscore: Any, window: Any, snapshot_mb: Any) -> None:
    if not isinstance(every_n_steps, int) or isinstance(every_n_steps, bool) or every_n_steps < 1:
        raise ValueError(
            f"Health(every_n_steps=...) must be an int >= 1 (measure the gradient norms every that many optimizer "
            f"steps), got {every_n_steps!r}. Use every_n_steps=50 (the default) or larger for less overhead."
        )
    if on_problem not in ON_PROBLEM:
        raise ValueError(
            f"Health(on_problem=...) must be one of {', '.join(repr(m) for m in ON_PROBLEM)}, got {on_problem!r}: "
            "'warn' reports and trains on, 'pause' also pauses at the next step boundary, 'stop' ends the run "
            "(saving last.ckpt when a ModelCheckpoint(save_last=True) is there)."
        )
    if isinstance(spike_zscore, bool) or not isinstance(spike_zscore, (int, float)) or not spike_zscore > 0:
        raise ValueError(f"Health(spike_zscore=...) must be a number > 0 (e.g. 6.0), got {spike_zscore!r}.")
    if not isinstance(window, int) or isinstance(window, bool) or window < 8:
        raise ValueError(f"Health(window=...) must be an int >= 8 (steps of loss statistics), got {window!r}.")
    if isinstance(snapshot_mb, bool) or not isinstance(snapshot_mb, (int, float)) or snapshot_mb < 0:
        raise ValueError(
            f"Health(snapshot_mb=...) must be a number >= 0 (MiB of host memory for healthy states; 0: none), got "
            f"{snapshot_mb!r}."
        )


def _params(optimizer: Any) -> list[Any]:
    groups = list(getattr(optimizer, "param_groups", None) or [])
    for child in (getattr(optimizer, "optimizers", None) or {}).values():
        groups += child.param_groups
    seen: dict[int, Any] = {}
    for group in groups:
        for p in group["params"]:
            seen.setdefault(id(p), p)
    return list(seen.values())


class Health(Callback):
    """Watches a fit's health, says what went wrong, where, and what to do; acts on problems, and one call
    (:meth:`apply_advice`, the panel's button) applies the advice.

    Findings arrive as :class:`HealthReport` through the ``on_health(trainer, report)`` event (to the History, the
    progress line once per kind, the run store, MLflow and the panel's health card). Gradient norms per block and the
    update-to-weight ratios are kept in ``history.health["grad_norm"][name]`` / ``["update_ratio"][name]`` as
    ``(step, value)`` lists (``"total"``: the whole model), the dead share of each ReLU module in
    ``["dead_units"][name]``. Nothing is read from the device per step, and no hook runs per step.

    A network that does not learn is a problem: a cross-entropy loss above the chance level (``ln C``) for a window,
    a loss flat where it started for a window, or every unit of a ReLU module dead. The learning-rate light judges
    whether the run learns, not the size of its steps alone. Advice is computed from what was measured (the LR from
    the update ratio, clipping from the gradient norms) and says how; when the weights were damaged before the
    problem was seen, the advised action restores the last healthy weights and optimizer state (kept in host memory
    at sampled steps, at most ``snapshot_mb`` together) or the last checkpoint; after it, the next window is
    compared with the one before and a fix that did not work is reported with the next step.

    Args:
        every_n_steps: measure the gradient norms, update ratios and dead units at the first step of a fit and then
            every this many optimizer steps. The default (None) is every 50 steps, or from the third sample on a
            multiple of 50 where a sample would bring the samples over 1% of the training time (a small model's short
            steps: on a 0.2 ms step a sample takes about as long as a step or two); a number given is kept exactly.
        on_problem: what a problem (not a warning) does: ``"warn"`` reports it, ``"pause"`` also pauses at the next
            step boundary, ``"stop"`` ends the run (writing ``last.ckpt`` when a ``ModelCheckpoint(save_last=True)``
            is there).
        spike_zscore: a loss more than this many standard deviations above the running mean is a spike.
        window: steps of loss statistics (spikes, a rising loss, a run that does not learn, a fix's check).
        snapshot_mb: host memory (MiB) the healthy snapshots may hold together (also at most a tenth of the memory
            available when the fit starts; ``_snapshot`` says which are kept); 0 turns them off.

    Attributes:
        signals: ``{"gradients" | "loss" | "non-finite" | "learning rate" | "dead units" | "data": SignalState}``,
            a light (``"ok"``, ``"warning"``, ``"problem"``) and a one-line summary each, as of the last refresh.
        reports: this fit's reports, oldest first.
        fixes: what :meth:`apply_advice` did: ``{"step", "kind", "action", "before", "after", "worked"}`` each
            (``after`` / ``worked`` once the window after it was seen).

    Example:
        >>> import torch
        >>> from nbtrainer import Health, Trainer
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
        >>> trainer = Trainer(model, torch.nn.CrossEntropyLoss(), "sgd", lr=0.1, callbacks=[Health()],
        ...                   progress=False)
        >>> history = trainer.fit([(torch.randn(8, 4), torch.randint(0, 2, (8,)))] * 4, epochs=1)
        >>> sorted(history.health["grad_norm"])
        ['0', '2', 'total']
    """

    def __init__(
        self,
        *,
        every_n_steps: int | None = None,
        on_problem: str = "warn",
        spike_zscore: float = 6.0,
        window: int = 100,
        snapshot_mb: float = 256,
    ) -> None:
        _check(every_n_steps if every_n_steps is not None else 50, on_problem, spike_zscore, window, snapshot_mb)
        self.every_n_steps = every_n_steps if every_n_steps is not None else 50
        self._paced = every_n_steps is None  # the default: spaced further where a sample costs too much (_too_soon)
        self.on_problem = on_problem
        self.spike_zscore = float(spike_zscore)
        self.window = window
        self.snapshot_mb = float(snapshot_mb)
        self.signals: dict[str, SignalState] = {s: SignalState() for s in SIGNALS}
        self.reports: list[HealthReport] = []
        self._fixer = Fixer()
        # (the model, its first losses' mean, where its last fit ended learning): a converged run continued in a
        # new fit is flat where it ended, not stuck (LossWatch._converged)
        self._earlier: tuple[int, float | None, float | None] = (0, None, None)
        #: scheduled step deliveries (nbtrainer._events._stream): 0 = the next step, which starts a Health added
        #: mid-fit; then the sampled steps and the one before each
        self.next_optimizer_step: int | None = 0
        #: optimizer_in_backward (no on_before_optimizer_step) is fine: the norms are then not measured
        self.needs_before_optimizer_step = False
        self._reset()

    def _reset(self) -> None:
        """Every field of one fit, at its empty value (a fit's start fills them)."""
        self._started = False
        self._model: Any = None
        self._probe: NormProbe | None = None
        self._units: UnitWatch | None = None
        self._snaps = Snapshots(0)
        self._remedy = Remedy(self)
        self._readings = Readings(self)
        self._kept: Any = None
        self._loss = LossWatch(window=self.window, zscore=self.spike_zscore)
        # the last steps' (step, loss, lr), as the refresh gives them: the LR each step used
        self._lrs: collections.deque[tuple[int, float, float]] = collections.deque(maxlen=self.window + 1)
        self._lr_raised_at: int | None = None
        self._since = 0  # the first step of the run at its current LR, from these weights (a damage's earliest)
        self._grad_totals: list[float] = []
        self._ratios: list[tuple[int, float, float]] = []  # (step, update ratio, its LR) since the run (re)started
        self._sample_lrs: dict[int, float] = {}  # the LR of each sampled step not yet read
        self._alive_at: dict[str, int] = {}  # ReLU module -> the last sampled step it had a live unit
        self._healthy_dead: dict[str, float] = {}  # ReLU module -> its dead share while the run was healthy
        self._dead_at_init: set[str] = set()
        self._data: list[float] = []  # the data share of each step-time sample of this fit
        self._reported: dict[str, int] = {}  # kind -> step of its last report (one per window steps)
        self._problem_at: int | None = None  # the first problem of this segment (no snapshot after it)
        self._skipped_nonfinite = 0
        self._first_step = self._step = self._epoch = 0
        self._fresh_run = False
        self._armed_for: int | None = None
        self._spent, self._samples = 0.0, 0  # seconds the samples took (the refresh's reading included), and how many
        self._last_sample: tuple[float, int] | None = None  # (when, step) the last sample ended
        self._compiled = False
        self._lights: dict[str, SignalState] = {"ratio": SignalState(), "learning": SignalState()}
        self._fix_note = ""  # the last fix's verdict, said in the learning-rate light

    @property
    def last_problem(self) -> HealthReport | None:
        """The newest report of this fit with level ``"problem"`` (what the panel's buttons act on)."""
        return next((r for r in reversed(self.reports) if r.level == "problem"), None)

    @property
    def fixes(self) -> list[dict[str, Any]]:
        return self._fixer.fixes

    def apply_advice(self, trainer: LoopHost, report: HealthReport | None = None) -> str:
        """Apply the advised action of ``report`` (default: :attr:`last_problem`): restore the healthy snapshot or
        roll back to the last checkpoint, re-initialize, clip, and set the LR, as ``report.data`` says
        (``report.action`` in words). From any thread: a running fit applies it at its next step boundary (resume
        a paused one with ``trainer.resume()``: the restore takes effect before its next step); between fits at
        once. The next ``window`` steps (between fits: of the model's next fit) are then checked against the ones
        before (:attr:`fixes`). Returns what was done. Raises ``ValueError`` when the report has nothing to apply.

        Example:
            >>> # health = Health(on_problem="pause"); trainer = Trainer(..., callbacks=[health])
            >>> # thread = nbtrainer.start_training_thread(trainer.fit, args=(loader,))  # pauses at a problem
            >>> # health.apply_advice(trainer); trainer.resume(); thread.join()
        """
        report = report if report is not None else self.last_problem
        if report is None:
            raise ValueError("Health has found no problem to act on in this fit.")
        return self._fixer.apply(trainer, report, self._snaps, self._loss.mean)

    # -- a fit starts and ends ----------------------------------------------------------------------------
    def on_fit_start(self, trainer: LoopHost) -> None:
        self.reports = []
        self.signals = {s: SignalState() for s in SIGNALS}
        self._start(trainer)

    def _start(self, trainer: LoopHost) -> None:
        """This fit's state (``on_fit_start``, or the first event after being added mid-fit)."""
        self._reset()
        self._started = True
        st = trainer.run_state.loop_state
        self._epoch = st.epoch + (2 if st.epoch_complete else 1)
        self._model = unwrap_model(trainer.model)
        self._fixer.start_fit(self._model)
        self._compiled = is_compiled(trainer.model)
        params = _params(trainer.optimizer)
        why = self._why_no_norms(trainer)
        self._probe = NormProbe(self._model, params) if why is None and params else None
        self._units = UnitWatch(self._model) if not self._compiled else None
        if why is not None:
            self.signals["gradients"] = SignalState("ok", f"not measured: {why}")
            self._lights["ratio"] = SignalState("ok", f"update ratio not measured: {why}")
        budget = int(self.snapshot_mb * 2**20)
        free = available_bytes()
        self._snaps = Snapshots(min(budget, free // 10) if free is not None else budget)
        loop = trainer.run_state.loop
        self._kept = loop.keep_window_batches() if loop is not None else None
        self._first_step = self._step = self._since = trainer.global_step + 1
        self._fresh_run = trainer.global_step == 0
        if self._earlier[0] == id(self._model):
            self._loss.first_seen, self._loss.ended = self._earlier[1:]
        self.signals["non-finite"] = SignalState("ok", "every loss finite so far")
        if not trainer.options.run.timing_every:
            self.signals["data"] = SignalState("ok", "not measured (Trainer(timing_every=0))")
        self._arm(trainer, self._first_step)

    def on_fit_end(self, trainer: LoopHost, history: Any) -> None:
        stuck = any(r.kind == "not_learning" for r in self.reports)
        self._earlier = (id(self._model), self._loss.first_seen, None if stuck else self._loss.mean)
        if self._units is not None:
            self._units.forget()
        if self._probe is not None:
            self._probe.forget()
        self._kept, self._armed_for, self._started = None, None, False  # no batch outlives the fit
        self.next_optimizer_step = 0

    @staticmethod
    def _why_no_norms(trainer: LoopHost) -> str | None:
        if trainer.options.memory.optimizer_in_backward:
            return "with optimizer_in_backward the gradients never exist together"
        if trainer.batch_steps.training_step_fn is not None:
            return "training_step steps the optimizers itself"
        if needs_closure(trainer.optimizer):
            return "LBFGS computes its gradients inside its step"
        if trainer.strategy.shards_parameters:
            return "FSDP shards the gradients"
        return None

    # -- the sampled steps (scheduled deliveries) ----------------------------------------------------------------
    def on_epoch_start(self, trainer: LoopHost, epoch: int) -> None:
        self._epoch = epoch

    def _arm(self, trainer: LoopHost, step: int) -> None:
        """Measure step ``step``: its forward (dead units, the output width) and its update (norms)."""
        self._armed_for = self.next_optimizer_step = step
        if self._units is not None:
            self._units.arm(lambda: self in trainer.callbacks.callbacks)

    def on_before_optimizer_step(self, trainer: LoopHost, optimizer: Any) -> None:
        step = trainer.global_step + 1
        probe = self._probe
        if step != self._armed_for or probe is None:
            return
        start = time.perf_counter()
        loop = trainer.run_state.loop
        pre_clip = loop.grad_norm if loop is not None else None
        probe.before_step(pre_clip, trainer.max_grad_norm, ratio=True)
        self._sample_lrs[step] = float(optimizer.param_groups[0]["lr"])  # a host value: what the ratio is at
        if self._problem_at is None and self._snaps.due():  # a healthy state, before this step's update
            probe.kept_before = self._snaps.take(step, probe.params, probe.before, self._model, trainer.optimizer)
        self._spent += time.perf_counter() - start

    def on_optimizer_step(self, trainer: LoopHost, step: int, skipped: bool) -> None:
        if not self._started:  # added mid-fit: this fit starts here for it
            self._start(trainer)
            return
        if skipped and self._kept is not None and self._kept.losses:
            self._readings.after_skip(trainer, step)
        if self._armed_for is not None and step >= self._armed_for:
            start = time.perf_counter()
            self._armed_for = None
            if self._probe is not None:
                if skipped:
                    self._probe.forget()
                else:
                    self._probe.after_step(step)
            if self._units is not None:
                self._units.disarm(step)
            self._spent += time.perf_counter() - start
            self._samples += 1
            self._last_sample = (time.perf_counter(), step)
        n = self.every_n_steps
        sample = (step // n + 1) * n
        if sample != step + 1:
            self.next_optimizer_step = sample - 1
        elif self._paced and self._too_soon():
            self.next_optimizer_step = sample + n - 1  # the next multiple: its turn is looked at then
        else:
            self._arm(trainer, sample)

    def _too_soon(self) -> bool:
        """A sample now would bring the samples' share of the training time over SAMPLE_BUDGET: what one costs
        (its own time on the training thread, the refresh's reading of it included) against the time trained
        since the last one. On a 0.2 ms step a sample takes about as long as one step or two. The second sample of a
        fit is always taken (one sample's cost, once): the card's chart and the norm judges need two points, and on a
        small model 1% sits within the step time's own spread, so pacing it made a short run's second point chance."""
        if self._last_sample is None or self._samples < 2:
            return False
        cost = self._spent / self._samples
        return cost > SAMPLE_BUDGET * (time.perf_counter() - self._last_sample[0])

    # -- the refresh: values already on the host ------------------------------------------------------------------
    def on_refresh(self, trainer: LoopHost, progress: Any) -> None:
        if not self._started:
            self._start(trainer)
        self._step = progress.global_step
        self._readings.read_samples(trainer)
        if progress.step_points:
            self._readings.watch_loss(trainer, progress)
        for step, times in progress.step_samples:  # every sample since the last refresh (1, 11, 21, 31, 51...)
            self._readings.data_sample(trainer, step, times)

    def _store(self, trainer: LoopHost, key: str, name: str, step: int, value: float) -> None:
        trainer.history.health.setdefault(key, {}).setdefault(name, []).append((step, value))

    def _light(self, lights: dict[str, SignalState]) -> None:
        """New states of the lights; a problem stays lit for ``window`` steps after its report."""
        for signal, state in lights.items():
            held = self.signals[signal]
            if held.level == "problem" and state.level != "problem" and not self._cleared(signal):
                continue
            self.signals[signal] = state

    def _lr_light(self) -> None:
        """The learning-rate light: whether the run learns, and the size of its steps (the worse of the two)."""
        ratio, learning = self._lights["ratio"], self._lights["learning"]
        worst = max((learning, ratio), key=lambda s: _LEVEL.get(s.level, 0))
        if worst.level == "ok":
            parts = [s.summary for s in (learning, ratio) if s.summary != "no data yet"]
            worst = SignalState("ok", " · ".join(parts) or "no data yet")
        self._light({"learning rate": worst})

    def _cleared(self, signal: str) -> bool:
        kinds = [k for k, s in KINDS.items() if s == signal]
        steps = [self._reported[k] for k in kinds if k in self._reported]
        return not steps or self._step - max(steps) >= self.window

    # -- the epoch's end: dead units of a compiled model ------------------------------------------------------
    def on_epoch_end(self, trainer: LoopHost, epoch: int, logs: dict[str, Any]) -> None:
        batch = self._kept.last if self._kept is not None else None
        if not self._compiled or batch is None or trainer.batch_steps.training_step_fn is not None:
            return  # otherwise measured on the sampled steps' own forwards (_units)
        try:
            found = dead_units(self._model, trainer.batch_steps.compute, batch, trainer.batch_steps.autocast())
        except Exception as exc:  # a diagnostic never ends the run: the light says why it could not look
            log.debug("the dead-units diagnostic failed (it never ends the run): its light says why", exc_info=True)
            self._light({"dead units": SignalState("ok", f"not checked: {type(exc).__name__}: {exc}"[:120])})
            return
        self._readings.unit_sample(trainer, trainer.global_step, found)

    # -- non-finite losses ------------------------------------------------------------------------------------
    def on_exception(self, trainer: LoopHost, exception: BaseException) -> None:
        if not isinstance(exception, NonFiniteLossError) or any(r.kind == "nonfinite" for r in self.reports):
            return
        self._file(trainer, self._readings.raised_draft(trainer, str(exception)), act=False)

    # -- control: a changed LR (a fix arriving), a rollback --------------------------------------------------
    def on_control(self, trainer: LoopHost, event: dict[str, Any]) -> None:
        kind = event.get("kind", "")
        if kind.startswith("lr"):
            old, new = event.get("old"), event.get("new")
            if isinstance(old, (int, float)) and isinstance(new, (int, float)) and new > old:
                self._lr_raised_at = int(event.get("step") or 0)
            if old != new:
                self._since = int(event.get("step") or 0) + 1
            if event.get("source") == "health":
                self._remedy.at_boundary(trainer, self._fixer)
        elif kind == "rollback":  # the steps after the checkpoint are gone: so are their statistics
            self._segment(trainer.global_step + 1)
            self._snaps.drop_after(trainer.global_step)
            if self._kept is not None:
                self._kept.clear()
            if self._probe is not None:
                self._probe.forget()
            st = trainer.run_state.loop_state
            self._epoch = st.epoch + (2 if st.epoch_complete else 1)
            self._arm(trainer, trainer.global_step + 1)

    def _segment(self, step: int) -> None:
        """The run starts again from other weights (a fix, a rollback) at ``step``: the statistics before go."""
        self._since = step
        self._loss.reset(step)
        self._grad_totals.clear()
        self._ratios.clear()
        self._problem_at = None
        self._reported.clear()

    # -- reporting and acting ------------------------------------------------------------------------------------
    def _throttled(self, kind: str, step: int) -> bool:
        """One report of a kind per ``window`` steps (a run that keeps spiking is told once, not at every step)."""
        last = self._reported.get(kind)
        return last is not None and 0 <= step - last < self.window

    def _file(self, trainer: LoopHost, draft: Draft, *, act: bool = True) -> None:
        """File a report (one of a kind per ``window`` steps) with the advice computed from what was measured
        (``_remedy``); act on a problem as ``on_problem`` says."""
        if self._throttled(draft.kind, draft.step):
            return
        advice, data = self._remedy.advise(trainer, draft)
        epoch = draft.epoch if draft.epoch is not None else self._epoch
        report = HealthReport(draft.kind, draft.step, epoch, _sentence(draft.message), advice, data, draft.level)
        self._emit(trainer, report)
        if report.level == "problem" and self._problem_at is None:
            self._problem_at = report.step
        if act and report.level == "problem":
            self._act(trainer, report)

    def _emit(self, trainer: LoopHost, report: HealthReport) -> None:
        self._reported[report.kind] = report.step
        self.reports.append(report)
        signal = report.signal
        held = self.signals[signal]
        # the report's words when its light says less (a light its judge already set at this level keeps its
        # short summary: "1 (ReLU): 100% dead")
        if _LEVEL[held.level] < _LEVEL[report.level]:
            self.signals[signal] = SignalState(report.level, report.message)
        trainer.callbacks.call("on_health", trainer=trainer, report=report)

    def _act(self, trainer: LoopHost, report: HealthReport) -> None:
        if self.on_problem == "pause":
            trainer.pause()
        elif self.on_problem == "stop":
            for checkpoint in ModelCheckpoint.all_in(trainer.callbacks.callbacks):
                if checkpoint.save_last:  # last.ckpt at the step boundary where the run stops
                    trainer.defer(_saver(checkpoint, trainer))
            trainer.request_stop(f"Health: {report.message}")


def _sentence(text: str) -> str:
    text = text[:1].upper() + text[1:]
    return text if text.endswith((".", "!", "?")) else text + "."


def _saver(checkpoint: ModelCheckpoint, trainer: LoopHost) -> Callable[[], Any]:
    return lambda: checkpoint.save_now(trainer)
