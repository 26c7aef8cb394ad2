"""``%load_ext nbtrainer`` and the ``%nbtrainer`` magic, exercised through a real IPython InteractiveShell.

Only nbtrainer's own collaborators that other work is still building (``profile_model``,
``TrainerWidget``, ``ProfileCard``) are replaced in the *plumbing* tests; the same subcommands also run
against the real implementations when those are importable.
"""

from __future__ import annotations

import importlib.util
import re
import threading
import time
from typing import Any

import pytest
import torch
from _waits import wait_while_alive

pytest.importorskip("IPython")

from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

import nbtrainer
from nbtrainer._setup._precision import PRECISIONS, precision_support
from nbtrainer._shell import _doctor, _magics


def nbt(sh: Any, line: str) -> Any:
    return sh.run_line_magic("nbtrainer", line)


# -- load / unload ---------------------------------------------------------------------------------


def test_load_ext_registers_and_unload_removes(shell: Any) -> None:
    assert "nbtrainer" in shell.magics_manager.magics["line"]
    shell.run_line_magic("unload_ext", "nbtrainer")
    assert "nbtrainer" not in shell.magics_manager.magics["line"]
    result = shell.run_cell("%load_ext nbtrainer")
    assert result.success
    assert "nbtrainer" in shell.magics_manager.magics["line"]


def test_help_lists_every_subcommand(shell: Any, capsys: pytest.CaptureFixture) -> None:
    nbt(shell, "help")
    out = capsys.readouterr().out
    for sub in ("doctor", "profile", "train", "status", "stop"):
        assert f"%nbtrainer {sub}" in out
    nbt(shell, "profile -h")
    out = capsys.readouterr().out
    assert out.startswith("usage: %nbtrainer profile") and "--input-shape" in out


# -- doctor ----------------------------------------------------------------------------------------


def _precision_lines(text: str) -> dict[str, bool]:
    found = {}
    for name in PRECISIONS:
        m = re.search(rf"^\s*(ok|FAIL)\s+{re.escape(name)}\s+(supported|not available)", text, re.M)
        assert m, f"no precision line for {name}:\n{text}"
        found[name] = m.group(1) == "ok"
    return found


def test_doctor_reports_torch_devices_and_checked_precisions(shell: Any) -> None:
    assert nbt(shell, "doctor") is None  # shown, not returned (test_doctor_in_a_cell_shows_report)
    report = shell.user_ns["_nbt_doctor"]
    text = str(report)
    assert torch.__version__ in text
    assert ("CPU build" in text) == (torch.version.cuda is None and getattr(torch.version, "hip", None) is None)
    assert re.search(r"^\s+cpu\s+\S", text, re.M), text
    # the precision lines agree with the real check for the CPU
    assert _precision_lines(text) == {k: v[0] for k, v in precision_support("cpu").items()}
    for pkg in ("ipywidgets", "jupyterlab_widgets", "bqplot", "ipykernel"):
        assert re.search(rf"^\s*\S*\s+{pkg}\s+\S", text, re.M), pkg
    assert "@jupyter-widgets/jupyterlab-manager" in text and "front-end extensions" in text
    assert "ipykernel" in text and ("thread" in text)
    html = report._repr_html_()
    assert 'class="nbt-doctor"' in html and torch.__version__ in html
    # the alias gives the same report
    nbt(shell, "env")
    assert re.sub(r"\d+\.\d+s", "", str(shell.user_ns["_nbt_doctor"])) == re.sub(r"\d+\.\d+s", "", text)


def test_doctor_refuses_a_device_torch_cannot_parse(shell: Any) -> None:
    with pytest.raises(UsageError, match=r"%nbtrainer doctor: bad --device 'nonsense:0'"):
        nbt(shell, "doctor --device cpu,nonsense:0")


@pytest.mark.parametrize("device", ["cuda:0", "mps"])
def test_doctor_refuses_a_device_this_machine_lacks(shell: Any, device: str) -> None:
    usable = torch.cuda.is_available() if device.startswith("cuda") else torch.backends.mps.is_available()
    if usable:
        pytest.skip(f"{device} is usable here")
    with pytest.raises(UsageError, match=rf"%nbtrainer doctor: bad --device '{device}': ") as info:
        nbt(shell, f"doctor --device cpu,{device}")
    assert "\n" not in str(info.value) and "registered at" not in str(info.value)
    # the fix is the magic the user is typing, not the shell command (`nbtrainer doctor` in a cell is a NameError)
    assert str(info.value).endswith("`%nbtrainer doctor` without --device checks what is here")


