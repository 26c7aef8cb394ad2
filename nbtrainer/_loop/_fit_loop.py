"""The fit loop: epochs, micro-batches, accumulation windows, optimizer steps and the throttled refresh.

Sync budget (host <-> device) of one fit, on purpose and nowhere else:

1. the throttled refresh (``refresh_interval``, default 0.25 s): one ``tolist()`` of the pending
   per-micro-batch losses and callable-metric values, stacked on the device first;
2. the end of each epoch: the same flush, torchmetrics' ``compute``, and validation's single read;
3. fp16 only: GradScaler's own inf check inside ``scaler.step`` (one per optimizer step);
4. the sampled step-time breakdown (every ``timing_every`` micro-batches, CUDA only: ``synchronize``
   around the phases of that one step);
5. once per fit, CUDA only: ``mem_get_info`` and the copy of a device-resident dataset (``_prefetch``).

The data path adds nothing per step: batched fetch, device-resident slicing and side-stream prefetch
are asynchronous (``_prefetch``'s docstring says how).

Everything else (loss sums, metric values, the scheduler-skip flag) stays on the device or is
learned without reading it (the optimizer's step post-hook tells whether fp16's scaler skipped).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import time
from collections.abc import Iterator
from typing import Any

import torch

from nbtrainer._data._batch import batch_size_of, move_to_device
from nbtrainer._data._prefetch import DataPath
from nbtrainer._loop._memory import MemoryProbe
from nbtrainer._loop._metrics import exact_add

Tensor = torch.Tensor
_PAIR = (tuple, list)

__all__ = ["FitLoop", "LoopState"]

_NULL = contextlib.nullcontext()


class LoopState:
    """Where a fit is: everything needed to continue exactly (plain data)."""

    def __init__(self) -> None:
        self.epoch = 0  # 0-based index of the current epoch
        self.batch = 0  # batches consumed in the current epoch
        self.global_step = 0  # optimizer-step windows completed (skipped fp16 steps included)
        self.skipped_steps = 0
        self.epoch_complete = False
        self.samples = 0
        self.loss_sum = 0.0
        self.loss_parts: list[float] = []  # exact running sum of loss * batch size (see _metrics.exact_add)
        self.nonfinite_samples = 0  # samples whose loss was left out (on_nonfinite="skip"/"stop")
        self.epoch_time = 0.0  # seconds spent in this epoch before a resume
        # The sampler generator's state at the start of the current epoch; advanced to the next
        # epoch's start state when an epoch completes (exact resume mid-epoch and at epoch boundaries).
        self.sampler_state: torch.Tensor | None = None

    def state_dict(self) -> dict[str, Any]:
        return dict(vars(self))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            setattr(self, key, value)


def _lookahead(it: Iterator) -> Iterator[tuple[Any, bool]]:
    """Yield (item, is_last) with one item of lookahead (for loaders without len)."""
    try:
        current = next(it)
    except StopIteration:
        return
    for nxt in it:
        yield current, False
        current = nxt
    yield current, True


class FitLoop:
    def __init__(
        self, trainer: Any, train_loader: Any, val_loader: Any, epochs: int, max_steps: int | None, profiler: Any
    ) -> None:
        self.t = trainer
        self.train_loader = train_loader
        self.val_loader = val_loader
        self.epochs = epochs
        self.max_steps = max_steps
        self.profiler = profiler
        self.state = trainer._state
        self.n_batches = _safe_len(train_loader)
        # OneCycleLR cannot step past total_steps; a loader without len() is only caught here (see _optimizer_step)
        sched = trainer.scheduler
        self._sched_end: int | None = (
            sched.total_steps
            if isinstance(sched, torch.optim.lr_scheduler.OneCycleLR) and trainer._scheduler_per_step
            else None
        )
        # pending, not yet read from the device (see the sync budget above)
        self._pend_loss: list[torch.Tensor] = []
        self._pend_bs: list[int] = []
        self._pend_base = 0  # cumulative micro-batch index of _pend_loss[0]
        self._micro_total = 0
        self._step_marks: list[tuple[int, int, float]] = []  # (global_step, cum micro end, lr)
        self._open_window: list[tuple[float, int]] = []
        self._stepped = False
        self._mid_window = False  # micro-batches taken since the last optimizer step (see at_step_boundary)
        self._fit_start = time.perf_counter()
        self._epoch_start = self._fit_start
        self._last_refresh = self._fit_start
        self._next_refresh = 0.0
        self._step_times: dict[str, float] | None = None
        self.progress = trainer.progress
        self._memory = MemoryProbe(trainer.device)
        # Where batches come from (_prefetch.DataPath): the loader's iterator, or one indexing call per
        # batch, on CUDA device-resident or prefetched. Decided at the first batch, kept for the fit.
        path = {"device": trainer.device, "enabled": trainer.fast_fetch, "fraction": trainer.data_on_device}
        self.train_data = DataPath(train_loader, **path)
        self.val_data = DataPath(val_loader, **path) if val_loader is not None else None

    # -- helpers -------------------------------------------------------------------------------
    def _sync(self) -> None:
        if self.t.device.type == "cuda":
            torch.cuda.synchronize(self.t.device)

    def _on_step_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._stepped = True

    # -- the fit -------------------------------------------------------------------------------
    def run(self) -> None:
        t, st = self.t, self.state
        hook = t.optimizer.register_step_post_hook(self._on_step_hook)
        try:
            while st.epoch < self.epochs and not t._control.stop_requested:
                if st.epoch_complete:
                    st.epoch += 1
                    st.epoch_complete = False
                    st.batch = 0
                    continue
                self._train_epoch()
                if t._control.stop_requested and not st.epoch_complete:
                    break
            if t._pending_rng is not None:  # resumed a run that had nothing left to do
                self._restore_rng()
        finally:
            hook.remove()

    def _restore_rng(self) -> None:
        from nbtrainer._setup._seed import restore_rng

        restore_rng(self.t._pending_rng)
        self.t._pending_rng = None

    def _train_epoch(self) -> None:
        t, st, cb = self.t, self.state, self.t.callbacks
        resumed_mid_epoch = st.batch > 0
        epoch_no = st.epoch + 1
        loader = self.train_loader
        t.strategy.set_epoch(loader, st.epoch)
        gen = t._sampler_generator(loader)
        if gen is not None:
            if st.sampler_state is not None:  # this epoch's start state (saved, or left by the last epoch)
                gen.set_state(st.sampler_state)
            else:
                st.sampler_state = gen.get_state()
        if not resumed_mid_epoch:
            st.samples, st.loss_sum, st.epoch_time = 0, 0.0, 0.0
            st.loss_parts, st.nonfinite_samples = [], 0
            t._train_metrics.reset()
            if t._pending_rng is not None:  # resumed at an epoch boundary: RNG as it was when saved
                self._restore_rng()
        t.model.train()
        p = self.progress
        p.epoch, p.batch, p.batches, p.stage, p.status = epoch_no, st.batch, self.n_batches, "train", "running"
        self._epoch_start = time.perf_counter() - st.epoch_time
        if not resumed_mid_epoch:  # the epoch already started in the run that wrote the checkpoint
            cb.call("on_epoch_start", trainer=t, epoch=epoch_no)

        # a resumed epoch skips the batches it already trained on (same data order); RNG restored afterwards
        it: Iterator = self.train_data.batches(st.batch if resumed_mid_epoch else 0)
        if t._pending_rng is not None:
            self._restore_rng()

        n = self.n_batches
        # zip/repeat keeps iteration in C; without len() one batch of lookahead finds the window end.
        pairs = zip(it, itertools.repeat(False)) if n is not None else _lookahead(it)
        window = in_window = 0
        timing_every = t.timing_every or 0
        metrics = t._train_metrics if t._train_metrics else None
        first = st.global_step == 0 and st.batch == 0
        guard = t._nonfinite
        gating = guard.gating
        device, non_blocking, scaler, model, control = t.device, t.non_blocking, t.scaler, t.model, t._control
        criterion, bound = t.criterion, cb._bound
        no_sync = t.strategy.no_sync if t.strategy.distributed else None
        fast = t._default_compute()  # (x, y) batches go straight to model(x) and criterion(out, y)
        prof = self.profiler is not None
        r_data = torch.profiler.record_function("nbt.data") if prof else _NULL
        r_fwd = torch.profiler.record_function("nbt.forward") if prof else _NULL
        r_bwd = torch.profiler.record_function("nbt.backward") if prof else _NULL
        amp = t._autocast()
        pend_loss, pend_bs = self._pend_loss, self._pend_bs
        t1 = t2 = t3 = 0.0
        while True:
            sample = timing_every and not self._micro_total % timing_every
            t0 = time.perf_counter() if sample else 0.0
            with r_data:
                try:
                    batch, is_last = next(pairs)
                except StopIteration:
                    break
            if in_window == 0:
                self._mid_window = True
                k = t.grad_accum_steps
                remaining = n - st.batch if n is not None else 0
                window = min(k, remaining) if remaining > 0 else k
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
                t1 = time.perf_counter()
            if bound["on_train_batch_start"]:
                cb.call("on_train_batch_start", trainer=t, batch=batch, batch_idx=st.batch)
            # DDP: non-final micro-steps skip the gradient all-reduce for forward AND backward.
            with no_sync(model, not closes) if no_sync is not None else _NULL:
                with r_fwd, amp:
                    if first:  # staged, with clear errors (same computation)
                        loss, outputs, targets = t._first_compute(batch)
                    elif pair:
                        outputs = model(x)
                        loss = criterion(outputs, targets)
                    else:
                        loss, outputs, targets = t._compute(batch)
                if first:
                    t._check_first_loss(loss, outputs, targets)
                if gating:  # on_nonfinite="skip"/"stop": a device flag per window, never read here
                    guard.observe(loss)
                if metrics is not None:
                    with torch.no_grad():
                        metrics.update(outputs, targets)
                    if first:
                        metrics.check_first()
                if sample:
                    self._sync()
                    t2 = time.perf_counter()
                with r_bwd:
                    scaled = loss / window if window != 1 else loss
                    (scaler.scale(scaled) if scaler is not None else scaled).backward()
            first = False
            bs = targets.shape[0] if type(targets) is Tensor and targets.ndim else batch_size_of(targets, batch)
            detached = loss.detach()
            pend_loss.append(detached)
            pend_bs.append(bs)
            self._micro_total += 1
            st.batch += 1
            st.samples += bs
            if bound["on_train_batch_end"]:
                cb.call("on_train_batch_end", trainer=t, batch_idx=st.batch - 1, loss=detached)
            del loss, outputs, targets, batch, scaled, detached
            x = None
            if sample:
                self._sync()
                t3 = time.perf_counter()
            if closes:
                self._optimizer_step(window / in_window if in_window != window else 1.0)
                in_window = 0
                if sample:
                    self._sync()
                    t4 = time.perf_counter()
                    self._step_times = {
                        "data": (t1 - t0) * 1e3,
                        "forward": (t2 - t1) * 1e3,
                        "backward": (t3 - t2) * 1e3,
                        "optimizer": (t4 - t3) * 1e3,
                    }
                if control.dirty:
                    t._apply_control()
                if self.max_steps is not None and st.global_step >= self.max_steps:
                    control.request_stop(f"max_steps={self.max_steps} reached")
                if control.stop_requested:
                    break
            if time.perf_counter() >= self._next_refresh:
                self._refresh(time.perf_counter())
        if in_window:  # the loader ended inside a window (len() was wrong): step with the exact scale
            self._optimizer_step(window / in_window)
        if control.stop_requested and (n is None or st.batch < n):
            self._refresh(time.perf_counter())
            return
        self._end_epoch()

    def _optimizer_step(self, rescale: float) -> None:
        t, st = self.t, self.state
        opt, scaler, bound = t.optimizer, t.scaler, t.callbacks._bound
        if self._sched_end is not None and t.scheduler.last_epoch >= self._sched_end:
            from nbtrainer._data._validate_batch import onecycle_overflow

            raise onecycle_overflow(t, self._sched_end)
        r_opt = torch.profiler.record_function("nbt.optimizer_step") if self.profiler is not None else _NULL
        with r_opt:
            if scaler is not None:
                scaler.unscale_(opt)
            if rescale != 1.0:
                grads = [p.grad for p in t._params if p.grad is not None]
                if grads:
                    torch._foreach_mul_(grads, rescale)
            if t.max_grad_norm is not None:
                # Never read the returned norm here: that would be a sync per step.
                torch.nn.utils.clip_grad_norm_(t._params, t.max_grad_norm)
            if bound["on_before_optimizer_step"]:
                t.callbacks.call("on_before_optimizer_step", trainer=t, optimizer=opt)
            lr = opt.param_groups[0]["lr"]
            self._stepped = False
            # on_nonfinite="skip"/"stop": a window with a non-finite loss does not update (see _nonfinite)
            allowed = t._nonfinite.allow_step(opt, scaler) if t._nonfinite.gating else True
            if scaler is not None:
                scaler.step(opt)  # fp16: the scaler's inf check syncs here (documented sync point 3)
                scaler.update()
            elif allowed:
                opt.step()
            opt.zero_grad(set_to_none=True)
        skipped = not self._stepped
        st.global_step += 1
        if skipped:
            st.skipped_steps += 1
        elif t.scheduler is not None and t._scheduler_per_step:
            t.scheduler.step()
        self._step_marks.append((st.global_step, self._micro_total, lr))
        self._mid_window = False
        if bound["on_optimizer_step"]:
            t.callbacks.call("on_optimizer_step", trainer=t, step=st.global_step, skipped=skipped)
        if t._deferred:
            t._run_deferred()
        if self.profiler is not None:
            self.profiler.step()

    def at_step_boundary(self) -> bool:
        """True between optimizer steps: no micro-batch of an unfinished window has been taken, so the
        state can be saved and resumed exactly (a Ctrl-C that raised mid-window cannot be)."""
        return not self._mid_window

    def read_memory(self) -> None:
        """Read the memory of the window since the last refresh into the progress (host counters only)."""
        mem, p = self._memory, self.progress
        p.memory, p.memory_peak, p.memory_capacity, p.memory_kind = mem.window(), mem.peak, mem.capacity, mem.kind

    # -- reading the device: throttled --------------------------------------------------------
    def flush(self) -> None:
        """Read pending losses/metric values (one transfer) into host sums and per-step points."""
        t, st = self.t, self.state
        if not self._pend_loss:
            return
        n = len(self._pend_loss)
        parts = [torch.stack(self._pend_loss).float()]  # 0-d losses (checked on the first batch)
        parts += t._train_metrics.drain()
        host = torch.cat([p.reshape(-1).to(parts[0].device) for p in parts]).tolist()  # SYNC (throttled)
        losses = host[:n]
        metric_vals = {name: host[n * (i + 1) : n * (i + 2)] for i, name in enumerate(t._train_metrics.pending)}
        bss = self._pend_bs
        if t._nonfinite.gating:  # skipped windows stay out of the running loss
            st.nonfinite_samples += sum(b for v, b in zip(losses, bss, strict=True) if not math.isfinite(v))
            st.loss_sum = exact_add(
                st.loss_parts, [v * b for v, b in zip(losses, bss, strict=True) if math.isfinite(v)]
            )
        else:  # exact whatever the refresh chunking (a resumed run reproduces the epoch loss bit for bit)
            st.loss_sum = exact_add(st.loss_parts, [v * b for v, b in zip(losses, bss, strict=True)])
        t._train_metrics.absorb(metric_vals, bss)
        # One point per closed optimizer step: its window's sample-weighted mean loss. Windows are found
        # from the step marks' cumulative micro-batch ends (a one-batch window is just its loss).
        base = self._pend_base
        vals = self._open_window
        vals.extend(zip(losses, bss, strict=True))
        first = base + n - len(vals)  # cumulative micro-batch index of vals[0]
        points: list[tuple[int, float, float]] = []
        marks = self._step_marks
        lo = j = 0
        for step, cum, lr in marks:
            if cum > base + n:
                break
            hi = cum - first
            if hi - lo == 1:
                points.append((step, vals[lo][0], float(lr)))
            else:
                window = vals[lo:hi]
                total = sum(b for _, b in window) or 1
                points.append((step, sum(v * b for v, b in window) / total, float(lr)))
            lo = hi
            j += 1
        self._open_window = vals[lo:]
        self._step_marks = marks[j:]
        self._pend_base = base + n
        # cleared in place: the epoch loop holds local aliases of these lists
        self._pend_loss.clear()
        self._pend_bs.clear()
        self._new_points = getattr(self, "_new_points", []) + points
        t._check_nonfinite(losses, points)

    def _refresh(self, now: float, final: bool = False) -> None:
        t, st, p = self.t, self.state, self.progress
        self.flush()
        elapsed_epoch = now - self._epoch_start
        # "paused" only once the loop really holds (the trainer sets its status there); until then "pausing".
        if t._control.stop_requested:
            p.status = "stopping"
        elif t.status == "paused":
            p.status = "paused"
        else:
            p.status = "pausing" if t._control.paused else "running"
        p.batch, p.global_step, p.samples = st.batch, st.global_step, st.samples
        p.elapsed = now - self._fit_start + t._elapsed_before
        p.epoch_elapsed = elapsed_epoch
        p.samples_per_s = st.samples / elapsed_epoch if elapsed_epoch > 0 else 0.0
        counted = st.samples - st.nonfinite_samples
        p.loss = st.loss_sum / counted if counted else None
        p.lr = float(t.optimizer.param_groups[0]["lr"])
        p.metrics = t._train_metrics.running(st.samples)
        p.step_points, self._new_points = getattr(self, "_new_points", []), []
        p.grad_accum_steps = t.grad_accum_steps
        p.skipped_steps = st.skipped_steps
        p.step_times = self._step_times
        self.read_memory()
        if self.n_batches and st.batch:
            rate = elapsed_epoch / st.batch
            p.eta_epoch = rate * (self.n_batches - st.batch)
            p.eta_fit = p.eta_epoch + rate * self.n_batches * max(p.epochs - st.epoch - 1, 0)  # p.epochs: max_steps
        t.callbacks.call("on_refresh", trainer=t, progress=p)
        self._last_refresh = now
        self._next_refresh = time.perf_counter() + t.refresh_interval

    def _end_epoch(self) -> None:
        t, st, cb = self.t, self.state, self.t.callbacks
        now = time.perf_counter()
        self._refresh(now)
        epoch_no = st.epoch + 1
        epoch_time = now - self._epoch_start
        samples, loss_sum = st.samples, st.loss_sum
        metric_sums = [t._train_metrics.sums[n] for n in t._train_metrics.sums]
        reduced = t.strategy.reduce_sums(
            [float(samples), loss_sum, float(samples - st.nonfinite_samples), *metric_sums]
        )
        count = reduced[0] or 1.0
        loss = reduced[1] / reduced[2] if reduced[2] else math.nan
        logs: dict[str, Any] = {"epoch": epoch_no, "lr": self.progress.lr, "loss": loss}
        for name, total in zip(t._train_metrics.sums, reduced[3:], strict=True):
            logs[name] = total / count
        logs.update({k: v for k, v in t._train_metrics.compute(int(count)).items() if k not in t._train_metrics.sums})
        if self.val_loader is not None and epoch_no % t.val_every_n_epochs == 0:
            cb.call("on_validation_start", trainer=t)
            self.progress.stage = "val"
            val_logs = t._evaluate(self.val_data, prefix="val_")
            cb.call("on_validation_end", trainer=t, logs=val_logs)
            logs.update(val_logs)
        logs["time"] = epoch_time
        logs["samples_per_s"] = samples * t.strategy.world_size / epoch_time if epoch_time > 0 else 0.0
        logs["steps"] = st.global_step
        logs["skipped_steps"] = st.skipped_steps
        gen = t._sampler_generator(self.train_loader)
        if gen is not None:
            st.sampler_state = gen.get_state()  # the next epoch starts from here (also after a resume)
        st.epoch_complete = True
        st.epoch_time = epoch_time
        cb.call("on_epoch_end", trainer=t, epoch=epoch_no, logs=logs)
        # After the callbacks, so they see the LR this epoch trained with (LRMonitor's lr_group0 is logs["lr"]);
        # before the deferred saves, so a checkpoint holds the stepped schedule the next epoch starts from.
        if t.scheduler is not None and not t._scheduler_per_step:
            t._step_epoch_scheduler(logs)
        t._run_deferred()
        # A stop requested by a callback at epoch end (EarlyStopping) is decided on every rank together.
        if t.strategy.any_rank(t._control.stop_requested) and not t._control.stop_requested:
            t._control.request_stop("another rank stopped")


def _safe_len(loader: Any) -> int | None:
    try:
        return len(loader)
    except TypeError:
        return None
