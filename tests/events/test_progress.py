"""Progress output: bars on a terminal, plain lines in a log; the bar after a resume and at max_steps.

The piped case runs a real script with its output redirected to a file (no monkeypatched isatty): the log
must have one ``epoch N/M`` line per epoch, every value in the one number format, and no carriage returns
or escape codes.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from conftest import make_classification, make_loader, mlp

from nbtrainer import EarlyStopping, ModelCheckpoint, ProgressBar, Trainer
from nbtrainer._report._format import format_value

SCRIPT = textwrap.dedent(
    """
    import sys
    import torch
    sys.path.insert(0, {tests!r})
    from conftest import make_classification, make_loader, mlp
    from nbtrainer import Trainer

    x, y = make_classification(n=512)
    model = mlp()
    trainer = Trainer(model, torch.nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=0.05),
                      metrics={{"acc": lambda o, t: (o.argmax(1) == t).float().mean()}}, refresh_interval=0.0)
    trainer.fit(make_loader(x, y, batch_size=8), make_loader(x, y, batch_size=64), epochs=4)
    """
)


def _check_values(line: str) -> dict[str, str]:
    """Every ``key=value`` of a line is in the one number format: formatting the value again gives it back."""
    pairs = dict(re.findall(r"(\S+)=(\S+)", line))
    for key, text in pairs.items():
        if "/" in text or key in ("eta", "time"):  # positions like epoch=3/10; durations (format_duration)
            continue
        value = float(text.replace(",", ""))
        assert format_value(key, value) == text, f"{key}={text} is not in the number format ({line!r})"
    return pairs


@pytest.mark.slow
def test_piped_output_is_one_plain_line_per_epoch(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(tests=os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    log = tmp_path / "log"
    env = {**os.environ, "NBTRAINER_FRONTEND": "", "NBTRAINER_PROGRESS": ""}
    with open(log, "w") as out:  # python train.py > log 2>&1
        proc = subprocess.run([sys.executable, str(script)], stdout=out, stderr=subprocess.STDOUT, env=env)
    text = log.read_text()
    assert proc.returncode == 0, text[-3000:]
    assert "\r" not in text and "\x1b" not in text, repr(text[:500])
    epochs = [line for line in text.splitlines() if line.startswith("epoch")]  # grep '^epoch' log
    assert [line.split()[1] for line in epochs] == ["1/4", "2/4", "3/4", "4/4"], text
    for line in epochs:
        keys = _check_values(line)
        assert {"loss", "acc", "val_loss", "val_acc", "lr", "time", "samples_per_s", "steps"} <= set(keys), line
    # a start line and a final line; nothing else (no bar fragments)
    others = [line for line in text.splitlines() if not line.startswith("epoch")]
    assert len(others) == 2 and others[0].startswith("training 4 epoch(s)"), text
    assert others[1].startswith("training finished") and "epochs=4/4" in others[1], text


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _fit(progress, epochs=2, n=64, batch_size=16, max_steps=None, **kw):
    x, y = make_classification(n=n)
    model = mlp()
    trainer = Trainer(
        model, torch.nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=0.05), progress=progress, **kw
    )
    return trainer, trainer.fit(make_loader(x, y, batch_size=batch_size), epochs=epochs, max_steps=max_steps)


def test_auto_mode_follows_the_stream(monkeypatch):
    monkeypatch.delenv("NBTRAINER_PROGRESS", raising=False)
    monkeypatch.setenv("NBTRAINER_FRONTEND", "console")
    tty, pipe = _Tty(), io.StringIO()
    assert ProgressBar(file=tty).resolve_mode() == "bars"
    assert ProgressBar(file=pipe).resolve_mode() == "lines"
    _fit(ProgressBar(file=tty))
    assert "\r" in tty.getvalue() and "epochs:" in tty.getvalue()  # tqdm bars
    _fit(ProgressBar(file=pipe))
    assert "\r" not in pipe.getvalue() and "epochs:" not in pipe.getvalue()
    monkeypatch.setenv("NBTRAINER_PROGRESS", "bars")  # the override wins over the stream
    assert ProgressBar(file=pipe).resolve_mode() == "bars"
    assert ProgressBar(file=tty, mode="lines").resolve_mode() == "lines"  # an explicit mode wins over both


def test_trainer_progress_option():
    trainer, _ = _fit("lines", epochs=1)
    bars = [cb for cb in trainer.callbacks.callbacks if isinstance(cb, ProgressBar)]
    assert len(bars) == 1 and bars[0].mode == "lines"
    with pytest.raises(ValueError, match=r"progress must be .*'lines'"):
        _fit("line")
    with pytest.raises(ValueError, match="heartbeat must be a number of seconds"):
        ProgressBar(heartbeat=0)


class _Slow:
    """A loader that takes a little time per batch, so heartbeats have something to beat over."""

    def __init__(self, n: int, delay: float) -> None:
        x, y = make_classification(n=16 * n)
        self.batches = list(make_loader(x, y, batch_size=16))
        self.delay = delay

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self):
        for batch in self.batches:
            time.sleep(self.delay)
            yield batch


def test_heartbeat_lines():
    out = io.StringIO()
    model = mlp()
    trainer = Trainer(
        model,
        torch.nn.CrossEntropyLoss(),
        torch.optim.SGD(model.parameters(), lr=0.05),
        progress=ProgressBar(mode="lines", heartbeat=0.05, file=out),
        refresh_interval=0.01,
    )
    trainer.fit(_Slow(20, 0.01), epochs=2)
    lines = out.getvalue().splitlines()
    beats = [line for line in lines if line.startswith("step ")]
    assert len(beats) >= 4, lines  # ~0.2 s per epoch, one beat per 0.05 s at most
    assert len([line for line in lines if line.startswith("epoch ")]) == 2
    for line in beats:
        assert re.match(r"step \d+/40  epoch=\d/2  batch=\d+/20  loss=\S+  lr=\S+  samples_per_s=\S+", line), line
        _check_values(line)
    quiet = io.StringIO()
    _fit(ProgressBar(mode="lines", file=quiet))
    assert not [line for line in quiet.getvalue().splitlines() if line.startswith("step ")]


def test_stopped_run_ends_with_a_final_line():
    out = io.StringIO()
    x, y = make_classification(n=64)
    model = mlp()
    trainer = Trainer(
        model,
        torch.nn.CrossEntropyLoss(),
        torch.optim.SGD(model.parameters(), lr=0.0),
        callbacks=[EarlyStopping("loss", patience=1)],
        progress=ProgressBar(mode="lines", file=out),
    )
    trainer.fit(make_loader(x, y, batch_size=16), epochs=10)
    last = out.getvalue().splitlines()[-1]
    assert last.startswith("training stopped (EarlyStopping: loss did not improve"), last
    assert "epochs=2/10" in last


def test_control_changes_are_logged_as_lines():
    out = io.StringIO()

    class SetLR:
        def on_optimizer_step(self, trainer, step, skipped):
            if step == 2:
                trainer.set_lr(0.01)
                trainer.set_grad_accum_steps(2)

    _fit(ProgressBar(mode="lines", file=out), epochs=1, callbacks=[SetLR()])
    controls = [line for line in out.getvalue().splitlines() if line.startswith("control")]
    assert controls == [
        "control  step=2  epoch=1  lr 5.00e-2 -> 1.00e-2",
        "control  step=2  epoch=1  grad_accum_steps 1 -> 2",
    ], out.getvalue()


def _epoch_bar_positions(text: str) -> list[str]:
    return re.findall(r"epochs:[^|\n\r]*\|[^|\n\r]*\| *(\d+/\d+)", text)


def test_bar_after_a_resume_counts_the_epochs_done(tmp_path):
    x, y = make_classification(n=64)
    loader = make_loader(x, y, batch_size=16)

    def trainer(out):
        model = mlp()
        return Trainer(
            model,
            torch.nn.CrossEntropyLoss(),
            torch.optim.SGD(model.parameters(), lr=0.05),
            callbacks=[ModelCheckpoint(tmp_path, save_last=True)],
            progress=ProgressBar(mode="bars", file=out),
        )

    trainer(io.StringIO()).fit(loader, epochs=3)
    out = io.StringIO()
    resumed = trainer(out)
    history = resumed.fit(loader, epochs=6, resume_from="last")
    positions = _epoch_bar_positions(out.getvalue())
    assert positions[0] == "3/6" and positions[-1] == "6/6", positions
    assert "2/6" not in positions and len(history.epochs) == 6
    assert resumed.progress.epoch == 6 and resumed.progress.epochs == 6
    lines = io.StringIO()
    again = trainer(lines)
    next(cb for cb in again.callbacks.callbacks if isinstance(cb, ProgressBar)).mode = "lines"
    again.fit(loader, epochs=8, resume_from="last")
    assert lines.getvalue().splitlines()[0].startswith("training epoch 7/8 (resumed)")


@pytest.mark.parametrize("max_steps,planned,rows", [(10, 3, 2), (8, 2, 2)])
def test_max_steps_is_a_finish_and_the_bar_agrees_with_the_history(max_steps, planned, rows):
    out = io.StringIO()
    trainer, history = _fit(ProgressBar(mode="bars", file=out), epochs=12, n=64, batch_size=16, max_steps=max_steps)
    assert history.status == "finished" and history.stop_reason == f"max_steps={max_steps} reached"
    assert trainer.global_step == max_steps
    assert trainer.progress.epochs == planned and trainer.progress.total_steps == max_steps
    assert len(history.epochs) == rows and len(history.steps["step"]) == max_steps
    positions = _epoch_bar_positions(out.getvalue())
    assert positions[-1] == f"{rows}/{planned}", positions
    assert out.getvalue().rstrip().splitlines()[-1].startswith(f"training finished (max_steps={max_steps} reached)")


def test_epoch_lines_show_the_time_with_its_unit():
    from nbtrainer._events._progress import format_logs

    line = format_logs({"epoch": 1, "loss": 0.5, "time": 2.3, "samples_per_s": 10.0})
    assert "time=2.30s" in line.split("  "), line