def test_doctor_in_a_cell_shows_report(shell: Any) -> None:
    """The report shows wherever the magic stands in a cell, not only as its last line (issue 58)."""
    with capture_output() as cap:
        result = shell.run_cell("%nbtrainer doctor --device cpu\nx = 1")
    assert result.success, result.error_in_exec
    assert isinstance(shell.user_ns["_nbt_doctor"], _magics.DoctorReport)
    assert "nbtrainer doctor" in cap.stdout and "devices and precisions" in cap.stdout


def test_doctor_flags_thread_bug_and_missing_extensions_with_fixes(
    shell: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    real = _doctor._version
    fake = {"ipykernel": "7.0.1", "ipywidgets": "8.1.5", "jupyterlab_widgets": "1.1.11"}
    monkeypatch.setattr(_doctor, "_version", lambda name: fake.get(name, real(name)))
    monkeypatch.setattr(_doctor, "_labextension_dirs", lambda: [str(tmp_path)])
    nbt(shell, "doctor --device cpu")
    report = shell.user_ns["_nbt_doctor"]
    assert not report.ok
    problems = {p.what: p.fix for p in report.problems}
    thread = [f for w, f in problems.items() if "thread-update bug" in w and "7.0.1" in w]
    assert thread and "ipykernel>=7.1" in thread[0]
    mismatch = [f for w, f in problems.items() if "jupyterlab_widgets 3.x" in w]
    assert mismatch and "jupyterlab_widgets>=3" in mismatch[0]
    missing = [f for w, f in problems.items() if "front-end extension is not installed" in w]
    assert len(missing) == 2 and any("jupyterlab_widgets" in f for f in missing) and any("bqplot" in f for f in missing)
    text = str(report)
    assert "FAIL" in text and "fix:" in text
    assert len(re.findall(r"^\s+fix: ", text, re.M)) == len(report.problems)


# -- usage errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "line",
    [
        "bogus",
        "profile",
        "profile model",  # neither --input-shape nor --inputs
        "profile model --input-shape 1,a",
        "profile model --input-shape 2,8 --precision fp8",
        "profile model --input-shape 2,3",  # the model takes 8 features: its error as a usage error
        "profile model --inputs x --input-shape 2,8",
        "profile missing_model --input-shape 2,8",
        "profile model --inputs 'unclosed",
        "train model crit",
        "train model crit opt loader --epochs 0",
        "train model crit opt loader --epochs two",
        "train model crit opt loader --precision fp8",
        "stop x",
        "doctor --nope",
        "status extra",
    ],
)
def test_bad_arguments_raise_usage_error(shell: Any, line: str) -> None:
    shell.user_ns["model"] = torch.nn.Linear(8, 2)
    shell.user_ns["x"] = torch.randn(2, 8)
    with pytest.raises(UsageError) as info:
        nbt(shell, line)
    msg = str(info.value)
    assert msg.strip(), line
    if line.split()[0] in ("bogus", "profile", "train", "stop", "doctor", "status") and "not defined" not in msg:
        assert "%nbtrainer" in msg, msg


def test_usage_error_in_a_cell_is_clean(shell: Any, capsys: pytest.CaptureFixture) -> None:
    result = shell.run_cell("%nbtrainer train only_two_args x")
    assert isinstance(result.error_in_exec, UsageError)
    captured = capsys.readouterr()
    both = captured.out + captured.err
    assert "UsageError" in both and "usage: %nbtrainer train" in both
    assert "Traceback" not in both


# -- profile ---------------------------------------------------------------------------------------


class _FakeProfile:
    def __init__(self, **kw: Any) -> None:
        self.kw = kw

    def _repr_html_(self) -> str:
        return "<div class='fake-profile'>profile</div>"


