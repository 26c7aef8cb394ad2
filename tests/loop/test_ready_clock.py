"""The step-time samples' clock leaves out the time the OS gave the training thread's CPU to someone else (issue 57):
a phase descheduled on a busy machine reads as the work it did, not as the wait."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from nbtrainer._loop._ready_clock import ReadyClock

pytestmark = pytest.mark.skipif(
    not os.path.exists("/proc/thread-self/schedstat"), reason="Linux's per-thread run-queue time (schedstats)"
)

BURN = "import os, sys; os.sched_setaffinity(0, {%d}); print('ready', flush=True); exec('while True: pass')"


def test_a_phase_sharing_its_cpu_with_a_busy_process_reads_as_its_own_work():
    cpu = min(os.sched_getaffinity(0))
    mine = os.sched_getaffinity(0)
    burner = subprocess.Popen([sys.executable, "-c", BURN % cpu], stdout=subprocess.PIPE, text=True)
    try:
        assert burner.stdout is not None and burner.stdout.readline().strip() == "ready"  # it spins on that CPU now
        os.sched_setaffinity(0, {cpu})  # this thread on the same CPU: the scheduler shares it between the two
        clock = ReadyClock()
        wall0, ready0, cpu0 = time.perf_counter(), clock(), time.thread_time()
        n = 0
        while time.thread_time() - cpu0 < 0.2:  # 0.2 s of this thread's own work
            n += 1
        wall, ready, work = time.perf_counter() - wall0, clock() - ready0, time.thread_time() - cpu0
    finally:
        os.sched_setaffinity(0, mine)
        burner.kill()
        burner.wait()
    waited = wall - work
    assert waited > 0.5 * work, (wall, work)  # the burner had the CPU a good part of the time
    # the ready clock counts the work and not the wait (a few ms of reading and accounting aside)
    assert abs(ready - work) < 0.1 * waited + 0.005, (wall, ready, work)


def _run_delay() -> int:
    with open("/proc/thread-self/schedstat") as f:
        return int(f.read().split()[1])


def test_a_wait_between_the_wall_clock_and_the_wait_read_is_not_taken_from_the_phase(monkeypatch):
    # Trial 33 of the loaded suite (docs/testing.md): a forward that slept 3 ms read as 1.03 ms. The thread was taken
    # off its CPU between the clock's two reads, after the wall clock and before the wait, so the wait counted and
    # the wall time did not. Here a burner shares this thread's CPU, and the phase's closing reading is made to
    # wait for the CPU right after it reads the wall clock: the phase (a 10 ms sleep) reads its 10 ms all the same.
    import nbtrainer._loop._ready_clock as module

    cpu = min(os.sched_getaffinity(0))
    mine = os.sched_getaffinity(0)
    real = time.perf_counter
    armed, forced = [False], [0]

    def perf_counter() -> float:
        now = real()
        if armed[0]:  # spin on this CPU until the scheduler has given it to others for 1.5 ms: real waits (not
            armed[0] = False  # only until the first wait: on a loaded machine that may be a 12 us one, trial 35)
            start, deadline = _run_delay(), real() + 5.0
            while _run_delay() - start < 1_500_000 and real() < deadline:
                pass
            forced[0] = _run_delay() - start
        return now

    monkeypatch.setattr(module, "time", type("T", (), {"perf_counter": staticmethod(perf_counter)}))
    burner = subprocess.Popen([sys.executable, "-c", BURN % cpu], stdout=subprocess.PIPE, text=True)
    try:
        assert burner.stdout is not None and burner.stdout.readline().strip() == "ready"
        os.sched_setaffinity(0, {cpu})
        clock = ReadyClock()
        start = clock()
        time.sleep(0.01)
        armed[0] = True
        phase = clock() - start
    finally:
        os.sched_setaffinity(0, mine)
        burner.kill()
        burner.wait()
    assert forced[0] > 1_000_000, forced  # the closing reading did wait for the CPU, over a millisecond
    assert phase >= 0.0095, (phase, forced[0] * 1e-9)  # not the sleep less that wait


def test_without_the_file_the_clock_is_the_wall_clock(monkeypatch):
    import nbtrainer._loop._ready_clock as rc

    monkeypatch.setattr(rc, "_STAT", "/nonexistent/schedstat")
    clock = ReadyClock()
    before = time.perf_counter()
    now = clock()
    assert before <= now <= time.perf_counter()


def test_the_clock_never_runs_backwards_when_the_wait_grows_faster_than_the_wall_clock(monkeypatch):
    # The wait is counted on the run queue's clock, not perf_counter's: across a migration it can grow by a few
    # microseconds more than the wall clock did. Unclamped, a 30 us forward then read -0% in the panel's step-time
    # card (a fresh-clone run of the suite). Here the OS's counter jumps by a second between two reads.
    import nbtrainer._loop._ready_clock as module

    delays = iter([0, 0, 10**9, 10**9, 10**9, 10**9, 2 * 10**9, 2 * 10**9])  # each reading reads the wait twice
    monkeypatch.setattr(module.os, "pread", lambda fd, n, off: f"1 {next(delays)} 1\n".encode())
    clock = ReadyClock()
    readings = [clock() for _ in range(4)]
    assert readings == sorted(readings)  # never backwards, so no phase it times is negative
    assert readings[1] == readings[0]  # the second the counter jumped: no time passed, as far as the phase goes
