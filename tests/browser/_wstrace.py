"""The kernel messages a page sends and receives, as one line each: what a widget restore asked and got, and when.

``NBT_WS_TRACE=1`` makes the ``page`` fixture record every kernel websocket frame of the page (Jupyter's
``v1.kernel.websocket.jupyter.org`` binary frames, or the older JSON text frames) and write them to
``test-artifacts/<test>-ws.log`` when the test fails. A line reads::

    12.345 < iopub comm_msg id=ab12 parent=cd34 comm=ef56 method=update_states states=518

``>`` is page to kernel, ``<`` kernel to page; times are seconds since the page opened. Decoding happens when the
log is written, not per frame, so a trace costs the running test only a list append per frame.
"""

from __future__ import annotations

import collections
import json
import struct
import time
from pathlib import Path
from typing import Any

# The page's side of a restore (JupyterLab): every kernel connection it holds, and whether each handles comms. The
# services' KernelManager gives comms only to the first connection to a kernel (``connectTo``: a later one gets
# ``handleComms: false``), and a widget manager whose notebook holds such a connection "restores" nothing and reports
# success, so every widget output then says "model not found". The sessions the server lists show the other way there:
# a notebook attached to a kernel other than the one its session names (a new kernel has no widgets). Read for a
# failure's report (the reload test prints a healthy page's too); private names, best effort.
PAGE_CONNECTIONS = """() => {
    const app = window.jupyterapp;
    if (!app) return 'no jupyterapp on the page';
    const km = app.serviceManager && app.serviceManager.kernels;
    const conns = Array.from((km && km._kernelConnections) || []).map(k => ({
        id: k.id, clientId: k.clientId, handleComms: k.handleComms,
        connection: k.connectionStatus, status: k.status, disposed: k.isDisposed}));
    const w = app.shell.currentWidget;
    const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
    const sm = app.serviceManager.sessions;
    const sessions = Array.from((sm && sm.running()) || []).map(s => ({path: s.path, kernel: s.kernel && s.kernel.id}));
    const text = document.body.innerText;
    return JSON.stringify({
        sessions: sessions,
        connections: conns,
        notebook: k ? {id: k.id, clientId: k.clientId, handleComms: k.handleComms} : null,
        loading_widget: (text.match(/Loading widget/g) || []).length,
        model_not_found: (text.match(/model not found/g) || []).length});
}"""


def _parts(payload: bytes | str) -> tuple[str, dict, dict, dict] | None:
    """(channel, header, parent_header, content) of one frame, or None where it is not a kernel message."""
    if isinstance(payload, str):
        try:
            msg = json.loads(payload)
        except ValueError:
            return None
        return msg.get("channel", "?"), msg.get("header", {}), msg.get("parent_header", {}), msg.get("content", {})
    if len(payload) < 8:
        return None
    (count,) = struct.unpack_from("<Q", payload, 0)
    if not 5 <= count <= 1000 or 8 + 8 * count > len(payload):
        return None
    offsets = [*struct.unpack_from(f"<{count}Q", payload, 8), len(payload)]
    chunks = [payload[offsets[i] : offsets[i + 1]] for i in range(count)]
    try:
        channel = chunks[0].decode()
        header, parent, _meta, content = (json.loads(c or b"{}") for c in chunks[1:5])
    except ValueError:
        return None
    return channel, header, parent, content


def describe(payload: bytes | str) -> str:
    parts = _parts(payload)
    if parts is None:
        return f"(not a kernel message, {len(payload)} bytes)"
    channel, header, parent, content = parts
    words = [channel, str(header.get("msg_type")), f"id={str(header.get('msg_id', ''))[-8:]}"]
    if parent.get("msg_id"):
        words.append(f"parent={str(parent['msg_id'])[-8:]}")
    if header.get("subshell_id"):
        words.append(f"subshell={str(header['subshell_id'])[-6:]}")
    if not isinstance(content, dict):
        return " ".join(words)
    for key in ("comm_id", "target_name", "execution_state", "status"):
        if content.get(key):
            words.append(f"{key}={str(content[key])[-12:]}")
    if isinstance(content.get("comms"), dict):
        words.append(f"comms={len(content['comms'])}")
    data = content.get("data")
    if isinstance(data, dict):
        if data.get("method"):
            words.append(f"method={data['method']}")
        if isinstance(data.get("states"), dict):
            words.append(f"states={len(data['states'])}")
        if isinstance(data.get("state"), dict) and data["state"].get("_model_name"):
            words.append(f"model={data['state']['_model_name']}")
    if content.get("ename"):
        words.append(f"error={content['ename']}: {str(content.get('evalue'))[:200]}")
    return " ".join(words)


class Trace:
    """Frames of every kernel websocket a page opens (``page.on("websocket", trace.attach)``)."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.frames: list[tuple[float, str, Any]] = []

    def attach(self, ws: Any) -> None:
        if "/api/kernels/" not in ws.url:
            return
        self.frames.append((time.monotonic() - self.t0, "=", f"websocket opened {ws.url.rsplit('/', 2)[-2]}"))
        ws.on("framesent", lambda p: self.frames.append((time.monotonic() - self.t0, ">", p)))
        ws.on("framereceived", lambda p: self.frames.append((time.monotonic() - self.t0, "<", p)))
        ws.on("close", lambda _ws: self.frames.append((time.monotonic() - self.t0, "=", "websocket closed")))

    def lines(self) -> list[str]:
        return [f"{t:9.3f} {d} {p if d == '=' else describe(p)}" for t, d, p in self.frames]

    def summary(self, limit: int = 80) -> str:
        """What a widget restore turns on, for a failure report: each websocket's opening and closing, kernel_info,
        comm_info, the control comm's request and answer, the comms the page opened and any comm closed, subshells
        made and deleted, a kernel's restart and errors, one line each (at most ``limit``), then every message kind
        counted with its first and last time."""
        keep = (
            "websocket",
            "kernel_info",
            "comm_info",
            "comm_open",
            "comm_close",
            "subshell_",
            "request_states",
            "update_states",
            "error",
            "restarting",
            "starting",
            "dead",
        )
        shown: list[str] = []
        counts: collections.Counter[str] = collections.Counter()
        first: dict[str, str] = {}
        last: dict[str, str] = {}
        for line in self.lines():
            words = line.split()
            kind = " ".join(words[1:4] if words[1] != "=" else words[1:3])
            kind += "".join(f" {w}" for w in words if w.startswith("method="))
            counts[kind] += 1
            first.setdefault(kind, words[0])
            last[kind] = words[0]
            if any(k in line for k in keep) and not (" < " in line and " comm_open " in line):  # the kernel's: counted
                shown.append(line)
        cut = f"\n[... {len(shown) - limit} more such lines in the -ws.log]" if len(shown) > limit else ""
        table = "\n".join(f"{n:6d} {k} (first {first[k]}, last {last[k]})" for k, n in counts.most_common(25))
        return "[kernel messages a restore turns on]\n" + "\n".join(shown[:limit]) + cut + "\n[counted]\n" + table

    @staticmethod
    def page_connections(page: Any) -> str:
        """The page's kernel connections (:data:`PAGE_CONNECTIONS`), one JSON line, or why they could not be read."""
        try:
            return "[the page's kernel connections] " + str(page.evaluate(PAGE_CONNECTIONS))
        except Exception as exc:  # a page that crashed or navigated away: the report goes on without it
            return f"[the page's kernel connections] not read: {type(exc).__name__}: {exc}"

    def write(self, path: Path) -> Path:
        path.write_text("\n".join(self.lines()) + "\n")
        return path
