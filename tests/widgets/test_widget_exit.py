"""A script (or a kernel) that exits while the panel trains, plans or searches: the work is stopped at a step boundary
(the memory plan: cancelled at the row being simulated) and the interpreter ends cleanly.

Before, the training thread (a daemon) was still inside a torch op while the interpreter's C++ state was torn down:
every script that called ``start()`` and returned aborted ("terminate called without an active exception", exit
status 134). Threads started with ``start_training_thread`` are now ended at exit (``stop=`` first, then joined);
the panel's run stops, then its UI thread finishes its last push."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import time, torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset
    from nbtrainer import TrainerWidget
    torch.manual_seed(0)
    x, y = torch.randn(4096, 512), torch.randint(0, 10, (4096,))
    model = nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 10))
    w = TrainerWidget(model, nn.CrossEntropyLoss(), torch.optim.AdamW(model.parameters(), 1e-3),
                      DataLoader(TensorDataset(x, y), batch_size=256), epochs=100)
    w.start()
    while w.trainer.global_step < 3:
        time.sleep(0.01)
    print("returning", w.trainer.status, flush=True)
    """
)


@pytest.mark.slow  # an interpreter
def test_a_script_that_returns_while_the_panel_trains_stops_the_run_and_exits_cleanly() -> None:
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True)
    assert "terminate called" not in proc.stderr, proc.stderr[-2000:]
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "returning running", proc.stdout
    assert 'the interpreter is exiting: stopping "nbtrainer-fit' in proc.stderr, proc.stderr[-2000:]


# registered before nbtrainer is imported, so it runs after nbtrainer's own exit handler: what the work left behind
PLAN_SCRIPT = textwrap.dedent(
    """
    import atexit, time
    atexit.register(lambda: print("at exit: plan shown", w.plan_view.plan is not None, flush=True))
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset
    from nbtrainer import TrainerWidget
    x, y = torch.randn(256, 512), torch.randint(0, 10, (256,))
    model = nn.Sequential(*[m for _ in range(12) for m in (nn.Linear(512, 512), nn.ReLU())], nn.Linear(512, 10))
    w = TrainerWidget(model, nn.CrossEntropyLoss(), "adamw", DataLoader(TensorDataset(x, y), batch_size=64))
    w.plan_view.start()  # the Plan button
    print("returning while planning:", w.plan_view.thread.is_alive(), flush=True)
    """
)


@pytest.mark.slow  # an interpreter
def test_a_script_that_returns_while_the_panel_plans_cancels_the_plan_and_exits_cleanly() -> None:
    """Before: the plan's thread was a plain daemon inside a torch op at exit, and 4 runs of 4 aborted (status 134).
    Then the exit waited for the whole search, up to a minute: on a loaded machine (the suite's loaded trial 47) the
    search took longer and the exit still aborted. Now the exit cancels the plan: it ends with the row being
    simulated, and nothing is shown."""
    proc = subprocess.run([sys.executable, "-c", PLAN_SCRIPT], capture_output=True, text=True)
    assert "terminate called" not in proc.stderr, proc.stderr[-2000:]
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "the interpreter is exiting: stopping 'nbtrainer-plan'" in proc.stderr, proc.stderr[-2000:]
    assert proc.stdout.split("\n")[:2] == ["returning while planning: True", "at exit: plan shown False"], proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]


TUNE_SCRIPT = textwrap.dedent(
    """
    import atexit, time
    atexit.register(lambda: print("at exit:", [t["state"] for t in view.trials], view.done, flush=True))
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset
    from nbtrainer import Trainer
    from nbtrainer.widgets import RunsWidget
    x, y = torch.randn(4096, 256), torch.randint(0, 10, (4096,))

    def build(trial):
        model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 10))
        # validated every 5th epoch of 512 steps: the exit's stop comes long before the trial's first value
        trainer = Trainer(model, nn.CrossEntropyLoss(), "sgd", lr=trial.suggest_float("lr", 1e-3, 1e-1, log=True),
                          progress=False, run_store=False, val_every_n_epochs=5)
        return trainer, DataLoader(TensorDataset(x, y), batch_size=8), DataLoader(TensorDataset(x, y), batch_size=64)

    view = RunsWidget.tune(build, show=False, n_trials=50, epochs=200)
    while not view.trials and not view.done:
        time.sleep(0.01)
    print("returning", view.trials[0]["state"], flush=True)
    """
)


@pytest.mark.slow  # an interpreter
def test_a_script_that_returns_mid_search_stops_the_trial_and_the_search_and_exits_cleanly() -> None:
    """Before: nothing stopped the search's thread, so the exit waited a minute for it, then aborted mid-trial."""
    proc = subprocess.run([sys.executable, "-c", TUNE_SCRIPT], capture_output=True, text=True)
    assert "terminate called" not in proc.stderr, proc.stderr[-2000:]
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "the interpreter is exiting: stopping 'nbtrainer-tune'" in proc.stderr, proc.stderr[-2000:]
    # the trial ended at its next step (pruned: no value yet, and no traceback), and no trial followed it
    assert proc.stdout.split("\n")[:2] == ["returning running", "at exit: ['pruned'] True"], proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]


CHECK_SCRIPT = textwrap.dedent(
    """
    import atexit, time
    atexit.register(lambda: print("at exit:", len(read), "of 20000 read; report", w.looks.data.report, flush=True))
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, Dataset
    from nbtrainer import TrainerWidget
    read = []

    class Slow(Dataset):  # a data set read from disk: 2 ms an item, 40 s for the check's whole pass
        def __len__(self):
            return 20000

        def __getitem__(self, i):
            read.append(i)
            time.sleep(0.002)
            return torch.randn(8), i % 3

    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    w = TrainerWidget(model, nn.CrossEntropyLoss(), "adamw", DataLoader(Slow(), batch_size=64))  # checks its data
    while len(read) < 200:
        time.sleep(0.01)
    print("returning while checking:", w.looks.data.report is None, flush=True)
    """
)


@pytest.mark.slow  # an interpreter
def test_a_script_that_returns_while_the_panel_checks_its_data_cancels_the_check_and_exits_cleanly() -> None:
    """Before: the data check's thread had no way to stop; the exit waited "up to a minute" for the whole pass (40 s
    here), and a check longer than that aborted the interpreter mid-op. Now the exit cancels it at its next batch."""
    proc = subprocess.run([sys.executable, "-c", CHECK_SCRIPT], capture_output=True, text=True)
    assert "terminate called" not in proc.stderr, proc.stderr[-2000:]
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "the interpreter is exiting: stopping 'nbtrainer-data-check'" in proc.stderr, proc.stderr[-2000:]
    assert "waiting up to a minute" not in proc.stderr, proc.stderr[-2000:]
    lines = proc.stdout.split("\n")
    assert lines[0] == "returning while checking: True", proc.stdout
    read, report = re.fullmatch(r"at exit: (\d+) of 20000 read; report (.*)", lines[1]).groups()  # type: ignore[union-attr]
    assert 200 <= int(read) < 2000 and report == "None", proc.stdout  # a batch or so after the return, not the pass
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
