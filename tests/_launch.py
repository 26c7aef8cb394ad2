"""A command that starts processes of its own (torchrun and its ranks, ``nbtrainer.launch``'s spawned ranks), run so
that a guard ending it ends all of them.

``subprocess.run(..., timeout=...)`` kills only the process it started: torchrun's ranks, or ranks waiting for each
other in a collective, outlive it and keep two cores busy for the rest of a suite (seen: a launch timed out, both
ranks still training a minute later). Killing the command's process group is not enough either: torchrun starts each
rank in a session of its own. Here a timeout, pytest-timeout's signal or a Ctrl-C first asks the command's group to
end (SIGTERM: torchrun ends its ranks on it), then kills every process it started, found by descent (psutil), and a
timeout fails the test with what they had printed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import psutil  # ipykernel depends on it
import pytest

__all__ = ["run_group"]


GRACE = 30.0  # seconds torchrun has to end its ranks on SIGTERM (it gives them 30 s before its own SIGKILL)


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:  # the command has ended
        return []


def _end_all(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """End the command and every process it started; what they printed."""
    family = _descendants(proc.pid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=GRACE)
    for p in [*family, *_descendants(proc.pid)]:  # ranks in sessions of their own included
        with contextlib.suppress(psutil.Error):
            p.kill()  # psutil checks it is still the process it found (a reused PID is left alone)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    out, err = proc.communicate()
    return out or "", err or ""


def run_group(cmd: Sequence[str], *, timeout: float | None = None, what: str = "the command", **kwargs: Any) -> Any:
    """``subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)``, with every process the
    command started ended by the timeout (which fails the test, saying what they printed) or by an exception.

    Without ``timeout`` (the suite's launches) the hang guard decides (``tests/_guard.py``): a command still at work
    under load goes on, one that stopped moving fails the test at its pytest timeout, and its processes are ended
    here as on any exception. Wall-clock deadlines here failed commands that were only slow (loaded trial 48)."""
    if "torch.distributed.run" in cmd and kwargs.get("cwd") is not None:
        # torchrun keeps its agent's logs in a new /tmp/torchelastic_* folder at every launch unless told where;
        # the launch's own working folder (a test's tmp_path) goes with the test's other files
        logs = os.path.join(kwargs["cwd"], "torchelastic")
        kwargs["env"] = {"PET_LOG_DIR": logs, **(kwargs.get("env") or os.environ)}
    proc = subprocess.Popen(
        list(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, **kwargs
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        out, err = _end_all(proc)
        pytest.fail(f"{what} ran past {timeout} s\nSTDOUT:\n{out[-3000:]}\nSTDERR:\n{err[-6000:]}")
    except BaseException:  # the hang guard's signal, KeyboardInterrupt: no process outlives the test
        out, err = _end_all(proc)
        # what they printed, in the failed test's captured stderr: where a hung rank was is the first thing to know
        print(f"{what} was ended with the test\nSTDOUT:\n{out[-3000:]}\nSTDERR:\n{err[-6000:]}", file=sys.stderr)
        raise
    return subprocess.CompletedProcess(list(cmd), proc.returncode, out, err)
