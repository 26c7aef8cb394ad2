"""A simulated step's allocations in order, and what follows from them: the peak and its parts, the same step at
another micro-batch size, a later micro-batch of an accumulation window.

A :class:`Trace` is what :func:`nbtrainer._plan._simulate.simulate_step` saw on the target device, beyond the
parameters and the batch: each storage's birth (op 0, its id, its bytes), its release (op 1) and, for a gradient,
the moment it is complete (op 2, the gradient's id, the index of its parameter among the trained ones). The
parameters, the batch, the optimizer state and the gradients of earlier micro-batches are not in it: the planner
counts them by arithmetic and adds them around the trace when it replays the step through the caching allocator
(:mod:`nbtrainer._plan._reserved`).

* :func:`stats`: the peak of live bytes, the gradients among them at that moment, the largest total of everything
  but the complete gradients (the peak when each gradient is applied and dropped at once), as
  :class:`~nbtrainer._memory._peak.PeakTracker` reports them.
* :func:`at_micro`: the trace at another micro-batch size from the traces at two sizes around it. Each
  tensor's shape is affine in the batch (``b * rest``, or no batch dimension), so when both traces hold the same
  operations in the same order, each size is exact; otherwise None (the caller interpolates the results instead).
* :func:`accumulating`: a later micro-batch of a window. Every gradient exists already, and autograd adds each
  incoming one into it in place (``AccumulateGrad``) and drops it: each gradient allocation is released as soon
  as it is complete.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ALLOC",
    "BACKWARD_STARTS",
    "FORWARD_STARTS",
    "FREE",
    "GRAD",
    "MARK",
    "PACK",
    "UNPACK",
    "Trace",
    "TraceStats",
    "accumulating",
    "at_micro",
    "kept_on_device",
    "stats",
    "synthesize",
]

ALLOC, FREE, GRAD, MARK, PACK, UNPACK = 0, 1, 2, 3, 4, 5
#: a MARK event's id: where a repeated block's forward begins, or its backward (its size: the block's index)
FORWARD_STARTS, BACKWARD_STARTS = 0, 1


@dataclass(frozen=True)
class Trace:
    """Events in order: ``ops[i]`` (ALLOC / FREE / GRAD / MARK), ``ids[i]`` (the storage; for MARK what begins),
    ``sizes[i]`` (bytes for ALLOC; for GRAD the trained parameter's index; for MARK the block's; 0 for FREE)."""

    ops: bytes
    ids: tuple[int, ...]
    sizes: tuple[int, ...]

    @classmethod
    def of(cls, events: list[tuple[int, int, int]]) -> Trace:
        if not events:
            return cls(b"", (), ())
        ops, ids, sizes = zip(*events, strict=True)
        return cls(bytes(ops), tuple(ids), tuple(sizes))

    def __len__(self) -> int:
        return len(self.ops)


@dataclass(frozen=True)
class TraceStats:
    """What :func:`stats` reads from a trace (bytes)."""

    peak: int
    gradients_at_peak: int
    largest_activations: int
    gradients_end: int = 0


def stats(trace: Trace) -> TraceStats:
    """The peak of live bytes over ``trace``, the gradients alive at it (complete, or completed later: a gradient
    being accumulated is a gradient), and the largest total of everything but the complete gradients."""
    live: dict[int, int] = {}
    done: set[int] = set()
    total = grads = peak = largest = 0
    peak_at = -1
    for i, (op, ident, n) in enumerate(zip(trace.ops, trace.ids, trace.sizes, strict=True)):
        if op == ALLOC:
            live[ident] = n
            total += n
            if total > peak:
                peak, peak_at = total, i
        elif op == FREE:
            size = live.pop(ident, 0)
            total -= size
            if ident in done:
                grads -= size
        elif op == GRAD and ident in live and ident not in done:
            done.add(ident)
            grads += live[ident]
        if total - grads > largest:
            largest = total - grads
    # what was alive at the peak, and which of it is a gradient (complete then or later)
    alive: dict[int, int] = {}
    end = peak_at + 1
    for op, ident, n in zip(trace.ops[:end], trace.ids[:end], trace.sizes[:end], strict=True):
        if op == ALLOC:
            alive[ident] = n
        elif op == FREE:
            alive.pop(ident, None)
    at_peak = sum(n for ident, n in alive.items() if ident in done)
    return TraceStats(peak, at_peak, largest, grads)


def at_micro(low: Trace, high: Trace, low_size: int, high_size: int, micro: int) -> Trace | None:
    """The trace at ``micro`` samples from the traces at ``low_size`` and ``high_size`` samples (None: they differ in
    more than sizes, so sizes cannot be interpolated event by event)."""
    if micro == high_size:
        return high
    if micro == low_size:
        return low
    if low.ops != high.ops or low.ids != high.ids:
        return None
    t = (micro - low_size) / (high_size - low_size)
    sizes = []
    for op, a, b in zip(high.ops, low.sizes, high.sizes, strict=True):
        if op == ALLOC:
            sizes.append(a + round((b - a) * t))
        elif a != b:  # a gradient event for another parameter
            return None
        else:
            sizes.append(a)
    return Trace(high.ops, high.ids, tuple(sizes))


def accumulating(trace: Trace) -> Trace:
    """A later micro-batch of an accumulation window: each gradient allocation released when it is complete (added
    into the gradient that exists already), and no gradient complete in the trace itself."""
    events: list[tuple[int, int, int]] = []
    gone: set[int] = set()
    for op, ident, n in zip(trace.ops, trace.ids, trace.sizes, strict=True):
        if op == GRAD:
            if ident not in gone:
                gone.add(ident)
                events.append((FREE, ident, 0))
            continue
        if op == FREE and ident in gone:
            continue
        events.append((op, ident, n))
    return Trace.of(events)


def synthesize(trace: Trace, depth: int) -> Trace | None:
    """The trace of the same step with ``depth`` repeated blocks, from ``trace``, taken with 3 and marked
    (:func:`nbtrainer._plan._simulate.simulate_step`'s ``blocks``); None when its blocks do not repeat exactly.

    The three blocks' forwards (F0, F1, F2) and the last two backwards (B2, B1) split the trace into
    ``A (prefix, F0) | F1 | F2 and the head | B2 | B1 | B0 and the rest``. The middle block is the template: the
    trace at ``depth`` is ``A | F1 x (depth - 2) | F2 and the head | B2 | B1 x (depth - 2) | the rest``, each copy
    of F1 and B1 with storages of its own. A copy's references to its neighbours follow it: what the template
    reads from block 0 (its input) is the previous copy's, what it reads from block 2 (its output's gradient) the
    next copy's, matched by the order in which the blocks allocate (F0, F1 and F2 allocate the same sizes in the
    same order, and so do B2 and B1: that is checked). Exact for a stack of identical blocks, whatever the peak.
    """
    ops, ids, sizes = trace.ops, trace.ids, trace.sizes
    marks: dict[tuple[int, int], int] = {}
    for i, (op, ident, n) in enumerate(zip(ops, ids, sizes, strict=True)):
        if op == MARK:
            marks.setdefault((ident, n), i)
    keys = [(FORWARD_STARTS, 0), (FORWARD_STARTS, 1), (FORWARD_STARTS, 2)]
    keys += [(BACKWARD_STARTS, 2), (BACKWARD_STARTS, 1), (BACKWARD_STARTS, 0)]
    if any(k not in marks for k in keys) or depth < 3:
        return None
    s0, s1, s2, b2, b1, b0 = (marks[k] for k in keys)
    if not s0 < s1 < s2 < b2 < b1 < b0:
        return None

    def born(start: int, end: int) -> list[int]:
        return [ids[i] for i in range(start, end) if ops[i] == ALLOC]

    def allocs(start: int, end: int) -> list[int]:
        return [sizes[i] for i in range(start, end) if ops[i] == ALLOC]

    f0, f1, bb2, bb1 = born(s0, s1), born(s1, s2), born(b2, b1), born(b1, b0)
    f2 = born(s2, b2)[: len(f1)]  # block 2's forward, then the head's
    if not (
        allocs(s0, s1) == allocs(s1, s2) == [sizes[ids.index(i, s2)] for i in f2]
        and ops[b2:b1] == ops[b1:b0]
        and allocs(b2, b1) == allocs(b1, b0)
    ):
        return None
    if depth == 3:
        return trace
    template = set(f1) | set(bb1)
    previous = dict(zip(f0, f1, strict=True))  # block 0's storage -> the template's of the same rank
    following = dict(zip(f2, f1, strict=True)) | dict(zip(bb2, bb1, strict=True))
    last_block = set(born(s2, b1))  # block 2 and the head: once, as the last block
    stride = max(ids, default=0) + 1
    copies = depth - 2

    def fresh(j: int, ident: int) -> int:
        return ident if j == 1 else ident + (j - 1) * stride

    def in_copy(ident: int, j: int) -> int | None:
        if ident in template:
            return fresh(j, ident)
        if ident in previous:
            return ident if j == 1 else fresh(j - 1, previous[ident])
        if ident in last_block:
            if j == copies:
                return ident
            return fresh(j + 1, following[ident]) if ident in following else None
        return ident

    def in_last(ident: int) -> int | None:
        if ident in template:
            return fresh(copies, ident)
        return ident

    out: list[tuple[int, int, int]] = [e for e in zip(ops[:s1], ids[:s1], sizes[:s1], strict=True) if e[0] != MARK]

    def emit(start: int, end: int, mapping: Any, every: set[int] = frozenset()) -> bool:  # type: ignore[assignment]
        for op, ident, n in zip(ops[start:end], ids[start:end], sizes[start:end], strict=True):
            if op == MARK:
                continue
            if op == FREE and ident in every:  # released for every block at once (the autocast weight cache)
                out.extend((FREE, fresh(j, ident), 0) for j in range(1, copies + 1))
                continue
            mapped = mapping(ident)
            if mapped is None:
                return False
            out.append((op, mapped, n))
        return True

    def every_block(start: int, end: int) -> set[int]:
        """Template storages released in ``start:end`` together with block 0's of the same rank: a release of
        every block's (the autocast cache at the end of forward), not of one neighbour's."""
        freed = {ids[i] for i in range(start, end) if ops[i] == FREE}
        return {previous[i] for i in freed if i in previous and previous[i] in freed}

    ok = all(emit(s1, s2, functools.partial(in_copy, j=j)) for j in range(1, copies + 1))
    ok = ok and emit(s2, b1, in_last, every_block(s2, b1))
    ok = ok and all(emit(b1, b0, functools.partial(in_copy, j=j)) for j in range(copies, 0, -1))
    # block 0's backward and the rest: copy 1 is the template
    ok = ok and emit(b0, len(ops), lambda ident: ident, every_block(b0, len(ops)))
    return Trace.of(out) if ok else None


def kept_on_device(trace: Trace) -> Trace:
    """The step without ``offload_activations`` from the trace of the step with it.

    Offloaded, a storage backward keeps (PACK) is released on the device as soon as nothing else holds it, and
    each use in backward brings a copy back (UNPACK: allocated, released after the use). Kept on the device, it
    lives until its last use instead: its release moves to where its last copy's is, and the copies go. Saved
    tensors never brought back are released with the graph, at the end. (The trace of the step with offloading
    shows when nothing else holds a storage; the step without it cannot: so this way round.)
    """
    ops, ids, sizes = trace.ops, trace.ids, trace.sizes
    storage_of: dict[int, int] = {}  # pack number -> storage id
    copy_of: dict[int, int] = {}  # copy id -> storage id
    for op, ident, n in zip(ops, ids, sizes, strict=True):
        if op == PACK:  # id 0: a storage not followed (a parameter's view, the batch): only its copies go
            storage_of[n] = ident
        elif op == UNPACK and n in storage_of:
            copy_of[ident] = storage_of[n]
    kept = set(storage_of.values()) - {0}
    last_release: dict[int, int] = {}  # storage id -> position of its last copy's release, or its own
    for i, (op, ident) in enumerate(zip(ops, ids, strict=True)):
        if op == FREE:
            if ident in copy_of:
                if copy_of[ident]:
                    last_release[copy_of[ident]] = i
            elif ident in kept:
                last_release[ident] = max(last_release.get(ident, i), i)
    releases: dict[int, list[int]] = {}
    for storage, i in last_release.items():
        releases.setdefault(i, []).append(storage)
    events: list[tuple[int, int, int]] = []
    for i, (op, ident, n) in enumerate(zip(ops, ids, sizes, strict=True)):
        if op in (PACK, UNPACK) or ident in copy_of:
            pass
        elif not (op == FREE and ident in kept):
            events.append((op, ident, n))
        events += [(FREE, storage, 0) for storage in releases.get(i, ())]
    return Trace.of(events)
