"""The suite's hang guard: pytest-timeout's timeout (``@pytest.mark.timeout``, 300 s by default) ends a test that has
stopped moving, not one that is still working on a loaded machine.

A timeout is a hang guard (docs/testing.md, Timing): when it expires something should be stuck, not slow. On the
2-core VM of 2026-12-01 a loaded trial (two fresh clones' suites and two CPU-burning loops) stretched single tests
10-20x: the VS Code browser test, 44 s alone, ran past its 240 s while its kernel and browser were still at work
(loaded trial 48). So at the timeout the guard looks at what the test's processes did (the worker, and everything
it started: kernels, Jupyter servers, the browser, interpreters) over the last ``window`` seconds:

* they used less than ``IDLE_SHARE`` of a core: nothing is moving (a deadlock, a wait for a page state that never
  comes while the page idles), so the test fails as pytest-timeout fails it (the threads' stacks, then
  ``Timeout (>N s)``), at the same moment as before;
* they are still working: the test goes on, checked again every ``POLL`` seconds, up to ``STRETCH`` times its timeout
  (a loop that spins forever fails there).

On a quiet machine a test that finishes within its timeout never meets the guard, and one that hangs fails when it
did. The guard replaces pytest-timeout's own timer (its ``pytest_timeout_set_timer`` hook) for the ``signal`` method
on the main thread, the method the suite uses; one sampling thread serves the whole worker.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import deque
from typing import Any

import psutil  # ipykernel depends on it
import pytest

__all__ = ["IDLE_SHARE", "POLL", "STRETCH", "pytest_timeout_cancel_timer", "pytest_timeout_set_timer", "tree_cpu"]

IDLE_SHARE = 0.05  # of one core: an idle browser page, Jupyter server and kernel together use about 1-2%
POLL = 5.0  # seconds between samples once a test nears its timeout
STRETCH = 4  # a test still working at its timeout goes on up to this many times it


def tree_cpu(pid: int | None = None) -> float:
    """CPU seconds (user and system) used so far by the process ``pid`` (default: this one) and its descendants alive
    now, each with the children it has waited for (an interpreter that ended and was reaped stays counted, in its
    parent). Only an orphan that ended (reaped by init) drops out: a sample's difference can undercount work, never
    invent it."""
    try:
        root = psutil.Process(pid or os.getpid())
        family = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0.0
    total = 0.0
    for p in family:
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


class _Watch:
    """The test being guarded: when it started, its timeout, and the samples of its processes' CPU."""

    def __init__(self, item: pytest.Item, timeout: float) -> None:
        self.item, self.timeout = item, timeout
        self.start = time.monotonic()
        self.window = min(60.0, timeout / 2)
        self.poll = min(POLL, timeout / 10)
        self.samples: deque[tuple[float, float]] = deque()
        self.verdict: str | None = None  # why the guard ended the test (read by the signal handler)

    def moving(self, now: float) -> tuple[bool, float, float]:
        """Whether the processes used more than IDLE_SHARE of a core over the last window; what they used, and over
        how many seconds."""
        self.samples.append((now, tree_cpu()))
        while len(self.samples) > 2 and self.samples[1][0] <= now - self.window:
            self.samples.popleft()
        (t0, c0), (t1, c1) = self.samples[0], self.samples[-1]
        if t1 - t0 < self.window * 0.8:  # not a whole window yet: sampled since shortly before the timeout
            return True, c1 - c0, t1 - t0
        return (c1 - c0) > IDLE_SHARE * (t1 - t0), c1 - c0, t1 - t0


class _Guard:
    """One thread per worker that samples the guarded test near and past its timeout, and interrupts it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.watch: _Watch | None = None
        self.fired: _Watch | None = None  # the test to fail, until the main thread's handler takes it
        self.wake = threading.Event()
        self.thread = threading.Thread(target=self._run, name="nbt-hang-guard", daemon=True)
        self.thread.start()

    def arm(self, watch: _Watch) -> None:
        with self.lock:
            self.watch = watch
        self.wake.set()

    def disarm(self) -> None:
        with self.lock:
            self.watch = self.fired = None  # a SIGALRM still on its way finds nothing to fail
        self.wake.set()

    def take(self) -> _Watch | None:
        with self.lock:
            fired, self.fired = self.fired, None
        return fired

    def _run(self) -> None:
        while True:
            with self.lock:
                watch = self.watch
            if watch is None:
                self.wake.wait()
                self.wake.clear()
                continue
            now = time.monotonic()
            elapsed = now - watch.start
            sample_from = watch.timeout - watch.window - watch.poll  # a whole window of samples at the timeout
            if elapsed < sample_from:
                self.wake.wait(sample_from - elapsed)
                self.wake.clear()
                continue
            moving, used, span = watch.moving(now)
            if elapsed >= watch.timeout:
                if not moving:
                    watch.verdict = (
                        f"nothing moved: its processes used {used:.2f} CPU s in the last {span:.1f} s "
                        f"(under {IDLE_SHARE:.0%} of a core)"
                    )
                elif elapsed >= watch.timeout * STRETCH:
                    watch.verdict = f"still busy at {STRETCH}x its timeout ({used:.2f} CPU s in the last {span:.1f} s)"
                with self.lock:
                    if watch.verdict is not None and self.watch is watch:
                        self.watch, self.fired = None, watch
                        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGALRM)
                        continue
            self.wake.wait(watch.poll)
            self.wake.clear()


_GUARD: _Guard | None = None
_GUARDED = pytest.StashKey[bool]()  # set on the tests whose timer is the guard's


def _on_alarm(signum: int, frame: Any) -> None:
    """SIGALRM in the main thread: fail the test the guard fired for; nothing when none is (a signal that arrives
    after its test ended). Installed once and left installed: a SIGALRM pending while the handler was being reset to
    the default action would end the worker."""
    __tracebackhide__ = True
    watch = _GUARD.take() if _GUARD is not None else None
    if watch is None:
        return
    import pytest_timeout  # type: ignore[import-untyped]

    terminal = watch.item.config.get_terminal_writer()
    terminal.sep("+", title="Timeout")
    terminal.line(f"the hang guard (tests/_guard.py) ended {watch.item.nodeid} past its timeout: {watch.verdict}")
    pytest_timeout.dump_stacks(terminal)
    terminal.sep("+", title="Timeout")
    pytest.fail(f"Timeout (>{watch.timeout:.1f}s) from pytest-timeout; {watch.verdict}.")


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> bool | None:
    """pytest-timeout's timer for one test: the guard above (signal method, main thread); else pytest-timeout's."""
    global _GUARD
    if settings.method != "signal" or threading.current_thread() is not threading.main_thread():
        return None
    if _GUARD is None:
        _GUARD = _Guard()
    if signal.getsignal(signal.SIGALRM) is not _on_alarm:  # a test may have set its own
        signal.signal(signal.SIGALRM, _on_alarm)
    _GUARD.arm(_Watch(item, float(settings.timeout)))
    item.stash[_GUARDED] = True
    return True


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_cancel_timer(item: pytest.Item) -> bool | None:
    """The test is over: the guard stands down (pytest-timeout's own cancel, for a timer it set itself)."""
    if _GUARD is None or not item.stash.get(_GUARDED, False):
        return None
    _GUARD.disarm()
    return True
