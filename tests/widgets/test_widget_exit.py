"""A script (or a kernel) that exits while the panel trains: the run is stopped at a step boundary and the
interpreter ends cleanly.

Before, the training thread (a daemon) was still inside a torch op while the interpreter's C++ state was torn down:
every script that called ``start()`` and returned aborted ("terminate called without an active exception", exit
status 134). Threads started with ``start_training_thread`` are now ended at exit (``stop=`` first, then joined);
the panel's run stops, then its UI thread finishes its last push."""

from __future__ import annotations

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
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300)
    assert "terminate called" not in proc.stderr, proc.stderr[-2000:]
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "returning running", proc.stdout
    assert 'the interpreter is exiting: stopping "nbtrainer-fit' in proc.stderr, proc.stderr[-2000:]
