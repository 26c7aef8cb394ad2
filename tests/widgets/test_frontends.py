"""The panel per front end, in a real kernel driven over the Jupyter protocol (on both widget stacks: scripts/test.sh
runs tests/widgets in the main venv and in the colab profile's).

* Colab: a stand-in ``google.colab.output`` (the only part of Colab that runs here) whose
  ``enable_custom_widget_manager`` does what Colab's does: it registers a display hook that marks every widget view
  published after it. Every nbtrainer view the kernel publishes must carry the mark (the call came before the first
  display) and the call is made once.
* Where widgets cannot render: each display_data of a view carries the widget view, ``text/plain`` and
  ``text/html``; the text is readable (never "VBox(children=...)"), and after a run it holds the status, the last
  metrics and (HTML) the SVG charts. ``%nbtrainer profile``'s card too.
* VS Code (``VSCODE_PID`` in the kernel's environment): updates throttled to 0.5 s; while ``w.fit()`` blocks, the
  status line says clicks cannot come and what works instead, exactly where they cannot (ipykernel 6, no subshells).
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

jupyter_client = pytest.importorskip("jupyter_client")
from _kernels import kernel_manager  # noqa: E402 (after the skip: it needs jupyter_client)

VIEW = "application/vnd.jupyter.widget-view+json"

STANDIN = '''
"""Stand-in for google.colab.output: what enable_custom_widget_manager does in Colab (a display hook that marks
each widget view published after the call), and a record of the calls."""
CALLS = []


def _hook(msg):
    data = (msg.get("content") or {}).get("data") or {}
    if "application/vnd.jupyter.widget-view+json" in data:
        CALLS.append("widget view published")
        meta = msg["content"].setdefault("metadata", {})
        meta["application/vnd.jupyter.widget-view+json"] = {"colab": {"custom_widget_manager": {"url": "stand-in"}}}
    return msg


def enable_custom_widget_manager():
    from IPython import get_ipython

    CALLS.append("enable_custom_widget_manager")
    get_ipython().display_pub.register_hook(_hook)
'''

SETUP = """
import time, torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from nbtrainer import TrainerWidget
torch.manual_seed(0)
x, y = torch.randn(256, 8), torch.randint(0, 3, (256,))
dl = DataLoader(TensorDataset(x, y), batch_size=32)
acc = lambda o, t: (o.argmax(1) == t).float().mean()
def panel(name, epochs=2, **kw):
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    return TrainerWidget(model, nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=0.05), dl, dl,
                         epochs=epochs, metrics={"acc": acc}, progress=False, name=name, **kw)
