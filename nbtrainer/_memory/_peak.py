"""The measured peak of live tensor memory over a block of code, on any device (the CPU included).

``torch.cuda.max_memory_allocated`` exists only on CUDA; elsewhere a sum of parts (parameters + gradients +
optimizer state + saved activations) is not a peak: temporaries come and go, and the parts are not all
alive at once. :func:`track_peak` follows every tensor storage instead:

* the ones alive on entry that matter (the model's parameters, buffers and gradients, the optimizer's state,
  the inputs) and any older tensor the code reads (counted as ``inputs``);
* every output of every operator (a ``TorchDispatchMode``: also the ops autograd runs in backward and the
  optimizer's kernels), each storage counted once however many views share it;
* each storage's release, through a weak reference to its (preserved) Python object.

The running total's maximum is the peak; at each new peak the split by category is kept, so the breakdown
sums to the peak. Categories: ``parameters``, ``buffers``, ``gradients`` (a ``.grad``: marked as autograd
accumulates it), ``optimizer_state`` (``optimizer.state``, and what ``optimizer.step()`` allocates while it
runs), ``inputs`` (tensors first seen as an operator's input: the batch, the outputs of compiled code) and
``activations`` (everything else the code allocates: saved activations, their gradients, temporaries).
Allocations that never reach an operator's output (a kernel's internal scratch space, compiled code's
buffers, the CUDA caching allocator's rounding) are not seen; code compiled by ``torch.compile`` runs
compiled (the mode ignores its internals).
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["CATEGORIES", "FitPeak", "PeakTracker", "track_peak"]

#: The categories of :attr:`PeakTracker.breakdown`, in display order.
CATEGORIES = ("parameters", "buffers", "gradients", "optimizer_state", "inputs", "activations")


def _storages(t: torch.Tensor) -> list[torch.UntypedStorage]:
    """The storages behind ``t`` (a wrapper subclass: its inner tensors')."""
    if type(t) not in (torch.Tensor, nn.Parameter) and hasattr(t, "__tensor_flatten__"):
        names, _ = t.__tensor_flatten__()
        inner = (getattr(t, n) for n in names)
        return [s for x in inner if isinstance(x, torch.Tensor) for s in _storages(x)]  # a mesh is no tensor
    if t.device.type == "meta":
        return []
    try:
        return [t.untyped_storage()]
    except (RuntimeError, NotImplementedError, TypeError):  # a subclass with no storage of its own
        return []


class PeakTracker(TorchDispatchMode):
    """Live tensor bytes, their maximum and the split at the maximum, while the context is active.

    Use :func:`track_peak` rather than this class directly.

    Attributes:
        peak_bytes: The largest total of live storage bytes seen (since entry or the last :meth:`reset`).
        breakdown: ``{category: bytes}`` at that peak (see :data:`CATEGORIES`); sums to ``peak_bytes``.
        largest: ``{category: bytes}``, each category's own maximum over the same span.
        resident: ``{category: bytes}`` live when :meth:`freeze` was called (after a training step: what
            stays allocated between steps, e.g. the optimizer's state without the step's temporaries).
        current_bytes: Live bytes now.
    """

    def __init__(
        self, *, count_reads: bool = True, device_type: str | None = None, exclude: Iterable[torch.Tensor] = ()
    ) -> None:
        """``count_reads=False``: only what operators create is counted (not older tensors they read), e.g. to leave
        out parameters that are counted by arithmetic; ``exclude``: tensors whose storage is never counted, views
        of them included (a transposed weight); ``device_type``: only storages on that kind of device."""
        super().__init__()
        self._count_reads = count_reads
        self._device_type = device_type
        self._excluded = [st for t in exclude for st in _storages(t)]  # held: their ids stay theirs
        self._excluded_ids = {id(st) for st in self._excluded}
        self._live: dict[int, list[Any]] = {}  # id(storage) -> [nbytes, category, weakref, birth]
        self._born = 0  # counts storages seen: an entry born at or before the peak's count was alive then
        self._peak_born = 0
        self._totals = dict.fromkeys(CATEGORIES, 0)
        self._lock = threading.RLock()  # a release can be reported from another thread
        self._frozen = False
        self._in_step = False
        self._handles: list[Any] = []
        self._watched: list[tuple[nn.Module | None, Any]] = []
        self.current_bytes = 0
        self.peak_bytes = 0
        self.breakdown = dict(self._totals)
        self.largest = dict(self._totals)
        self.resident: dict[str, int] = {}
        #: when a list: each storage's birth ``(0, id, nbytes)`` and release ``(1, id, 0)``, in order (the memory
        #: planner replays them through a model of CUDA's caching allocator); ids count births from 1
        self.trace: list[tuple[int, int, int]] | None = None

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # torch.compile skips every frame under a mode that does not say this (torchao's 8-bit optimizers
        # compile their step with fullgraph=True: an error then); compiled code's scratch space goes unseen
        return True

    # -- bookkeeping ---------------------------------------------------------------------------------
    def _freed(self, key: int, _ref: Any) -> None:
        with self._lock:
            entry = self._live.pop(key, None)
            if entry is not None:
                self._totals[entry[1]] -= entry[0]
                self.current_bytes -= entry[0]
                if self.trace is not None:
                    self.trace.append((1, entry[3], 0))

    def _add(self, t: torch.Tensor, category: str, relabel: bool) -> None:
        if self._device_type is not None and t.device.type != self._device_type:
            return
        for st in _storages(t):
            key = id(st)
            if key in self._excluded_ids:
                continue
            entry = self._live.get(key)
            if entry is None:
                nbytes = st.nbytes()
                ref = weakref.ref(st, functools.partial(self._freed, key))
                self._born += 1
                self._live[key] = [nbytes, category, ref, self._born]
                self._totals[category] += nbytes
                self.current_bytes += nbytes
                if self.trace is not None:
                    self.trace.append((0, self._born, nbytes))
                continue
            nbytes = st.nbytes()
            if nbytes != entry[0]:  # resized in place (an out= op)
                self._totals[entry[1]] += nbytes - entry[0]
                self.current_bytes += nbytes - entry[0]
                entry[0] = nbytes
                if self.trace is not None:  # a new allocation replaces the old one (the id stays the storage's)
                    self.trace += [(1, entry[3], 0), (0, entry[3], nbytes)]
            if relabel and entry[1] != category:
                old, size = entry[1], entry[0]
                self._totals[old] -= size
                self._totals[category] += size
                if entry[3] <= self._peak_born:  # alive at the peak (storages never come back): relabel it there
                    self.breakdown[old] -= size
                    self.breakdown[category] += size
                self.largest[category] = max(self.largest[category], self._totals[category])
                entry[1] = category

    def _note_peak(self) -> None:
        for name, value in self._totals.items():
            if value > self.largest[name]:
                self.largest[name] = value
        if self.current_bytes > self.peak_bytes:
            self.peak_bytes = self.current_bytes
            self.breakdown = dict(self._totals)
            self._peak_born = self._born

    def _known(self) -> Iterator[tuple[torch.Tensor, str]]:
        for model, optimizer in self._watched:
            if model is not None:
                for p in model.parameters():
                    yield p, "parameters"
                    if p.grad is not None:
                        yield p.grad, "gradients"
                for b in model.buffers():
                    yield b, "buffers"
            if optimizer is not None:
                for group in optimizer.param_groups:
                    for p in group["params"]:
                        yield p, "parameters"
                        if p.grad is not None:
                            yield p.grad, "gradients"
                for state in optimizer.state.values():
                    for value in state.values() if isinstance(state, dict) else ():
                        if isinstance(value, torch.Tensor):
                            yield value, "optimizer_state"

    # -- public --------------------------------------------------------------------------------------
    def watch(self, *, model: nn.Module | None = None, optimizer: Any = None, inputs: Any = None) -> None:
        """Count (and label) ``model``'s parameters, buffers and gradients, ``optimizer``'s state and ``inputs``.

        May be called again inside the context, e.g. once a trainer has built its optimizer.
        """
        with self._lock:
            self._watched.append((model, optimizer))
            params = list(model.parameters()) if model is not None else []
            if optimizer is not None:
                params += [p for g in optimizer.param_groups for p in g["params"]]
            for p in {id(p): p for p in params}.values():
                if p.requires_grad:
                    self._handles.append(p.register_post_accumulate_grad_hook(self._grad_ready))
            if optimizer is not None:
                self._handles.append(optimizer.register_step_pre_hook(self._step_start))
                self._handles.append(optimizer.register_step_post_hook(self._step_end))
            for t, category in self._known():
                self._add(t, category, relabel=True)
            for t in tree_flatten(inputs)[0]:
                if isinstance(t, torch.Tensor):
                    self._add(t, "inputs", relabel=False)
            self._note_peak()

    def birth(self, t: torch.Tensor) -> int:
        """The trace id of ``t``'s storage (0: not followed)."""
        entry = next((self._live.get(id(st)) for st in _storages(t)), None)
        return entry[3] if entry is not None else 0

    def label(self, t: torch.Tensor, category: str) -> None:
        """Count ``t``'s storage under ``category`` from now on (at the peak too, if it was alive then)."""
        with self._lock:
            self._add(t, category, relabel=True)
            self._note_peak()

    def reset(self) -> None:
        """Start a new peak from what is alive now (e.g. after a warm-up step); labels are refreshed."""
        with self._lock:
            for t, category in self._known():
                self._add(t, category, relabel=True)
            self.peak_bytes = self.current_bytes
            self.breakdown = dict(self._totals)
            self.largest = dict(self._totals)
            self._peak_born = self._born

    def freeze(self) -> None:
        """Stop counting: ``peak_bytes``, ``breakdown`` and ``largest`` keep their values; ``resident`` is
        what is live now."""
        with self._lock:
            self.resident = dict(self._totals)
            self._frozen = True

    def _grad_ready(self, p: torch.Tensor) -> None:
        if p.grad is not None and not self._frozen:
            with self._lock:
                self._add(p.grad, "gradients", relabel=True)

    def _step_start(self, *_: Any) -> None:
        self._in_step = True

    def _step_end(self, *_: Any) -> None:
        self._in_step = False
        if not self._frozen:
            with self._lock:
                for t, category in self._known():
                    self._add(t, category, relabel=True)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if self._frozen:
            return out
        with self._lock:
            for t in tree_flatten((args, kwargs))[0] if self._count_reads else ():
                if isinstance(t, torch.Tensor):  # older tensors the code reads (a known one keeps its label)
                    self._add(t, "inputs", relabel=False)
            category = "optimizer_state" if self._in_step else "activations"
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    self._add(t, category, relabel=False)
            self._note_peak()
        return out

    def close(self) -> None:
        """Remove the hooks and forget the storages (the measured values stay)."""
        if not self._frozen:
            self.freeze()
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        with self._lock:
            self._live.clear()  # drops the weak references: no release callbacks after this
        self._watched.clear()


@contextmanager
def track_peak(
    model: nn.Module | None = None, optimizer: Any = None, *, inputs: Iterable[Any] | Any = None
) -> Iterator[PeakTracker]:
    """Measure the peak of live tensor memory (and its split by category) over the ``with`` block.

    Args:
        model: Its parameters, buffers and gradients are counted from the start and labelled.
        optimizer: Its state is counted and labelled; what ``step()`` allocates is ``optimizer_state``.
        inputs: Tensors (any nesting) counted from the start as ``inputs``.

    Yields:
        The :class:`PeakTracker`: read ``peak_bytes`` and ``breakdown`` after the block (or inside it,
        after :meth:`PeakTracker.freeze`); :meth:`PeakTracker.reset` starts a new peak, :meth:`PeakTracker.watch`
        adds a model or optimizer built inside the block.

    Example:
        >>> model = nn.Linear(256, 256)
        >>> with track_peak(model) as peak:
        ...     model(torch.randn(64, 256)).sum().backward()
        >>> peak.breakdown["parameters"] == 4 * (256 * 256 + 256) and peak.breakdown["gradients"] > 0
        True
    """
    tracker = PeakTracker()
    tracker.watch(model=model, optimizer=optimizer, inputs=inputs)
    try:
        with tracker:
            yield tracker
    finally:
        tracker.close()


class FitPeak:
    """A callback: the peak of live tensors from a fit's first batch to its end (what a plan made before the first
    batch allocated is left out). Read :attr:`peak_bytes` after the fit.

    Example:
        >>> # peak = FitPeak(); Trainer(..., callbacks=[peak]).fit(...); peak.peak_bytes
    """

    def __init__(self) -> None:
        self.tracker: PeakTracker | None = None
        self._closed = False

    def on_train_batch_start(self, trainer: Any, batch: Any, batch_idx: int) -> None:
        if self.tracker is None:
            self.tracker = PeakTracker()
            self.tracker.watch(model=trainer.model, optimizer=trainer.optimizer, inputs=batch)
            self.tracker.__enter__()

    def on_fit_end(self, trainer: Any, history: Any) -> None:
        self._close()

    def on_exception(self, trainer: Any, exception: BaseException) -> None:
        self._close()

    def _close(self) -> None:
        if self.tracker is not None and not self._closed:
            self._closed = True
            self.tracker.__exit__(None, None, None)
            self.tracker.close()

    @property
    def peak_bytes(self) -> int:
        if self.tracker is None:
            raise RuntimeError("FitPeak: no batch was trained, so nothing was measured.")
        return int(self.tracker.peak_bytes)
