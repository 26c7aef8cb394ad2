"""The panel in a real Jupyter kernel, driven over the Jupyter protocol as a front end drives it.

A cell blocks in ``w.fit()``; meanwhile this client sends the same ``comm_msg`` a browser sends when Pause,
Resume and Stop are clicked, and reads the widget updates the kernel publishes. Without processing widget
messages inside the waiting cell, the clicks would only arrive after the run (seen in JupyterLab before the
fix: 8 s of clicks with no effect).
"""

from __future__ import annotations

import contextlib
import queue
import re
import time
from typing import Any

import pytest

jupyter_client = pytest.importorskip("jupyter_client")
from _kernels import kernel_manager  # noqa: E402 (after the skip: it needs jupyter_client)

zmq = pytest.importorskip("zmq")

SETUP = """
import time, torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from nbtrainer import TrainerWidget

class Slow:  # about 40 optimizer steps per second: long enough to click during the run
    def on_optimizer_step(self, trainer, step, skipped):
        time.sleep(0.02)

torch.manual_seed(0)
x, y = torch.randn(512, 8), torch.randint(0, 3, (512,))
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
w = TrainerWidget(model, nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=0.05),
                  DataLoader(TensorDataset(x, y), batch_size=16), epochs=50, callbacks=[Slow()],
                  progress=False, refresh_interval=0.05, ui_interval=0.1)
print("IDS", w.view.pause.model_id, w.view.stop.model_id, w.view.status.model_id, w.view.progress_info.model_id)
"""


