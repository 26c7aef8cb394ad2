"""The command line: ``python -m nbtrainer`` and the ``nbtrainer`` console script, run as real processes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from conftest import make_classification, make_loader, mlp

from nbtrainer import ModelCheckpoint, Trainer
from nbtrainer._shell._cli import main


def _run(*args: str, importtime: bool = False) -> subprocess.CompletedProcess:
    cmd = [sys.executable, *(["-X", "importtime"] if importtime else []), "-m", "nbtrainer", *args]
    return subprocess.run(cmd, capture_output=True, text=True)


def _imported(stderr: str) -> set[str]:
    """Top-level packages named in ``-X importtime`` output."""
    names = set()
    for line in stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip().split(".")[0])
    return names


def test_help_lists_the_commands_and_imports_no_torch():
    proc = _run("--help", importtime=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("usage: nbtrainer") and "doctor" in proc.stdout and "checkpoint" in proc.stdout
    imported = _imported(proc.stderr)
    assert "nbtrainer" in imported  # the importtime output was read
    assert not imported & {"torch", "IPython", "ipywidgets", "tqdm"}, sorted(imported)


@pytest.mark.slow  # starts an interpreter (README: such tests are slow; the inner loop leaves them out)
def test_version_and_no_command():
    import nbtrainer

    proc = _run("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"nbtrainer {nbtrainer.__version__}"
    proc = _run()
    assert proc.returncode == 0 and proc.stdout.startswith("usage: nbtrainer")


@pytest.mark.slow  # starts an interpreter (README: such tests are slow; the inner loop leaves them out)
def test_doctor_runs_without_ipython():
    proc = _run("doctor", "--device", "cpu", importtime=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("nbtrainer doctor") and "fp32" in proc.stdout and "bf16-mixed" in proc.stdout
    assert "plain Python (no IPython shell)" in proc.stdout
    assert "IPython" not in _imported(proc.stderr)


def test_doctor_strict_exit_status(capsys, monkeypatch):
    from nbtrainer._shell import _doctor

    monkeypatch.setattr(_doctor, "LABEXTENSIONS", {"@nbtrainer-test/not-installed": "nothing"})  # one problem
    assert main(["doctor", "--device", "cpu"]) == 0
    assert main(["doctor", "--device", "cpu", "--strict"]) == 1
    assert "@nbtrainer-test/not-installed" in capsys.readouterr().out
    assert main(["doctor", "--device", "nonsense:0"]) == 2
    assert "nbtrainer doctor: bad --device 'nonsense:0'" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("device", ["cuda:0", "mps"])
def test_doctor_refuses_a_device_this_machine_lacks_in_one_line(device):
    """The README's `--device cuda:0` on a CPU build crashed with a traceback; `--device mps` off a Mac printed
    a dispatcher dump and "problems: none found" with exit status 0."""
    usable = torch.cuda.is_available() if device.startswith("cuda") else torch.backends.mps.is_available()
    if usable:
        pytest.skip(f"{device} is usable here")
    proc = _run("doctor", "--device", device)
    assert proc.returncode != 0 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith(f"nbtrainer doctor: bad --device '{device}': ")
    assert ("CPU build" in proc.stderr or "no CUDA GPU" in proc.stderr) if device == "cuda:0" else "MPS" in proc.stderr


def test_bad_arguments_exit_with_usage(capsys):
    with pytest.raises(SystemExit) as info:
        main(["bogus"])
    assert info.value.code == 2 and "invalid choice: 'bogus'" in capsys.readouterr().err


@pytest.mark.slow  # starts an interpreter (README: such tests are slow; the inner loop leaves them out)
def test_console_script_is_installed():
    script = os.path.join(os.path.dirname(sys.executable), "nbtrainer")
    assert os.path.exists(script), "reinstall the project (bash scripts/venv.sh): [project.scripts] nbtrainer"
    proc = subprocess.run([script, "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.startswith("usage: nbtrainer")


@pytest.mark.slow
def test_checkpoint_command_says_where_a_run_stands(tmp_path):
    x, y = make_classification(n=64)
    loader = make_loader(x, y, batch_size=16)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = Trainer(
        model, torch.nn.CrossEntropyLoss(), opt, callbacks=[ModelCheckpoint(tmp_path, save_last=True)], progress=False
    )
    trainer.set_scheduler(torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=8))
    trainer.fit(loader, epochs=2)
    proc = _run("checkpoint", str(tmp_path / "last.ckpt"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "position   2 epoch(s) complete, step 8" in out
    assert "OneCycleLR: 0 of total_steps=8 left" in out and "fit_more" in out
    assert "last epoch 2: loss=" in out and "lr=" in out
    # a finished run says so, and the command for more epochs is filled in (issue 58)
    assert "status     finished: all 2 planned epoch(s) done" in out and "to finish the planned run" not in out
    path = str(tmp_path / "last.ckpt")
    assert f"trainer.fit_more(train_loader, val_loader, epochs=N, resume_from={path!r}, scheduler=fn | None)" in out
    assert "OneCycleLR is used up" in out
    proc = _run("checkpoint", str(tmp_path / "missing.ckpt"))
    assert proc.returncode == 1 and "missing.ckpt" in proc.stderr


def test_checkpoint_of_a_run_stopped_early_says_what_is_left(tmp_path):
    """A run stopped after 1 of its 3 planned epochs: the command to finish it, with its epochs and path."""
    from nbtrainer._resume._checkpoint_io import load_checkpoint
    from nbtrainer._shell._cli import describe_checkpoint

    class StopAfterOne:
        def on_epoch_end(self, trainer, epoch, logs):
            trainer.request_stop("enough for now")

    x, y = make_classification(n=64)
    trainer = Trainer(
        mlp(),
        torch.nn.CrossEntropyLoss(),
        "sgd",
        lr=0.1,
        callbacks=[ModelCheckpoint(tmp_path, save_last=True), StopAfterOne()],
        progress=False,
        run_store=False,
    )
    trainer.fit(make_loader(x, y, batch_size=16), epochs=3)
    path = str(tmp_path / "last.ckpt")
    out = describe_checkpoint(load_checkpoint(path), path)
    assert "1 epoch(s) complete" in out and "finished" not in out
    assert f"trainer.fit(train_loader, val_loader, epochs=3, resume_from={path!r}) to finish the planned run" in out
    assert "(2 epoch(s) left)" in out


@pytest.mark.parametrize("max_steps", [6, 4])  # 2 batches into epoch 2; at epoch 1's end (4 batches an epoch)
def test_checkpoint_of_a_run_ended_by_max_steps_is_not_called_finished(tmp_path, max_steps):
    """fit(epochs=3, max_steps=...) then save_checkpoint: the History says finished (a planned end of that fit), but
    the run's planned epochs are not all done, and the command to finish them is given."""
    from nbtrainer._resume._checkpoint_io import load_checkpoint
    from nbtrainer._shell._cli import describe_checkpoint

    x, y = make_classification(n=64)
    trainer = Trainer(mlp(), torch.nn.CrossEntropyLoss(), "sgd", lr=0.1, progress=False, run_store=False)
    assert trainer.fit(make_loader(x, y, batch_size=16), epochs=3, max_steps=max_steps).status == "finished"
    path = trainer.save_checkpoint(str(tmp_path / "after_fit.ckpt"))
    ckpt = load_checkpoint(path)
    out = describe_checkpoint(ckpt, path)
    assert "finished: all" not in out and "nothing left" not in out, out
    assert f"max_steps={max_steps} reached" in out and "1 of 3 planned epoch(s) complete" in out, out
    assert f"trainer.fit(train_loader, val_loader, epochs=3, resume_from={path!r}) to finish the planned run" in out
    # a checkpoint saved between fits by an earlier version, without the planned epochs: not finished either
    ckpt["config"]["epochs"] = None
    out = describe_checkpoint(ckpt, path)
    assert "finished: all" not in out and "nothing left" not in out and "epochs=TOTAL" in out, out