def test_profile_plumbing(shell: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict] = []

    def fake_profile_model(model: Any, example: Any, *, devices: Any, precisions: Any) -> _FakeProfile:
        calls.append({"model": model, "example": example, "devices": devices, "precisions": precisions})
        return _FakeProfile()

    monkeypatch.setitem(vars(nbtrainer), "profile_model", fake_profile_model)
    monkeypatch.setenv("NBTRAINER_FRONTEND", "notebook")  # a kernel with a front end: the card is shown
    # no ProfileCard: the profile's own HTML is shown
    monkeypatch.delitem(vars(nbtrainer), "ProfileCard", raising=False)
    monkeypatch.setitem(nbtrainer._LAZY, "ProfileCard", "nbtrainer._no_such_module_for_test")
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    shell.user_ns["net"] = model
    with capture_output() as cap:
        assert nbt(shell, "profile net --input-shape 2,8 --device cpu --precision bf16") is None
    call = calls[-1]
    assert call["model"] is model
    assert isinstance(call["example"], torch.Tensor) and tuple(call["example"].shape) == (2, 8)
    assert call["devices"] == (torch.device("cpu"),) and call["precisions"] == ("bf16-mixed",)
    assert isinstance(shell.user_ns["_nbt_profile"], _FakeProfile)
    assert any("fake-profile" in o.data.get("text/html", "") for o in cap.outputs)

    # --inputs passes the namespace object itself; several shapes make a tuple; comma lists
    shell.user_ns["batch"] = {"x": torch.randn(3, 8)}
    nbt(shell, "profile net --inputs batch --precision fp32,fp16")
    assert calls[-1]["example"] is shell.user_ns["batch"]
    assert calls[-1]["precisions"] == ("fp32", "fp16-mixed")
    nbt(shell, "profile net --input-shape 1,8 --input-shape 1,3")
    assert [tuple(t.shape) for t in calls[-1]["example"]] == [(1, 8), (1, 3)]

    # with a ProfileCard, the card is displayed
    cards: list[Any] = []

    class FakeCard:
        def __init__(self, profile: Any) -> None:
            cards.append(profile)

        def _repr_html_(self) -> str:
            return "<div class='fake-card'></div>"

    monkeypatch.setitem(vars(nbtrainer), "ProfileCard", FakeCard)
    with capture_output() as cap:
        nbt(shell, "profile net --input-shape 2,8")
    assert cards and cards[-1] is shell.user_ns["_nbt_profile"]
    assert any("fake-card" in o.data.get("text/html", "") for o in cap.outputs)


def test_profile_rejects_non_module(shell: Any) -> None:
    shell.user_ns["notamodel"] = 3
    with pytest.raises(UsageError, match=r"not a torch\.nn\.Module"):
        nbt(shell, "profile notamodel --input-shape 1,2")


@pytest.mark.skipif(
    importlib.util.find_spec("nbtrainer._profile") is None, reason="nbtrainer.profile_model is not written yet"
)
def test_profile_real_model(shell: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NBTRAINER_FRONTEND", "notebook")  # displayed as a card (terminal: text, tested above)
    shell.user_ns["net"] = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.LazyLinear(2)
    )
    shell.user_ns["net"](torch.randn(1, 3, 8, 8))  # materialize the lazy layer
    with capture_output() as cap:
        assert nbt(shell, "profile net --input-shape 1,3,8,8 --device cpu --precision fp32") is None
    profile = shell.user_ns["_nbt_profile"]
    assert type(profile).__name__ == "ModelProfile"
    assert cap.outputs, "nothing was displayed"


def test_profile_and_compare_in_terminal_ipython_print_the_text(
    shell: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """The test shell is an InteractiveShell, as terminal IPython's: no front end can draw a widget, so the
    magics print the profile's and the comparison's text, never a widget's repr."""
    monkeypatch.delenv("NBTRAINER_FRONTEND", raising=False)
    shell.user_ns["net"] = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    assert nbt(shell, "profile net --input-shape 4,8 --device cpu --precision fp32") is None
    out = capsys.readouterr().out
    profile = shell.user_ns["_nbt_profile"]
    assert str(profile) in out
    assert "ProfileCard(" not in out and "HTML(" not in out and "<div" not in out

    ds = torch.utils.data.TensorDataset(torch.randn(32, 8), torch.randint(0, 2, (32,)))
    shell.user_ns.update(
        make_model=lambda: torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)),
        crit=torch.nn.CrossEntropyLoss(),
        tl=torch.utils.data.DataLoader(ds, batch_size=8),
        vl=torch.utils.data.DataLoader(ds, batch_size=16),
    )
    assert nbt(shell, "compare make_model None crit tl vl --strategies fp32,accum2 --steps 3") is None
    out = capsys.readouterr().out
    table = shell.user_ns["_nbt_compare"]
    assert str(table) in out and "_nbt_compare_widget" not in shell.user_ns
    assert "VBox(" not in out and "CompareWidget" not in out
    assert re.search(r"^strategy\s+step time", out, re.M) and re.search(r"^accum2\s", out, re.M)


