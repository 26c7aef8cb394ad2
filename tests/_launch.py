"""A command that starts processes of its own (torchrun and its ranks, ``nbtrainer.launch``'s spawned ranks), run so
that a guard ending it ends all of them.

``subprocess.run(..., timeout=...)`` kills only the process it started: torchrun's ranks, or ranks waiting for each
other in a collective, outlive it and keep two cores busy for the rest of a suite (seen: a launch timed out, both
ranks still training a minute later). Here the command runs in a session of its own, and a timeout, pytest-timeout's
signal or a Ctrl-C kills the whole group; a timeout fails the test with what the processes had printed.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Sequence
from typing import Any

import pytest

__all__ = ["run_group"]


def _kill_group(proc: subprocess.Popen[str]) -> tuple[str, str]:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # every process of the group had ended
        pass
    out, err = proc.communicate()
    return out or "", err or ""


def run_group(cmd: Sequence[str], *, timeout: float, what: str = "the command", **kwargs: Any) -> Any:
    """``subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)``, with every process the
    command started ended by the timeout (which fails the test, saying what they printed) or by an exception."""
    proc = subprocess.Popen(
        list(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, **kwargs
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        out, err = _kill_group(proc)
        pytest.fail(f"{what} ran past {timeout:g} s (stuck, not slow)\nSTDOUT:\n{out[-3000:]}\nSTDERR:\n{err[-6000:]}")
    except BaseException:  # pytest-timeout's signal, KeyboardInterrupt: no process outlives the test
        _kill_group(proc)
        raise
    return subprocess.CompletedProcess(list(cmd), proc.returncode, out, err)
