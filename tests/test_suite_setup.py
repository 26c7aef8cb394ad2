"""What keeps the suite's CPU down (docs/testing.md, Time) stays in effect: a change that drops it would cost minutes
without failing anything else."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil  # ipykernel depends on it
import pytest


def test_the_worker_keeps_what_survived_the_earlier_tests_out_of_the_collectors_sight() -> None:
    # tests/conftest.py freezes what is alive after collection and after each test
    assert gc.get_freeze_count() > 10_000


@pytest.mark.slow  # starts an interpreter (docs/testing.md)
def test_an_interpreter_the_suite_starts_leaves_full_collections_to_the_code_that_asks() -> None:
    code = "import gc, sitecustomize; print(gc.get_threshold()[2], sitecustomize.__file__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    threshold, path = out.stdout.split()
    assert int(threshold) >= 1000 and path.endswith("tests/_site/sitecustomize.py"), out.stdout


@pytest.mark.slow  # starts a kernel
def test_a_kernel_loses_no_message_while_the_tests_process_is_stopped() -> None:
    # tests/_kernels.py: ZeroMQ drops what is past 1,000 queued messages on each side of a kernel's IOPub. A loaded
    # trial's client lost the end of a cell that published 1,518, its idle status with it (trial 33). Here the whole
    # test process (its ZeroMQ threads too) is stopped for 3 s while the kernel publishes 3,000 messages.
    import os
    import queue
    import time

    from _kernels import kernel_manager

    km = kernel_manager("python3")
    km.start_kernel()
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=120)
        code = "from IPython.display import display\nfor i in range(3000):\n display({'text/plain': str(i)}, raw=True)"
        pause = f"sleep 0.2; kill -STOP {os.getpid()}; sleep 3; kill -CONT {os.getpid()}"
        stopper = subprocess.Popen(["bash", "-c", pause])
        msg_id = kc.execute(code)
        shown: list[int] = []
        end = time.monotonic() + 60  # from the last message: a loaded machine delivers slowly, a lost one never
        while time.monotonic() < end:
            try:
                m = kc.get_iopub_msg(timeout=1)
            except queue.Empty:
                continue
            end = time.monotonic() + 60
            if m["parent_header"].get("msg_id") != msg_id:
                continue
            if m["msg_type"] == "display_data":
                shown.append(int(m["content"]["data"]["text/plain"]))
            if m["msg_type"] == "status" and m["content"]["execution_state"] == "idle":
                break
        else:
            raise AssertionError(f"no idle status: {len(shown)} of 3,000 messages came, the last {shown[-3:]}")
        assert stopper.wait(30) == 0
        assert shown == list(range(3000))
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


_PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL,  # a rank's pipes are its own: nothing waits for it to close them
                         start_new_session=sys.argv[1] == "own")  # torchrun starts each rank in a session of its own
print(child.pid, flush=True)
time.sleep(60)
"""


@pytest.mark.slow
@pytest.mark.parametrize("session", ["own", "shared"])
def test_a_launch_that_runs_past_its_guard_takes_every_process_it_started_with_it(session: str) -> None:
    """torchrun's ranks outlived ``subprocess.run``'s timeout (it kills only torchrun) and kept both cores busy for
    the rest of the suite: ``run_group`` ends everything the command started, a child in a session of its own (as
    torchrun's ranks are) included, and says what it printed."""
    from _launch import run_group

    with pytest.raises(pytest.fail.Exception, match=r"ran past 3 s") as failed:
        run_group([sys.executable, "-c", _PARENT, session], timeout=3, what="the parent")
    child = int(str(failed.value).split("STDOUT:\n", 1)[1].split()[0])
    deadline = time.monotonic() + 10  # the kill is sent; the kernel reaps the orphan through init
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child), f"the launched command's child {child} outlived the guard"


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE  # a zombie has ended
    except psutil.NoSuchProcess:
        return False


_DYNAMO_BEFORE_THE_FIRST_TEST = "torch._dynamo" in sys.modules  # this module is imported at collection

