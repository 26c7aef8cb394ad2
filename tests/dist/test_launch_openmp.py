"""``nbtrainer.launch`` after the notebook ran a parallel op (issue 49): a forked rank inherits the launching
thread's OpenMP pool record but not its worker threads, and its first parallel region waited for them forever.
The launch gives the pool back before it forks; here in a subprocess with a timeout, so a hang fails the test."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import torch, nbtrainer

    def rank():
        import torch
        return float(torch.ones(10**6).sum())  # a parallel region with two threads in the forked rank

    torch.set_num_threads(2)
    torch.ones(10**6).sum()  # the launching thread's pool (any larger op in a notebook makes it)
    print("RESULT", nbtrainer.launch(rank, nprocs=1, threads_per_process=2, start_method="fork"))
""")


@pytest.mark.slow
@pytest.mark.skipif(
    not sys.platform.startswith("linux") or len(os.sched_getaffinity(0)) < 2, reason="GNU OpenMP, fork, 2 CPUs"
)
def test_a_forked_rank_runs_parallel_regions_after_the_launching_thread_ran_one() -> None:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    # its own process group: a hung rank (the launcher's child) is ended with the launcher
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired as exc:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise AssertionError("the forked rank hung in its first parallel region (120 s)") from exc
    assert proc.returncode == 0, err[-3000:]
    assert out.split("RESULT", 1)[1].strip() == "[1000000.0]"