# -- train -----------------------------------------------------------------------------------------


def _data() -> dict[str, Any]:
    model = torch.nn.Linear(4, 2)
    ds = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,)))
    return {
        "model": model,
        "crit": torch.nn.CrossEntropyLoss(),
        "opt": torch.optim.SGD(model.parameters(), lr=0.1),
        "train_dl": torch.utils.data.DataLoader(ds, batch_size=8),
        "val_dl": torch.utils.data.DataLoader(ds, batch_size=8),
        "mets": {"mae": lambda out, y: (out.argmax(1) - y).abs().float().mean()},
    }


def test_train_plumbing(shell: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[Any] = []

    class FakeWidget:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.args, self.kwargs = args, kwargs
            made.append(self)

        def _repr_html_(self) -> str:
            return "<div class='fake-widget'></div>"

    monkeypatch.setitem(vars(nbtrainer), "TrainerWidget", FakeWidget)
    monkeypatch.setenv("NBTRAINER_FRONTEND", "notebook")  # a kernel with a front end: the panel is shown
    ns = _data()
    shell.user_ns.update(ns)
    with capture_output() as cap:
        out = nbt(shell, "train model crit opt train_dl val_dl --epochs 3 --precision bf16 --accum 2 --metrics mets")
    assert out is None
    w = made[-1]
    assert shell.user_ns["_nbt_widget"] is w
    assert w.args == (ns["model"], ns["crit"], ns["opt"], ns["train_dl"], ns["val_dl"])
    assert w.kwargs == {"epochs": 3, "precision": "bf16-mixed", "grad_accum_steps": 2, "metrics": ns["mets"]}
    assert any("fake-widget" in o.data.get("text/html", "") for o in cap.outputs)

    nbt(shell, "train model None opt train_dl")
    assert made[-1].args == (ns["model"], None, ns["opt"], ns["train_dl"], None)
    assert made[-1].kwargs == {"epochs": 1, "precision": "fp32", "grad_accum_steps": 1, "metrics": None}

    with pytest.raises(UsageError, match="not defined"):
        nbt(shell, "train model crit opt no_such_loader")


def _widget_available() -> bool:
    try:
        from nbtrainer.widgets import TrainerWidget  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.skipif(not _widget_available(), reason="nbtrainer.widgets.TrainerWidget is not written yet")
def test_train_builds_real_widget(shell: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from nbtrainer.widgets import TrainerWidget

    monkeypatch.setenv("NBTRAINER_FRONTEND", "notebook")
    shell.user_ns.update(_data())
    with capture_output():
        nbt(shell, "train model crit opt train_dl val_dl --epochs 2")
    assert isinstance(shell.user_ns["_nbt_widget"], TrainerWidget)


def test_train_in_terminal_ipython_trains_in_the_foreground(shell: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The test shell is an InteractiveShell (terminal IPython's class family), not a kernel: no panel can
    be shown, so the magic trains right away with console progress instead of printing a widget repr."""
    monkeypatch.delenv("NBTRAINER_FRONTEND", raising=False)
    monkeypatch.delenv("NBTRAINER_PROGRESS", raising=False)
    ns = _data()
    before = [p.detach().clone() for p in ns["model"].parameters()]
    shell.user_ns.update(ns)
    with capture_output() as cap:
        out = nbt(shell, "train model crit opt train_dl val_dl --epochs 2 --accum 2 --metrics mets")
    assert out is None and "_nbt_widget" not in shell.user_ns
    history = shell.user_ns["_nbt_history"]
    assert history.status == "finished" and [r["epoch"] for r in history.epochs] == [1, 2]
    assert {"val_loss", "mae", "val_mae"} <= set(history.keys())
    assert shell.user_ns["_nbt_trainer"].grad_accum_steps == 2
    assert any(not torch.equal(a, b) for a, b in zip(before, ns["model"].parameters(), strict=True))  # trained
    text = cap.stdout + cap.stderr
    assert "VBox" not in text and "training runs in the foreground" in cap.stderr
    assert "epoch 2/2" in text  # console progress (plain lines here: the captured streams are not a TTY)


# -- status / stop ---------------------------------------------------------------------------------


def test_status_and_stop_with_no_runs(shell: Any, capsys: pytest.CaptureFixture) -> None:
    assert nbt(shell, "status") is None
    assert "No training runs in progress" in capsys.readouterr().out
    assert nbt(shell, "stop") is None
    assert "No training runs in progress" in capsys.readouterr().out


class _SlowLoader:
    """A loader slow enough that the run is still going when the magic looks at it."""

    def __init__(self, n: int = 400) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Any:
        for _ in range(self.n):
            time.sleep(0.01)
            yield torch.randn(8, 4), torch.randint(0, 2, (8,))


def test_status_and_stop_a_background_run(shell: Any, capsys: pytest.CaptureFixture) -> None:
    from nbtrainer import Trainer

    model = torch.nn.Linear(4, 2)
    trainer = Trainer(
        model,
        torch.nn.CrossEntropyLoss(),
        torch.optim.SGD(model.parameters(), lr=0.1),
        progress=False,
        refresh_interval=0.05,
    )
    result: dict[str, Any] = {}
    thread = threading.Thread(
        target=lambda: result.setdefault("history", trainer.fit(_SlowLoader(), epochs=5)), daemon=True
    )
    thread.start()
    try:
        started = lambda: trainer in Trainer.active() and trainer.progress.global_step >= 2  # noqa: E731
        wait_while_alive(started, thread, "the run ended before its second step")
        nbt(shell, "status")
        out = capsys.readouterr().out
        assert "1 training run(s) in progress" in out
        assert re.search(r"\[0\] Linear · running · epoch 1/5 · step \d+/\d+", out), out

        with pytest.raises(UsageError, match="no run 3"):
            nbt(shell, "stop 3")
        nbt(shell, "stop 0 --wait 15")
        out = capsys.readouterr().out
        assert "stop requested" in out and "all stopped." in out
    finally:
        trainer.request_stop("test teardown")
        thread.join(20)
    assert not thread.is_alive()
    assert trainer not in Trainer.active()
    assert result["history"].status == "stopped"
    assert len(result["history"].epochs) < 5


@pytest.mark.slow
def test_magics_in_a_real_kernel(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """In a Jupyter kernel the doctor report is displayed as HTML and knows it runs in a kernel."""
    nbformat = pytest.importorskip("nbformat")
    pytest.importorskip("nbclient")
    from _kernels import notebook_client

    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [
        nbformat.v4.new_code_cell(src)
        for src in ("%load_ext nbtrainer", "%nbtrainer doctor --device cpu", "%nbtrainer status")
    ]
    notebook_client(nb, timeout=None, resources={"metadata": {"path": str(tmp_path)}}).execute()
    [result] = [o for o in nb.cells[1].outputs if o.output_type == "display_data"]
    assert 'class="nbt-doctor"' in result.data["text/html"]
    assert "ZMQInteractiveShell" in result.data["text/plain"]
    assert "No training runs in progress" in "".join(o.get("text", "") for o in nb.cells[2].outputs)


@pytest.mark.parametrize(
    ("frontend", "line", "message"),
    [
        ("notebook", "train model crit opt train_dl --metrics crit", "%nbtrainer train: metrics must be a dict"),
        ("notebook", "train model crit groups train_dl", "%nbtrainer train: "),
        ("terminal", "train model crit groups train_dl", "%nbtrainer train: "),
        ("notebook", "compare make_model None crit train_dl --steps 2 --device tpu", "bad --device 'tpu'"),
    ],
)
def test_names_holding_the_wrong_thing_give_a_usage_error_not_a_traceback(
    shell: Any, monkeypatch: pytest.MonkeyPatch, frontend: str, line: str, message: str
) -> None:
    """Before: a --metrics that is not a dict, an optimizer name holding a list, or compare's --device tpu raised a
    full traceback (compare's after showing its widget at "0 done"); the messages were clear, the way was not."""
    monkeypatch.setenv("NBTRAINER_FRONTEND", frontend)
    shell.user_ns.update(_data())
    shell.user_ns["groups"] = shell.user_ns["opt"].param_groups
    shell.user_ns["make_model"] = lambda: torch.nn.Linear(8, 2)
    shown: list[Any] = []
    monkeypatch.setattr("IPython.display.display", lambda *a, **k: shown.append(a))
    with pytest.raises(UsageError, match=re.escape(message)), capture_output():
        nbt(shell, line)
    assert shown == []  # refused before anything was drawn
