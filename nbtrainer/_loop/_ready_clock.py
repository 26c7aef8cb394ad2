"""The clock of the step-time samples: wall time less the time the thread waited for a CPU (issue 57).

A sampled step's phases are timed with the wall clock. On a busy machine (a shared Colab or Binder CPU, a test suite
beside the run) the OS can take the CPU from the training thread in the middle of one phase, and that phase then reads
as long as the wait: one fetch descheduled for 10 ms on a 4 ms step read as a loader taking 98% of the step. Linux
counts, per thread, the time it spent runnable but waiting on a run queue (``/proc/thread-self/schedstat``, the second
field, in ns); subtracting it leaves the time the phase itself took, whether it computed, slept or waited on a loader's
workers. Elsewhere (no such file) the clock is the wall clock.

Read only at the sampled micro-batches (1, 11, 21, 31, then every ``timing_every``; under accumulation the one closing
the window at or after each): two ``pread``s of an open file, a few microseconds.
"""

from __future__ import annotations

import math
import os
import threading
import time
import weakref

__all__ = ["ReadyClock"]

_STAT = "/proc/thread-self/schedstat"
_TRIES = 4


class ReadyClock:
    """``clock()``: seconds, like ``time.perf_counter()``, less the calling thread's time waiting for a CPU.

    Example:
        >>> clock = ReadyClock()
        >>> t0 = clock(); t1 = clock()
        >>> t1 >= t0  # never backwards: a phase it times is never negative
        True
    """

    def __init__(self) -> None:
        self._fd: int | None = None
        self._tid: int | None = None
        self._usable = True
        self._finalizer: weakref.finalize | None = None
        self._last = -math.inf

    def __call__(self) -> float:
        # The wall clock and the wait are two reads. A thread taken off its CPU between them would count a wait the
        # wall clock has not seen (or the reverse) and time the phase ending there that much short: a forward that
        # slept 3 ms read as 1.03 ms in a loaded run of the suite. So the wait is read on both sides of the wall
        # clock, and read again until no wait came in between (one try in almost every call).
        before = self._waited()  # first: a new thread's file resets the last value
        for _ in range(_TRIES):
            now = time.perf_counter()
            after = self._waited()
            if after == before:
                break
            before = after
        # The wait is counted on the run queue's clock, not perf_counter's: across a migration to another CPU it can
        # grow by a few microseconds more than the wall clock did, and a 30 us forward then read -0% in the panel's
        # step-time card (a fresh-clone run of the suite). A phase is never shorter than nothing.
        self._last = max(self._last, now - after)
        return self._last

    def _waited(self) -> float:
        if not self._usable:
            return 0.0
        tid = threading.get_native_id()
        if tid != self._tid:  # the file is the thread's own: a fit run from another thread reads its own
            self._open(tid)
            if self._fd is None:
                return 0.0
        try:
            return int(os.pread(self._fd, 64, 0).split()[1]) * 1e-9  # type: ignore[arg-type]
        except (OSError, IndexError, ValueError):
            self._usable = False  # a kernel without schedstats: the wall clock it is
            return 0.0

    def _open(self, tid: int) -> None:
        self.close()
        try:
            self._fd = os.open(_STAT, os.O_RDONLY)
        except OSError:
            self._usable = False
            return
        self._tid = tid
        self._last = -math.inf  # another thread's clock: its own waits
        self._finalizer = weakref.finalize(self, os.close, self._fd)

    def close(self) -> None:
        if self._finalizer is not None:
            self._finalizer()
        self._fd = self._tid = self._finalizer = None