class Kernel:
    """A started kernel and its client, with the iopub stream collected into ``messages``."""

    def __init__(self) -> None:
        self.km = kernel_manager("python3")
        self.km.start_kernel()
        # iopub is a PUB socket: when the reader falls behind by its high-water marks (1,000 messages each side) the
        # kernel drops what follows, the cell's idle status among them. A cell that opens thousands of comms, read
        # by a test process that a loaded machine slows, lost it that way. With no limit on the client's side, its
        # I/O thread (native, never waiting for the GIL) takes every message as it comes.
        self.kc = self.km.client()
        self.kc.context.setsockopt(zmq.RCVHWM, 0)  # the client's own context: the sockets it makes from now on
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=120)
        self.messages: list[dict[str, Any]] = []

    def pump(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                self.messages.append(self.kc.get_iopub_msg(timeout=0.05))
            except queue.Empty:
                pass

    def reply(self, msg_id: str, timeout: float) -> dict[str, Any]:
        """The shell reply to ``msg_id`` (earlier replies, e.g. kernel_info's, are skipped)."""
        end = time.monotonic() + timeout
        while True:
            msg = self.kc.get_shell_msg(timeout=max(0.1, end - time.monotonic()))
            if msg["parent_header"].get("msg_id") == msg_id:
                assert msg["content"]["status"] == "ok", msg["content"]
                return msg

    def idle(self, msg_id: str, timeout: float = 120, *, from_last: bool = False) -> None:
        """Collect iopub until the kernel's idle status for ``msg_id``: every output of a request comes before it
        on iopub, however late a loaded machine delivers them (a fixed pump after the shell reply lost the
        set-up cell's output under load). ``from_last``: for a cell that streams many messages, ``timeout`` counts
        from the last message, so it fails once none comes (stuck), not while a loaded machine delivers them (slow)."""
        end = time.monotonic() + timeout
        seen = len(self.messages)
        if self._idle_in(self.messages, msg_id):
            return
        while True:  # each message read is checked once (a cell that opens thousands of comms stays linear)
            if time.monotonic() > end:
                what = f"no message for {timeout} s" if from_last else f"in {timeout} s"
                raise AssertionError(f"no idle status after {msg_id} {what} ({len(self.messages) - seen} new)")
            try:
                msg = self.kc.get_iopub_msg(timeout=0.1)
            except queue.Empty:
                continue
            self.messages.append(msg)
            if from_last:
                end = time.monotonic() + timeout
            if self._idle_in([msg], msg_id):
                return

    @staticmethod
    def _idle_in(messages: list[dict[str, Any]], msg_id: str) -> bool:
        return any(
            m["msg_type"] == "status"
            and m["parent_header"].get("msg_id") == msg_id
            and m["content"].get("execution_state") == "idle"
            for m in messages
        )

    def run(self, code: str, timeout: float = 120) -> str:
        msg_id = self.kc.execute(code)
        self.reply(msg_id, timeout)
        self.idle(msg_id)
        return self.stdout(msg_id)

    def stdout(self, msg_id: str) -> str:
        return "".join(
            m["content"]["text"]
            for m in self.messages
            if m["msg_type"] == "stream" and m["parent_header"].get("msg_id") == msg_id
        )

    def click(self, model_id: str) -> None:
        """What a front end sends when a Button is clicked."""
        content = {"comm_id": model_id, "data": {"method": "custom", "content": {"event": "click"}}}
        self.kc.shell_channel.send(self.kc.session.msg("comm_msg", content))

    def values(self, model_id: str) -> list[tuple[float, str]]:
        """(arrival time, value) of every ``value`` update the kernel sent for a widget."""
        out = []
        for m in self.messages:
            if m["msg_type"] == "comm_msg" and m["content"].get("comm_id") == model_id:
                state = m["content"]["data"].get("state") or {}
                if "value" in state:
                    out.append((m["_t"], state["value"]))
        return out

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


def _step(text: str) -> int:
    m = re.search(r"step ([\d,]+)", text)
    return int(m.group(1).replace(",", "")) if m else 0


@pytest.fixture
def kernel(venv_kernelspec: Any) -> Any:
    k = Kernel()
    original = k.kc.get_iopub_msg

    def stamped(*a: Any, **kw: Any) -> dict[str, Any]:
        msg = original(*a, **kw)
        msg["_t"] = time.monotonic()
        return msg

    k.kc.get_iopub_msg = stamped
    try:
        yield k
    finally:
        k.close()


def _wait_step(kernel: Kernel, info_id: str, at_least: int, stalled: float = 60.0) -> None:
    """Pump iopub until the panel's progress shows step ``at_least``; fail once the step has not moved for
    ``stalled`` seconds (a stuck run), however long a loaded machine takes to get there (a slow one)."""
    end, last = time.monotonic() + stalled, 0
    while time.monotonic() < end:
        kernel.pump(0.1)
        step = max([_step(v) for _, v in kernel.values(info_id)] or [0])
        if step >= at_least:
            return
        if step > last:
            end, last = time.monotonic() + stalled, step
    raise AssertionError(f"the run did not move past step {last} (of {at_least}) in {stalled} s")


def _wait_status(kernel: Kernel, status_id: str, word: str, timeout: float = 15.0) -> float:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        kernel.pump(0.1)
        hits = [t for t, v in kernel.values(status_id) if f"nbt-status-{word}" in v]
        if hits:
            return hits[0]
    raise AssertionError(f"status {word!r} never shown; statuses: {[v[-80:] for _, v in kernel.values(status_id)]}")


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_pause_resume_stop_clicks_work_while_a_cell_blocks_in_fit(kernel: Kernel) -> None:
    ids = kernel.run(SETUP).split("IDS", 1)[1].split()
    pause_id, stop_id, status_id, info_id = ids
    fit_id = kernel.kc.execute("h = w.fit()\nprint('RESULT', h.status, w.trainer.global_step, len(h.epochs))")
    _wait_step(kernel, info_id, 5)

    # Pause: "paused" is shown only once the loop holds; from then on the step shown does not move
    kernel.click(pause_id)
    paused_at = _wait_status(kernel, status_id, "paused")
    kernel.pump(1.5)
    after = [(t, _step(v)) for t, v in kernel.values(info_id) if t >= paused_at]
    held = [s for _, s in after]
    assert len(set(held)) <= 1, f"progress moved while paused: {held}"

    # Resume: running again, the step grows
    kernel.click(pause_id)  # the same button reads "Resume" now
    resumed_at = _wait_status(kernel, status_id, "running")
    kernel.pump(1.0)
    later = [_step(v) for t, v in kernel.values(info_id) if t >= resumed_at]
    assert later and max(later) > max(held or [0]), (held, later)

    # Stop: the blocking cell returns the History, status "stopped", long before the 50 epochs
    kernel.click(stop_id)
    kernel.reply(fit_id, timeout=30)
    kernel.idle(fit_id)
    result = kernel.stdout(fit_id).split()
    assert result[:2] == ["RESULT", "stopped"], result
    assert int(result[3]) < 50
    stopped_at = _wait_status(kernel, status_id, "stopped", timeout=30)  # a deadline: the message is on its way
    final = [_step(v) for t, v in kernel.values(info_id) if t <= stopped_at][-1]
    assert final == int(result[2]), "the last step drawn before 'stopped' is the step the run ended on"
    # the kernel is free for the next cell at once
    assert kernel.run("print('next', w.status)").split() == ["next", "stopped"]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_kernel_interrupt_stops_the_run_and_the_cell_returns_the_history(kernel: Kernel) -> None:
    ids = kernel.run(SETUP).split("IDS", 1)[1].split()
    fit_id = kernel.kc.execute("h = w.fit()\nprint('RESULT', h.status, h.stop_reason)")
    _wait_step(kernel, ids[3], 5)
    kernel.km.interrupt_kernel()  # Kernel > Interrupt
    kernel.reply(fit_id, timeout=30)
    kernel.idle(fit_id)
    out = kernel.stdout(fit_id)
    assert out.startswith("RESULT stopped") and "KeyboardInterrupt" in out, out
    assert kernel.run("print(w.trainer.status, len(w.trainer.active()))").split() == ["stopped", "0"]


def _second_client(kernel: Kernel) -> Any:
    """A new front end on the same kernel (a reloaded page): its own session, channels started.

    Not ``km.client()``: that shares the first client's session, hence its socket identity, and the kernel's
    replies to the first client would reach this one."""
    kc = jupyter_client.BlockingKernelClient(connection_file=kernel.km.connection_file)
    kc.load_connection_file()
    kc.start_channels()
    return kc


def _update_states(kc: Any, timeout: float) -> dict[str, Any] | None:
    """The widget states the kernel sends back for the control comm's request_states (None if none came)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with contextlib.suppress(queue.Empty):
            m = kc.get_iopub_msg(timeout=0.2)
            data = m["content"].get("data") or {}
            if m["msg_type"] == "comm_msg" and data.get("method") == "update_states":
                return data["states"]
    return None


def _shell_reply(kc: Any, msg_id: str, timeout: float) -> dict[str, Any]:
    end = time.monotonic() + timeout
    while True:
        msg = kc.get_shell_msg(timeout=max(0.05, end - time.monotonic()))
        if msg["parent_header"].get("msg_id") == msg_id:
            return msg


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_page_reloaded_while_a_cell_blocks_in_fit_gets_the_panel_back(kernel: Kernel) -> None:
    """What JupyterLab asks after a reload (kernel_info, comm_info, the widget manager's control comm and its
    request_states) is answered while ``w.fit()`` blocks; a Stop sent from the new page ends the run."""
    ids = kernel.run(SETUP).split("IDS", 1)[1].split()
    stop_id, info_id = ids[1], ids[3]
    # 5,000 epochs: the run ends only by the Stop below, so "stopped" proves every answer came during the cell
    fit_id = kernel.kc.execute("w.view.epochs.value = 5000\nh = w.fit()\nprint('RESULT', h.status)")
    _wait_step(kernel, info_id, 5)
    kc = _second_client(kernel)
    try:
        info = _shell_reply(kc, kc.kernel_info(), timeout=30)
        assert info["msg_type"] == "kernel_info_reply" and info["content"]["status"] == "ok"
        comms = _shell_reply(kc, kc.comm_info(target_name="jupyter.widget"), timeout=30)
        assert stop_id in comms["content"]["comms"], "the panel's widgets are listed"
        # the widget manager's state restore: open its control comm, ask for every state
        control = "nbt-test-control"
        kc.shell_channel.send(
            kc.session.msg(
                "comm_open",
                {"comm_id": control, "target_name": "jupyter.widget.control", "data": {}},
                metadata={"version": "1.0.0"},
            )
        )
        kc.shell_channel.send(kc.session.msg("comm_msg", {"comm_id": control, "data": {"method": "request_states"}}))
        states = _update_states(kc, timeout=30)
        assert states is not None and stop_id in states, "the widget states came back while the cell blocks"
        # the new page's Stop ends the run; the cell (still the first page's) returns the History
        click = {"comm_id": stop_id, "data": {"method": "custom", "content": {"event": "click"}}}
        kc.shell_channel.send(kc.session.msg("comm_msg", click))
        _wait_status(kernel, ids[2], "stopped", timeout=30)
        kernel.reply(fit_id, timeout=30)
        kernel.idle(fit_id)
        assert kernel.stdout(fit_id).split()[:2] == ["RESULT", "stopped"]
    finally:
        kc.stop_channels()


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_control_comm_opened_while_the_subshell_is_busy_logs_no_missing_comm(kernel: Kernel) -> None:
    """A reloaded page opens the widget manager's control comm and asks for the states at once. While the cell
    waits, both go to nbtrainer's subshell, in order; but the kernel's shell channel thread looks the comm up
    (to route the ``comm_msg``) before that subshell has handled the ``comm_open``, and logs "No such comm".
    The message is delivered all the same, so that warning is false, and a user saw it as red text in the
    cell. Here the subshell is held busy by a slow click handler, so the lookup always comes first."""
    ids = kernel.run(
        SETUP + "import ipywidgets\nslow = ipywidgets.Button()\n"
        "slow.on_click(lambda b: time.sleep(1.0))\nprint('SLOW', slow.model_id)\n"
    )
    slow_id = ids.split("SLOW", 1)[1].split()[0]
    info_id = ids.split("IDS", 1)[1].split()[3]
    stop_id = ids.split("IDS", 1)[1].split()[1]
    # 5,000 epochs: the run ends only by the Stop below, whatever the machine's load
    fit_id = kernel.kc.execute("w.view.epochs.value = 5000\nh = w.fit()\nprint('RESULT', h.status)")
    _wait_step(kernel, info_id, 5)
    kc = _second_client(kernel)
    try:
        control = "nbt-test-control-busy"
        send = kc.shell_channel.send
        send(
            kc.session.msg(
                "comm_msg", {"comm_id": slow_id, "data": {"method": "custom", "content": {"event": "click"}}}
            )
        )
        send(
            kc.session.msg(
                "comm_open",
                {"comm_id": control, "target_name": "jupyter.widget.control", "data": {}},
                metadata={"version": "1.0.0"},
            )
        )
        send(kc.session.msg("comm_msg", {"comm_id": control, "data": {"method": "request_states"}}))
        states = _update_states(kc, timeout=30)
        assert states is not None and stop_id in states, "the request behind the comm_open was answered"
        kernel.click(stop_id)
        kernel.reply(fit_id, timeout=30)
        kernel.idle(fit_id)
        streams = [m["content"]["text"] for m in kernel.messages if m["msg_type"] == "stream"]
        assert not [s for s in streams if "No such comm" in s], streams
        assert kernel.stdout(fit_id).split()[:2] == ["RESULT", "stopped"]
    finally:
        kc.stop_channels()


BUSY = """
import ipywidgets, threading
from nbtrainer import TrainerWidget
# a notebook's earlier panels: ipywidgets never drops a comm. Where the waiting cell routes comms (ipykernel 7's
# subshells) 2,500 of them; ipykernel 6 sends each comm_open through its iopub thread, about 50 a second on a loaded
# machine, so there a crowd of 200 (its wait is jupyter-ui-poll's, which routes nothing)
subshells = getattr(get_ipython().kernel, "_supports_kernel_subshells", False)
crowd = [ipywidgets.Label() for _ in range(2500 if subshells else 200)]
torch.manual_seed(0)
xb, yb = torch.randn(2048, 64), torch.randint(0, 3, (2048,))
busy_model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 3))
made = []