_INTERRUPTED_IMPORT = """
import sys, torch
class Cut:  # what pytest-timeout's signal does, wherever the main thread is: here at the n-th module imported
    def __init__(self, n): self.n = n
    def find_spec(self, name, path=None, target=None):
        self.n -= 1
        if self.n == 0:
            raise TimeoutError(f"the test's time ran out (importing {name})")
sys.meta_path.insert(0, Cut(int(sys.argv[1])))
try:
    import torch._dynamo
except TimeoutError:
    pass
sys.meta_path.pop(0)
import torch._dynamo  # the second import: finishes the package, or finds it broken
print("whole")
"""


@pytest.mark.slow
def test_torch_dynamo_is_imported_before_any_test_whose_timeout_could_cut_its_import_in_half() -> None:
    """A pytest-timeout firing inside torch._dynamo's first import (every first optimizer, and
    ``use_deterministic_algorithms``, import it) left it half-imported in the worker for good, and 500 later tests
    failed: shown here in a fresh interpreter (an exception in the middle of the import, then the import again), and
    avoided by ``tests/conftest.py`` importing it at collection. The exception comes at the n-th module the import
    loads, not after a delay: an alarm at 0.1-0.5 s landed elsewhere on a loaded machine (loaded trial 48: no run
    broke), where the import took ten times as long."""
    broke = []
    for n in (50, 200, 400):  # of the ~830 modules it loads: sympy's and the compiler's halves (each breaks it here)
        proc = subprocess.run([sys.executable, "-c", _INTERRUPTED_IMPORT, str(n)], capture_output=True, text=True)
        if "whole" not in proc.stdout:  # where the cut landed names the half-imported part: sympy, _inductor...
            broke.append(proc.stderr.strip().splitlines()[-1])
    assert broke, "no cut left torch._dynamo broken: the hazard this guards against was not shown"
    assert _DYNAMO_BEFORE_THE_FIRST_TEST, "tests/conftest.py must import torch._dynamo before the first test"


_GUARDED_TESTS = """
import time, pytest

@pytest.mark.timeout(3)
def test_idle():  # a deadlock: nothing runs
    time.sleep(60)

@pytest.mark.timeout(3)
def test_busy_past_its_timeout():  # still working at its timeout, as a loaded machine stretches a test: 2x its timeout
    end = time.monotonic() + 6
    while time.monotonic() < end:
        pass

@pytest.mark.timeout(3)
def test_busy_forever():
    while True:
        pass
"""


@pytest.mark.slow  # a pytest session in an interpreter, about 20 s
def test_the_hang_guard_ends_a_test_that_stopped_moving_and_lets_one_still_at_work_finish(tmp_path: Path) -> None:
    """tests/_guard.py: pytest-timeout's timeout ends an idle test at its timeout, as before, and one still using CPU
    at 4x its timeout; a test still at work past its timeout finishes (the VS Code browser test, 44 s alone, was
    ended at its 240 s while its kernel and browser worked, in loaded trial 48)."""
    (tmp_path / "test_guarded.py").write_text(_GUARDED_TESTS)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    # the outer run's options are not this session's: PYTEST_ADDOPTS="-x" (a loaded trial's, to fail early) stopped it
    # at test_idle's expected failure, before the busy test ran (loaded trial 55, both sides)
    env.pop("PYTEST_ADDOPTS", None)
    cmd = [sys.executable, "-m", "pytest", "-p", "_guard", "-p", "no:cacheprovider", "-q", "-rA", "test_guarded.py"]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env).stdout
    assert "PASSED test_guarded.py::test_busy_past_its_timeout" in out, out[-3000:]
    ended = {
        line.split("::")[1].split()[0]: line.split(" past its timeout: ")[1]
        for line in out.splitlines()
        if line.startswith("the hang guard (tests/_guard.py) ended")
    }
    assert ended.keys() == {"test_idle", "test_busy_forever"}, out[-3000:]
    assert ended["test_idle"].startswith("nothing moved"), ended
    assert ended["test_busy_forever"].startswith("still busy at 4x its timeout"), ended
