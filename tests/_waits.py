"""Waiting for something another thread of this process does, on any machine load (issue 57).

A wait's budget is counted in this process's CPU seconds (every thread's), not in wall time. The work a condition
waits on (training steps, the UI thread's pushes) costs about the same CPU quiet or loaded, while its wall time
stretches with the load: the loaded trial runs two suites and two CPU burners on two cores, about four runnable
processes per core, so a wait that takes 4 s quiet takes 16 s there. A wall-clock hang guard still ends a wait on
which nothing works at all (a deadlock spends no CPU), with the condition's name; pytest-timeout's 300 s ends the
test.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["wait_for", "wait_while_alive"]


def wait_for(
    cond: Callable[[], object], timeout: float = 15.0, what: str = "condition", *, hang_s: float = 240.0
) -> None:
    """Return once ``cond()`` is true; raise ``TimeoutError`` after ``timeout`` CPU seconds of this process, or
    ``hang_s`` wall seconds, whichever comes first.

    >>> wait_for(lambda: True)
    >>> wait_for(lambda: False, timeout=0.01, what="never")
    Traceback (most recent call last):
    TimeoutError: never not reached after 0.01 CPU seconds of this process ...
    """
    cpu_end, wall_end = time.process_time() + timeout, time.monotonic() + hang_s
    while not cond():
        if time.process_time() > cpu_end:
            raise TimeoutError(
                f"{what} not reached after {timeout} CPU seconds of this process (its threads worked, the condition "
                "never held)"
            )
        if time.monotonic() > wall_end:
            raise TimeoutError(
                f"{what} not reached in {hang_s} s of wall time, in which this process spent less than "
                f"{timeout} CPU seconds: nothing it waits on is working"
            )
        time.sleep(0.005)


def wait_while_alive(cond: Callable[[], object], thread: threading.Thread, failure: str) -> None:
    """Return once ``cond()`` is true; fail with ``failure`` when ``thread`` (the run) ends first. No clock: a run
    either reaches the state or ends, whatever the load; pytest-timeout ends a hang.

    >>> done = threading.Thread(target=lambda: None); done.start(); done.join()
    >>> wait_while_alive(lambda: False, done, "the run ended first")
    Traceback (most recent call last):
    AssertionError: the run ended first
    """
    while not cond():
        if not thread.is_alive():
            raise AssertionError(failure)
        time.sleep(0.005)