class Meter:  # CPU seconds of the training thread and of the waiting cell's, and a button made while it waits
    def on_fit_start(self, trainer):
        self.main = time.pthread_getcpuclockid(threading.main_thread().ident)
        self.t0, self.m0 = time.thread_time(), time.clock_gettime(self.main)
    def on_optimizer_step(self, trainer, step, skipped):
        if step == 20:
            b = ipywidgets.Button(description="meter stop")  # told apart from the panel's own (areas made as they show)
            b.on_click(lambda _: bw.stop())
            made.append(b)
    def on_fit_end(self, trainer, history):
        self.ratio = (time.clock_gettime(self.main) - self.m0) / (time.thread_time() - self.t0)

meter = Meter()
bw = TrainerWidget(busy_model, nn.CrossEntropyLoss(), torch.optim.SGD(busy_model.parameters(), lr=0.01),
                   DataLoader(TensorDataset(xb, yb), batch_size=16), epochs=400, callbacks=[meter],
                   progress=False)
print("IDS", bw.view.progress_info.model_id)
"""


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_waiting_cell_costs_no_cpu_however_many_widgets_the_notebook_holds(kernel: Kernel) -> None:
    """The cell blocked in ``w.fit()`` sleeps while the training thread works, even with 2,500 widgets (5 earlier
    panels' worth) in an ipykernel 7 kernel: rescanning every comm each 50 ms to route it took the main thread as
    much CPU as the training thread after 40 panels (w.fit() 2-3x slower). A button made by the training thread
    while the cell waits is still routed: its click stops the run long before its 400 epochs."""
    setup_id = kernel.kc.execute(SETUP + BUSY)
    # read while the cell runs: thousands of comm_opens would overflow iopub's queue otherwise. It streams 8,500
    # messages: two fresh-clone suites and two CPU burners on the 2 cores took it past a fixed 120 s while they flowed
    kernel.idle(setup_id, timeout=60, from_last=True)
    kernel.reply(setup_id, timeout=30)
    info_id = kernel.stdout(setup_id).rsplit("IDS", 1)[-1].split()[0]  # the busy panel's (SETUP prints one too)
    fit_id = kernel.kc.execute("h = bw.fit()\nprint('RESULT', h.status, bw.trainer.global_step, round(meter.ratio, 4))")
    _wait_step(kernel, info_id, 3000)  # seconds of training (about 60 waits of the cell); the button exists
    made = [
        m["content"]["comm_id"]
        for m in kernel.messages
        if m["msg_type"] == "comm_open" and m["content"]["data"].get("state", {}).get("_model_name") == "ButtonModel"
        and m["content"]["data"]["state"].get("description") == "meter stop"
        and m["parent_header"].get("msg_id") == fit_id
    ]  # fmt: skip
    assert made, "the training thread's button was announced"
    kernel.click(made[-1])
    kernel.reply(fit_id, timeout=60)
    kernel.idle(fit_id)
    result = kernel.stdout(fit_id).split()
    assert result[:2] == ["RESULT", "stopped"], result
    assert int(result[2]) < 400 * 128, "the click was handled while the cell waited"
    # the waiting cell's CPU against the training thread's, while the run trained (the rescan: 0.23-0.25)
    assert float(result[3]) < 0.05, result


def _shell_replies_until(kc: Any, last_id: str, timeout: float) -> list[dict[str, Any]]:
    """Every shell reply ``kc`` gets up to and including the reply to ``last_id`` (the kernel answers a client's
    requests in order, so a request sent before ``last_id`` and not answered by then is not answered)."""
    end, out = time.monotonic() + timeout, list[dict[str, Any]]()
    while not out or out[-1]["parent_header"].get("msg_id") != last_id:
        out.append(kc.get_shell_msg(timeout=max(0.05, end - time.monotonic())))
    return out


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_pages_late_widget_restore_cannot_take_the_panel_over(kernel: Kernel) -> None:
    """ipywidgets 7 (Colab's stack, classic Notebook 6.5): a page whose widget manager asks ``comm_info`` after its
    own cells made the panel (its control comm timed out behind a slow first cell) would take over the comms of
    widgets it already has and re-render their output away (``widgets/_restore``). The kernel leaves that request
    unanswered; a new page (a reload) is still told every widget, and other targets are answered as before."""
    ipywidgets = pytest.importorskip("ipywidgets")
    if not ipywidgets.__version__.startswith("7."):
        pytest.skip("the guard is for ipywidgets 7's classic widget manager (the colab profile)")
    status_id = kernel.run(SETUP).split("IDS", 1)[1].split()[2]
    kc = kernel.kc  # the page that ran the cell
    late = kc.comm_info(target_name="jupyter.widget")
    other = kc.comm_info(target_name="jupyter.widget.control")
    replies = _shell_replies_until(kc, kc.kernel_info(), timeout=30)
    answered = {r["parent_header"]["msg_id"]: r for r in replies}
    assert late not in answered, "the late restore was answered: it would take the panel's comms over"
    assert answered[other]["content"]["status"] == "ok"
    reloaded = _second_client(kernel)  # a reloaded page: it needs the widgets made before it connected
    try:
        comms = _shell_reply(reloaded, reloaded.comm_info(target_name="jupyter.widget"), timeout=30)
        assert status_id in comms["content"]["comms"]
        # once that page has made widgets of its own, its late restore goes unanswered too
        code = "import ipywidgets\nmore = ipywidgets.HTML('x')\nprint('MORE', more.model_id)"
        _shell_reply(reloaded, reloaded.execute(code), timeout=30)
        again = reloaded.comm_info(target_name="jupyter.widget")
        replies = _shell_replies_until(reloaded, reloaded.kernel_info(), timeout=30)
        assert again not in {r["parent_header"]["msg_id"] for r in replies}
    finally:
        reloaded.stop_channels()


FLOOD = """
import sys, threading, ipywidgets
_made, _stop = [], threading.Event()
def _open_and_close():  # what a panel's helper thread does when it shows the LR finder's result, without end
    while not _stop.is_set():
        _made.append(ipywidgets.HTML("x"))
        if len(_made) > 50:
            _made.pop(0).close()
_flood = threading.Thread(target=_open_and_close, daemon=True)
sys.setswitchinterval(1e-6)  # the threads take turns every few bytecodes: the race, whenever it can happen
_flood.start()
"""


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_comm_info_is_answered_while_another_thread_opens_and_closes_comms(kernel: Kernel) -> None:
    """ipykernel lists the comms for ``comm_info`` with a comprehension over its dict of comms; a widget made or
    closed by another thread meanwhile changed the dict's size, the handler raised and the page never got its answer
    (a loaded trial's reload check waited 30 s). The panel's guard (``widgets/_restore``) lists them again. The
    requests ask for every target: on ipywidgets 7 the guard leaves a ``jupyter.widget`` request from a page whose
    session has seen widgets made since unanswered on purpose (its late restore), and the flood makes them always."""
    kernel.run(SETUP)  # a panel: its guard is installed
    kernel.run(FLOOD)
    kc = kernel.kc
    try:
        for i in range(30):
            try:
                reply = _shell_reply(kc, kc.comm_info(), timeout=15)
            except queue.Empty:
                raise AssertionError(f"comm_info request {i + 1} of 30 was never answered") from None
            assert reply["content"]["status"] == "ok" and reply["content"]["comms"]
    finally:
        kernel.run("_stop.set(); _flood.join(); sys.setswitchinterval(0.005); print(len(_made))", timeout=120)