"""


class Client:
    """A kernel started with ``env`` and a client that keeps every iopub message."""

    def __init__(self, env: dict[str, str]) -> None:
        self.km = kernel_manager("python3")
        self.km.start_kernel(env=env)
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=120)
        self.messages: list[dict[str, Any]] = []
        self.dump = Path(tempfile.mkdtemp(prefix="nbt-stacks")) / "stacks.txt"
        self.run(
            f"import faulthandler as _fh, signal as _sig\n_nbt_stacks = open({str(self.dump)!r}, 'w')\n"
            "_fh.register(_sig.SIGUSR1, file=_nbt_stacks, all_threads=True)"
        )

    def run(self, code: str, timeout: float = 120) -> list[dict[str, Any]]:
        """Execute ``code``; the iopub messages it caused, up to its idle status. ``timeout`` counts from the
        cell's last message: it fails when none comes (stuck), not while a loaded machine delivers a cell that opens
        a thousand comms slowly (two panels' set-up ran past a fixed 120 s in a loaded trial)."""
        msg_id = self.kc.execute(code)
        end = time.monotonic() + timeout
        mine: list[dict[str, Any]] = []
        while True:
            try:
                m = self.kc.get_iopub_msg(timeout=0.2)
            except queue.Empty:
                if time.monotonic() > end:
                    got = [x["msg_type"] for x in mine]
                    raise AssertionError(
                        f"no message for {timeout} s, no idle; got {len(got)} messages, the last {got[-12:]}; the "
                        f"kernel's threads:\n{self.stacks()}"
                    ) from None
                continue
            self.messages.append(m)
            if m["parent_header"].get("msg_id") != msg_id:
                continue
            mine.append(m)
            end = time.monotonic() + timeout
            if m["msg_type"] == "error":
                raise AssertionError("\n".join(m["content"]["traceback"]))
            if m["msg_type"] == "status" and m["content"]["execution_state"] == "idle":
                return mine

    def stacks(self) -> str:
        """Where each of the kernel's threads is: a kernel that sent nothing for minutes once, in a loaded trial, and
        the message list alone could not tell a busy kernel from a stuck one. The kernel's ``faulthandler`` writes
        them on SIGUSR1 (registered at start)."""
        pid = getattr(self.km.provisioner, "pid", None)
        if pid is None:
            return "(no kernel pid)"
        try:
            os.kill(pid, signal.SIGUSR1)
            time.sleep(2.0)  # the handler writes at once; the file is read after it
            return self.dump.read_text()[-6000:] or "(nothing written)"
        except OSError as exc:
            return f"(no dump: {exc})"

    @staticmethod
    def stdout(messages: list[dict[str, Any]]) -> str:
        return "".join(m["content"]["text"] for m in messages if m["msg_type"] == "stream")

    @staticmethod
    def views(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The display_data / execute_result contents that carry a widget view."""
        return [
            m["content"]
            for m in messages
            if m["msg_type"] in ("display_data", "execute_result") and VIEW in m["content"]["data"]
        ]

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)
        shutil.rmtree(self.dump.parent, ignore_errors=True)  # left behind, one folder in /tmp per kernel


def _env(venv_kernelspec: Any, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VSCODE_", "NBTRAINER_"))}
    env.update(extra)
    return env


@pytest.fixture
def colab_kernel(venv_kernelspec: Any, tmp_path: Path) -> Any:
    pkg = tmp_path / "standin" / "google" / "colab"  # no google/__init__.py: a namespace package, like protobuf's
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "output.py").write_text(STANDIN)
    path = os.pathsep.join([str(tmp_path / "standin"), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    client = Client(_env(venv_kernelspec, PYTHONPATH=path))
    try:
        yield client
    finally:
        client.close()


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_colab_custom_widget_manager_once_before_the_first_display_and_readable_fallbacks(colab_kernel) -> None:
    k = colab_kernel
    k.run(SETUP + "from google.colab import output as colab_output\nw1 = panel('first')\nw2 = panel('second')")
    first = k.run("w1")  # a cell's last expression
    again = k.run("from IPython.display import display\ndisplay(w2)\ndisplay(w1)")
    calls = json.loads(k.stdout(k.run("import json; print(json.dumps(colab_output.CALLS))")))
    views = Client.views(first) + Client.views(again)
    assert len(views) == 3
    # the call came before the first view was published (each carries the mark its hook adds), and only once
    assert calls[0] == "enable_custom_widget_manager" and calls.count("enable_custom_widget_manager") == 1, calls
    assert all(v["metadata"][VIEW]["colab"]["custom_widget_manager"] for v in views), [v["metadata"] for v in views]
    assert k.stdout(k.run("print(w1.ui_interval, w2.ui_interval)")).split() == ["0.5", "0.5"]  # Colab: throttled

    # where widgets cannot render, every view is readable as text and as HTML: never a repr, never an error
    for v in views:
        assert {VIEW, "text/plain", "text/html"} <= set(v["data"]), sorted(v["data"])
        text = v["data"]["text/plain"]
        assert text.startswith("TrainerWidget '") and "idle · epoch 0/2" in text, text
        assert "VBox(" not in text and "Error" not in text and "nbt-fallback" in v["data"]["text/html"]

    # after a run: the status, the last metrics and the charts as SVG
    k.run("h = w1.fit()")
    bundle = json.loads(
        k.stdout(k.run("b = w1._repr_mimebundle_()\nprint(json.dumps({m: b[m] for m in ('text/plain', 'text/html')}))"))
    )
    text = bundle["text/plain"]
    assert "finished · epoch 2/2 · 16 steps" in text and "val_acc=" in text and "VBox(" not in text, text
    assert "<svg" in bundle["text/html"] and "finished" in bundle["text/html"]

    # %nbtrainer's outputs that show a widget: the profile card
    shown = k.run("%load_ext nbtrainer\nm = nn.Linear(8, 3)\n%nbtrainer profile m --input-shape 1,8")
    cards = Client.views(shown)
    assert len(cards) == 1 and {"text/plain", "text/html"} <= set(cards[0]["data"]), [sorted(c["data"]) for c in cards]
    assert cards[0]["data"]["text/plain"].startswith("model profile") and "VBox(" not in cards[0]["data"]["text/plain"]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_vscode_throttles_updates_and_says_what_works_where_clicks_cannot_reach_a_busy_kernel(
    venv_kernelspec: Any,
) -> None:
    k = Client(_env(venv_kernelspec, VSCODE_PID="4242"))
    try:
        out = k.run(
            SETUP
            + textwrap.dedent("""
            import ipykernel
            class Slow:  # about 40 optimizer steps a second: a run of 24 steps lasts past a few UI pushes
                def on_optimizer_step(self, trainer, step, skipped):
                    time.sleep(0.05)
            w = panel('vs', epochs=3, callbacks=[Slow()])
            print(w.ui_interval, ipykernel.version_info[0], w.view.status.model_id)
            """)
        )
        interval, major, status_id = Client.stdout(out).split()
        assert float(interval) == 0.5
        run = k.run("h = w.fit()\nprint('RESULT', h.status)")
        assert Client.stdout(run).split() == ["RESULT", "finished"]  # training works whatever the clicks can do
        statuses = [
            m["content"]["data"]["state"]["value"]
            for m in k.messages
            if m["msg_type"] == "comm_msg"
            and m["content"].get("comm_id") == status_id
            and "value" in (m["content"]["data"].get("state") or {})
        ]
        noted = [s for s in statuses if "nbt-status-note" in s]
        if int(major) < 7:  # no subshells, and jupyter-ui-poll fails in VS Code: the status says what works
            assert noted and "interrupt the kernel" in noted[-1] and "Start (trains in the background)" in noted[-1]
            assert "nbt-status-note" not in statuses[-1]  # gone once the run has ended
        else:  # ipykernel 7: the clicks reach the waiting cell (nbtrainer's subshell), nothing to say
            assert not noted, noted[:1]
    finally:
        k.close()


def test_frontend_detection_and_throttling(monkeypatch) -> None:
    from nbtrainer.widgets._frontends import detect

    for name in ("VSCODE_PID", "NBTRAINER_WIDGET_FRONTEND"):
        monkeypatch.delenv(name, raising=False)
    if "google.colab" not in sys.modules:
        assert detect().name == "jupyter" and detect().ui_interval(0.25) == 0.25
    monkeypatch.setenv("VSCODE_PID", "1")
    assert detect().name in ("vscode", "colab") and detect().ui_interval(0.1) == 0.5 and detect().budget == 0.5
    monkeypatch.setenv("NBTRAINER_WIDGET_FRONTEND", "jupyter")
    assert detect().name == "jupyter"


def test_the_status_names_what_works_where_a_busy_kernel_cannot_take_clicks(monkeypatch) -> None:
    """ipykernel 6 (no subshells): in VS Code, or without jupyter-ui-poll, the panel's clicks wait for the cell."""
    import types

    import IPython

    from nbtrainer.widgets import _frontends

    kernel6, kernel7 = types.SimpleNamespace(), types.SimpleNamespace(_supports_kernel_subshells=True)
    shell = types.SimpleNamespace(kernel=kernel6)
    monkeypatch.setattr(IPython, "get_ipython", lambda: shell)
    monkeypatch.delenv("NBTRAINER_WIDGET_FRONTEND", raising=False)
    monkeypatch.delenv("VSCODE_PID", raising=False)
    if "google.colab" not in sys.modules:
        assert _frontends.unreachable_clicks() == ""  # jupyter-ui-poll carries them
    monkeypatch.setitem(sys.modules, "jupyter_ui_poll", None)  # not importable
    assert "without jupyter-ui-poll" in _frontends.unreachable_clicks()
    monkeypatch.setenv("VSCODE_PID", "1")
    monkeypatch.setenv("NBTRAINER_WIDGET_FRONTEND", "vscode")
    note = _frontends.unreachable_clicks()
    assert "VS Code" in note and "interrupt the kernel" in note and "Start (trains in the background)" in note
    shell.kernel = kernel7  # ipykernel 7: nbtrainer's subshell takes them, whatever the front end
    assert _frontends.unreachable_clicks() == ""


def test_a_memory_saver_that_cannot_run_says_why_on_hover_on_both_widget_stacks() -> None:
    """Before: the savers set ``box.tooltip``, a trait Checkbox and Dropdown lack on ipywidgets 7 (Colab's): a plain
    attribute no front end received, so the hover text was empty there (this test runs in the colab pass too)."""
    import torch
    from widget_helpers import make_classification, make_loader, tooltip

    from nbtrainer import TrainerWidget

    model = torch.nn.Linear(8, 3)
    x, y = make_classification(n=32, d=8, seed=0)
    w = TrainerWidget(model, torch.nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=0.1),
                      make_loader(x, y, 16), epochs=1, device="cpu", progress=False, run_store=False)  # fmt: skip
    box = w.savers.offload_optimizer
    assert box.disabled and "nothing to offload to" in tooltip(box)  # on a CPU the state is in host RAM already
    assert tooltip(w.savers.optimizer)  # the optimizer menu's hover text: what cannot run here, or that all can
