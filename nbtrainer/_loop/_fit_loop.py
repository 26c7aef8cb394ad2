"""The fit loop: epochs, micro-batches, accumulation windows, optimizer steps and the throttled refresh.

Sync budget (host <-> device) of one fit, on purpose and nowhere else:

1. the throttled refresh (``refresh_interval``, default 0.25 s): one ``tolist()`` of the pending
   per-micro-batch losses and callable-metric values, stacked on the device first (``nbtrainer.Health``: one more);
2. the end of each epoch: the same flush, torchmetrics' ``compute``, validation's read (Health: one dead-units read);
3. fp16 only: GradScaler's own inf check inside ``scaler.step`` (one per optimizer step; Health reads a skipped one's);
4. the sampled step-time breakdown (micro-batches 1, 11, 21, 31, then every ``timing_every``; under accumulation the
   micro-batch closing the window at or after each; CUDA only: ``synchronize`` before and around that step's phases);
5. once per fit, CUDA only: ``mem_get_info`` and the copy of a device-resident dataset (``_prefetch``).

The data path adds nothing per step: batched fetch, device-resident slicing and side-stream prefetch are
asynchronous (``_prefetch``'s docstring says how); a DataMap keeps each step's logits and index list on the device.
Everything else (loss sums, metric values, the scheduler-skip flag) stays on the device or is
learned without reading it (the optimizer's step post-hook tells whether fp16's scaler skipped).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, cast

import torch

from nbtrainer._data._batch import batch_size_of, move_to_device, safe_len
from nbtrainer._data._order import ShuffleOrder
from nbtrainer._data._predict_collect import frozen_modules, train_mode
from nbtrainer._data._prefetch import DataPath, lookahead
from nbtrainer._loop._closure import ClosureStep, needs_closure
from nbtrainer._loop._epoch_end import end_epoch
from nbtrainer._loop._host import scheduler_per_step
from nbtrainer._loop._kept import KeptBatches
from nbtrainer._loop._loop_state import LoopState
from nbtrainer._loop._manual import ManualStep
from nbtrainer._loop._pending import PendingReads
from nbtrainer._loop._ready_clock import ReadyClock
from nbtrainer._loop._step import TrainStep, split_steps
from nbtrainer._memory._window import MemoryProbe

if TYPE_CHECKING:
    from nbtrainer._loop._control import LiveControl
    from nbtrainer._loop._host import LoopHost
    from nbtrainer._loop._nonfinite import NonFiniteGuard

Tensor = torch.Tensor
_PAIR = (tuple, list)

__all__ = ["FitLoop", "LoopState"]  # LoopState lives in _loop_state (re-exported for its importers)

_NULL = contextlib.nullcontext()


def _window(t: LoopHost, n: int | None, done: int) -> int:
    """Micro-batches in the accumulation window that starts after ``done`` of the epoch's ``n`` (the last one of
    an epoch may be short)."""
    k = t.options.step.grad_accum_steps
    remaining = n - done if n is not None else 0
    return min(k, remaining) if remaining > 0 else k


class FitLoop:
    """One fit: its epochs, windows and steps, over a :class:`~nbtrainer._loop._host.LoopHost` (the Trainer, which
    callbacks get as ``trainer=``) and the parts of it only the loop uses: the live control (requests applied at a
    step boundary) and the NaN/inf gate."""

    def __init__(
        self,
        host: LoopHost,
        train_loader: Any,
        val_loader: Any,
        epochs: int,
        max_steps: int | None,
        profiler: Any,
        *,
        live: LiveControl,
        nonfinite: NonFiniteGuard,
    ) -> None:
        self.host, self.live, self.nonfinite = host, live, nonfinite
        self.train_loader, self.val_loader = train_loader, val_loader
        self.frozen = frozen_modules(host.model)  # submodules the user put in eval mode stay there (train_mode)
        self.epochs, self.max_steps = epochs, max_steps
        self.profiler = profiler
        self.state = host.run_state.loop_state
        self.n_batches = safe_len(train_loader)
        # OneCycleLR cannot step past total_steps; a loader without len() is only caught here (see _optimizer_step)
        sched = host.scheduler
        self._sched_end: int | None = (
            sched.total_steps
            if isinstance(sched, torch.optim.lr_scheduler.OneCycleLR) and scheduler_per_step(host)
            else None
        )
        self.pending = PendingReads()  # not yet read from the device (see the sync budget above)
        self.step = TrainStep(host, nonfinite, profiler=profiler)  # backward and the optimizer step, as lr_find's
        self.kept: KeptBatches | None = None  # for a consumer that asked (keep_window_batches; _kept)
        self._mid_window = False  # micro-batches taken since the last optimizer step (see at_step_boundary)
        self._rewound = False  # rewind() was called: the epoch in progress is left, the run state restored
        self._fit_start = time.perf_counter()
        self._epoch_start = self._fit_start
        self._last_refresh = self._fit_start
        self._next_refresh = 0.0
        self._step_times: dict[str, float] | None = None
        self._samples: list[tuple[int, dict[str, float]]] = []  # taken since the last refresh (step_samples)
        self._clock = ReadyClock()
        self.progress = host.progress
        self._memory = MemoryProbe(host.device)
        # Where batches come from (_prefetch.DataPath, decided at the first batch): the loader's iterator, or one
        # indexing call per batch, on CUDA device-resident or prefetched; for a consumer of items their indices.
        data = host.options.data
        path = functools.partial(DataPath, device=host.device, enabled=data.fast_fetch, fraction=data.data_on_device)
        self.order = ShuffleOrder(train_loader, deterministic=host.options.run.deterministic)
        self.train_data = path(train_loader, track=host.callbacks.has("on_train_forward"))
        self.val_data = path(val_loader) if val_loader is not None else None

    def _sync(self) -> None:
        if self.host.device.type == "cuda":
            torch.cuda.synchronize(self.host.device)

    # -- the fit -------------------------------------------------------------------------------
    def run(self) -> None:
        t, st = self.host, self.state
        hook = self.step.attach()
        try:
            while st.epoch < self.epochs and not self.live.requests.stop_requested:
                if st.epoch_complete:
                    st.epoch += 1
                    st.epoch_complete = False
                    st.batch = 0
                    continue
                self._train_epoch()
                if self._rewound:  # rolled back (Trainer.rollback): on from the restored position
                    self._rewound = False
                    st = self.state = t.run_state.loop_state
                    continue
                if self.live.requests.stop_requested and not st.epoch_complete:
                    break
            self._restore_rng()  # resumed a run that had nothing left to do
        except BaseException:  # the steps taken before it reach the History, the charts and the progress first
            self.pending.deliver_after_failure(self.flush, self.refresh)
            raise
        finally:
            hook.remove()
            self.order.give_back()  # the user's loader as it was, however the fit ended

    def _restore_rng(self) -> None:
        """The RNG of a resumed run, once (after the epoch's data order has been replayed)."""
        rng = self.host.run_state.take_pending_rng()
        if rng is not None:
            from nbtrainer._setup._seed import restore_rng

            restore_rng(rng)

    def _train_epoch(self) -> None:
        t, st, cb = self.host, self.state, self.host.callbacks
        resumed_mid_epoch = st.batch > 0
        epoch_no = st.epoch + 1
        loader = self.train_loader
        t.strategy.set_epoch(loader, st.epoch)
        # lent to the loader for this epoch (given back at its end), from its start state if any (saved, or left)
        gen = self.order.lend(state=st.sampler_state)
        if gen is not None and st.sampler_state is None:
            st.sampler_state = gen.get_state()
        if not resumed_mid_epoch:
            st.samples, st.loss_sum, st.epoch_time = 0, 0.0, 0.0
            st.loss_parts, st.nonfinite_samples = [], 0
            t.run_state.train_metrics.reset()
            self._restore_rng()  # resumed at an epoch boundary: RNG as it was when saved
        train_mode(t.model, self.frozen)
        p = self.progress
        p.epoch, p.batch, p.batches, p.stage, p.status = epoch_no, st.batch, self.n_batches, "train", "running"
        self._epoch_start = time.perf_counter() - st.epoch_time
        if not resumed_mid_epoch:  # the epoch already started in the run that wrote the checkpoint
            cb.call("on_epoch_start", trainer=t, epoch=epoch_no)

        # a resumed epoch skips the batches it already trained on, built under the RNG of its start (same data
        with st.epoch_order(self.order, resumed=resumed_mid_epoch):  # order, same worker seeds); the saved RNG after
            it: Iterator = self.train_data.batches(st.batch if resumed_mid_epoch else 0)
        self._restore_rng()

        n = self.n_batches
        # zip/repeat keeps iteration in C; without len() one batch of lookahead finds the window end.
        pairs = zip(it, itertools.repeat(False)) if n is not None else lookahead(it, self.train_data.track)
        window = in_window = 0
        due = False  # a step-time sample is scheduled and waits for the micro-batch that closes its window
        timing_every = t.options.run.timing_every or 0
        train_metrics = t.run_state.train_metrics
        metrics = train_metrics if train_metrics else None
        first = st.global_step == 0 and st.batch == 0
        guard = self.nonfinite
        gating = guard.gating
        device, non_blocking, model, control = t.device, t.options.data.non_blocking, t.model, self.live.requests
        criterion = cast(Callable[..., Any], t.criterion)  # the inlined (x, y) path runs only with one
        step = self.step
        steps = t.batch_steps
        fast = steps.default_compute()  # (x, y) batches go straight to model(x) and criterion(out, y)
        prof = self.profiler is not None
        r_data = torch.profiler.record_function("nbt.data") if prof else _NULL
        r_fwd = torch.profiler.record_function("nbt.forward") if prof else _NULL
        r_bwd = torch.profiler.record_function("nbt.backward") if prof else _NULL
        amp = steps.autocast()
        closure = ClosureStep(t, step.params) if needs_closure(t.optimizer) else None
        manual_fn = steps.training_step_fn
        manual = step.manual = ManualStep(t, manual_fn, guard) if manual_fn is not None else None
        pending = self.pending
        pend_loss, pend_bs = pending.losses, pending.sizes
        data = self.train_data
        emit = cb.caller("on_train_forward")
        clock = self._clock  # wall time less the thread's waits for a CPU (_ready_clock)
        t1 = t2 = t3 = 0.0
        while True:
            # Timing samples at micro-batches 1, 11, 21, 31, 51, 101... (never the first: the loader's start, the staged
            # checks; 11, 21 and 31: three early warm samples, so that a slow loader is told within 50 steps by three
            # readings, not by one fetch the OS descheduled or a garbage collection stalled beside one more that read
            # high on a busy machine); on CUDA the last step's kernels are waited for before the clock starts.
            m = pending.taken
            if timing_every and (not (m - 1) % timing_every or m in (11, 21, 31)):
                due = True
            # A sample times the micro-batch that closes its window, with its optimizer step: under accumulation the
            # first one at or after the scheduled micro-batch (a window of 5 or 10 never closes on 1, 11, 21, 31, 51...)
            sample = due and in_window + 1 >= (window if in_window else _window(t, n, st.batch))
            if sample:
                self._sync()
            t0 = clock() if sample else 0.0
            with r_data:
                try:
                    batch, is_last = next(pairs)
                except StopIteration:
                    break
            if in_window == 0:
                self._mid_window = True
                window = _window(t, n, st.batch)
            in_window += 1
            closes = in_window == window or is_last or (n is not None and st.batch + 1 >= n)
            pair = fast and type(batch) in _PAIR and len(batch) == 2 and isinstance(batch[0], Tensor)
            if pair:
                x, targets = batch
                if type(x) is not Tensor or x.device != device:
                    x = move_to_device(x, device, non_blocking)
                if type(targets) is not Tensor or targets.device != device:
                    targets = move_to_device(targets, device, non_blocking)
                batch = (x, targets)
            else:
                batch = move_to_device(batch, device, non_blocking)
            if sample:
                self._sync()
                t1 = clock()
            if cb.has("on_train_batch_start"):
                cb.call("on_train_batch_start", trainer=t, batch=batch, batch_idx=st.batch)
            if manual is not None:  # training_step: the user's forward, backward and steps, by name
                with step.no_sync(closes):
                    detached, bs = manual.run(batch, window, closes, amp)
                t2 = t1
                loss = outputs = targets = None
            elif closure is not None or t.micro_split > 1:
                # LBFGS: forward and backward run inside the step, at the window's close; memory_budget_gb's
                # plan: this batch as several forward / backward passes. Their time counts as backward.
                if closure is not None:
                    detached, bs, step.closure = closure.prepare(batch, first, amp, metrics)
                else:
                    detached, bs = split_steps(t, step, batch, window, closes, first, amp, metrics, in_window)
                t2 = t1
                loss = outputs = targets = None
            else:
                # DDP: non-final micro-steps skip the gradient all-reduce for forward AND backward.
                with step.no_sync(closes):
                    with r_fwd, amp:
                        if first:  # staged, with clear errors (same computation)
                            loss, outputs, targets = steps.first_compute(batch)
                        elif pair:
                            outputs = model(x)
                            loss = criterion(outputs, targets)
                        else:
                            loss, outputs, targets = steps.compute(batch)
                    if first:
                        steps.check_first_loss(loss, outputs, targets)
                    if gating:  # on_nonfinite="skip"/"stop": a device flag per window, never read here
                        guard.observe(loss)
                    if metrics is not None:
                        with torch.no_grad():
                            metrics.update(outputs, targets)
                        if first:
                            metrics.check_first()
                    if emit is not None:  # device tensors, the batch's dataset indices (host lists): nothing read
                        emit(trainer=t, outputs=outputs, targets=targets, indices=data.indices)
                    bs = targets.shape[0] if type(targets) is Tensor and targets.ndim else batch_size_of(targets, batch)
                    if sample:
                        self._sync()
                        t2 = clock()
                    with r_bwd:
                        step.backward(loss, window, bs, in_window)  # weighted by its size in its window
                detached = loss.detach()
            first = False
            pend_loss.append(detached)
            pend_bs.append(bs)
            kept = self.kept
            if kept is not None:  # list appends, no call: the loop's hot path (_kept)
                kept.batches.append(batch)
                kept.losses.append(detached)
            pending.taken += 1
            st.batch += 1
            st.samples += bs
            if cb.has("on_train_batch_end"):
                cb.call("on_train_batch_end", trainer=t, batch_idx=st.batch - 1, loss=detached)
            del loss, outputs, targets, batch, detached
            x = None
            if sample:
                self._sync()
                t3 = clock()
            if closes:
                self._optimizer_step(step.window_rescale(window, in_window))
                in_window = 0
                if sample:
                    self._sync()
                    t4 = clock()
                    # the step's breakdown: each of the window's micro-batches taken as long as this one, its last
                    per = window * 1e3
                    self._step_times = {
                        "data": (t1 - t0) * per,
                        "forward": (t2 - t1) * per,
                        "backward": (t3 - t2) * per,
                        "optimizer": (t4 - t3) * 1e3,
                    }
                    self._samples.append((st.global_step, self._step_times))
                    due = False
                if control.dirty:
                    self.live.apply()
                    amp = steps.autocast()  # a change at this boundary may have switched the precision
                    if self._rewound:
                        return
                if self.max_steps is not None and st.global_step >= self.max_steps:
                    control.request_stop(f"max_steps={self.max_steps} reached")
                if control.stop_requested:
                    break
            if time.perf_counter() >= self._next_refresh:
                self._refresh(time.perf_counter())
        if in_window:  # the loader ended inside a window (len() was wrong): step with the exact scale
            self._optimizer_step(self.step.window_rescale(window, in_window))
        if control.stop_requested and (n is None or st.batch < n):
            self._refresh(time.perf_counter())
            return
        self._end_epoch()

    def _optimizer_step(self, rescale: float) -> None:
        t, st = self.host, self.state
        if self._sched_end is not None and t.scheduler.last_epoch >= self._sched_end:
            from nbtrainer._data._validate_batch import onecycle_overflow

            raise onecycle_overflow(self._sched_end, epoch=st.epoch + 1, batch=st.batch, global_step=st.global_step)
        skipped, lr = self.step.step(rescale)  # unscale, clip, NaN gate, step, per-step scheduler (_step)
        st.step_lrs = self.step.scheduled_from
        st.global_step += 1
        if skipped:
            st.skipped_steps += 1
            self.nonfinite.stop_if_shared(st.global_step, st.epoch + 1, self.live.requests.request_stop)
        self.pending.mark_step(st.global_step, lr)
        self._mid_window = False
        cb = t.callbacks
        # scheduled consumers (Health, Samples) only at their steps: one int compared here (_events/_stream)
        if skipped or st.global_step >= cb.next_due or cb.has("on_optimizer_step"):
            cb.call("on_optimizer_step", trainer=t, step=st.global_step, skipped=skipped)
        kept = self.kept
        if kept is not None and kept.batches:  # the window's events are done: drop its batches, keep its last
            kept.last = kept.batches[-1]
            kept.batches.clear()
            kept.losses.clear()
        if self.live.has_deferred():
            self.live.run_deferred()
        if self.profiler is not None:
            self.profiler.step()

    def rewind(self) -> None:
        """The run state was just restored from a checkpoint at a step boundary (``Trainer.rollback``): drop the
        values of the steps since then, show the restored state from the next refresh (still paused), leave the
        epoch in progress and go on from there (the resume path: the epoch's order replayed, then the saved RNG)."""
        self.pending.drop()
        if self.kept is not None:
            self.kept.clear()
        self.order.give_back()
        self.state, self._rewound = self.host.run_state.loop_state, True
        self.live.requests.dirty = True  # the loop looks at the next step boundary (also from a callback)

    def keep_window_batches(self) -> KeptBatches:
        """Keep the open window's micro-batches for a consumer (``_kept``), for the rest of the fit."""
        if self.kept is None:
            self.kept = KeptBatches()
        return self.kept

    def at_step_boundary(self) -> bool:
        """True between optimizer steps: no micro-batch of an unfinished window has been taken, so the
        state can be saved and resumed exactly (a Ctrl-C that raised mid-window cannot be)."""
        return not self._mid_window

    # -- what others read of a running fit (checkpoints, OOM advice, the control surface) ----------
    @property
    def grad_norm(self) -> torch.Tensor | None:
        """The total gradient norm before clipping of the step being taken (a device tensor, never read here), or
        None without ``max_grad_norm``: what ``nbtrainer.Health`` reports as the step's norm."""
        return self.step.grad_norm

    @property
    def data_mode(self) -> str:
        """How the training batches reach the device (``"loader"``, ``"batched"``, ``"device"``, ``"pinned"``)."""
        return self.train_data.mode

    def pending_points(self) -> tuple[list[tuple[int, float, float]], dict[int, tuple[float, ...]]]:
        """Per-step ``(step, loss, lr)`` points read, not yet delivered by a refresh, and their groups' LRs by step."""
        return list(self.pending.points), dict(self.pending.group_lrs)

    def epoch_elapsed(self) -> float:
        """Seconds spent in the current epoch (a resumed epoch counts its time before the resume)."""
        return time.perf_counter() - self._epoch_start

    def fit_elapsed(self) -> float:
        """Seconds since this fit started (not counting the run before a resume)."""
        return time.perf_counter() - self._fit_start

    def last_batch_size(self) -> int | None:
        """The size of the last micro-batch taken and not yet read (OOM advice for loaders without one)."""
        sizes = self.pending.sizes
        return int(sizes[-1]) if sizes else None

    def release_pending(self) -> None:
        """Drop the device values not yet read (an out-of-memory error frees them with the step's tensors)."""
        self.pending.release()

    def open_window(self) -> list[tuple[float, int]]:
        """``(loss, batch size)`` read so far of the accumulation window still open (the NaN gate's report)."""
        return list(self.pending.open)

    def refresh(self) -> None:
        """Read the pending values now and deliver a progress snapshot (``on_refresh``)."""
        self._refresh(time.perf_counter())

    def read_memory(self) -> None:
        """Read the memory of the window since the last refresh into the progress (host counters only)."""
        mem, p = self._memory, self.progress
        p.memory, p.memory_peak, p.memory_capacity, p.memory_kind = mem.window(), mem.peak, mem.capacity, mem.kind

    # -- reading the device: throttled --------------------------------------------------------
    def flush(self) -> None:
        """Read pending losses/metric values (one transfer) into host sums and per-step points."""
        t, st = self.host, self.state
        read = self.pending.read(st, t.run_state.train_metrics, gating=self.nonfinite.gating)  # SYNC (throttled)
        if read is None:
            return
        losses, points = read
        # the NaN/inf gate: loop -> guard, with what it reports from (no way back through the trainer)
        self.nonfinite.check(
            losses,
            points,
            open_window=self.pending.open,
            epoch=st.epoch + 1,
            global_step=st.global_step,
            history=t.run_state.history,
            request_stop=self.live.requests.request_stop,
        )

    def _refresh(self, now: float, final: bool = False) -> None:
        t, st, p = self.host, self.state, self.progress
        self.flush()
        elapsed_epoch = now - self._epoch_start
        # "paused" only once the loop really holds (the trainer sets its status there); until then "pausing".
        requests = self.live.requests
        if requests.stop_requested:
            p.status = "stopping"
        elif t.status == "paused":
            p.status = "paused"
        else:
            p.status = "pausing" if requests.paused else "running"
        p.batch, p.global_step, p.samples = st.batch, st.global_step, st.samples
        p.elapsed = now - self._fit_start + t.run_state.elapsed_before
        p.epoch_elapsed = elapsed_epoch
        p.samples_per_s = st.samples / elapsed_epoch if elapsed_epoch > 0 else 0.0
        counted = st.samples - st.nonfinite_samples
        p.loss = st.loss_sum / counted if counted else None
        p.lr = float(self.step.optimizer.param_groups[0]["lr"])
        used = st.step_lrs if st.step_lrs is not None else [g["lr"] for g in self.step.optimizer.param_groups]
        p.step_lrs = [float(v) for v in used]
        p.metrics = t.run_state.train_metrics.running(st.samples)
        p.step_points, p.step_group_lrs = self.pending.take_points()
        p.grad_accum_steps = t.options.step.grad_accum_steps
        p.skipped_steps = st.skipped_steps
        p.step_times = self._step_times
        p.step_samples, self._samples = self._samples, []
        self.read_memory()
        if self.n_batches and st.batch:
            rate = elapsed_epoch / st.batch
            p.eta_epoch = rate * (self.n_batches - st.batch)
            p.eta_fit = p.eta_epoch + rate * self.n_batches * max(p.epochs - st.epoch - 1, 0)  # p.epochs: max_steps
        t.callbacks.call("on_refresh", trainer=t, progress=p)
        self._last_refresh = now
        self._next_refresh = time.perf_counter() + t.options.run.refresh_interval

    def _end_epoch(self) -> None:
        self.refresh()  # then the epoch's row, validation, the epoch scheduler, deferred saves (_epoch_end)
        end_epoch(self.host, self.state, self.live, self.order, self.progress, self.val_data, self.epoch_elapsed())
