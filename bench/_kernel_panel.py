"""The panel in a real Jupyter kernel (issue 49): a headless fit, ``w.fit()`` and Start, alternated in one kernel.

A kernel is started on this interpreter (no ``OMP_NUM_THREADS``: torch's default intra-op threads) and driven over
the Jupyter protocol as a front end drives it. Each round runs, in rotated order:

* ``headless``: ``Trainer(...).fit(...)`` in a cell (the kernel's main thread trains);
* ``w.fit()``: ``TrainerWidget(...).fit()`` in a cell (the cell blocks, the panel's thread trains, its messages are
  answered beside the cell);
* ``Start``: ``w.start()`` in a cell that returns at once; the client then only reads the kernel's messages until
  the panel's status says ``finished`` (the kernel's main thread is idle, as after a click on Start);
* ``thread``: the headless fit in ``nbtrainer.start_training_thread``, joined by the cell: the training thread
  without the panel, which tells the thread's cost from the panel's (its UI thread and messages).

Each fit is timed inside the kernel by a callback (``on_fit_start`` to ``on_fit_end``), so the figures are the
training's own time per step, not the protocol's; the threads of the kernel process are counted at the fit's end,
and so are the page faults per step (the training thread allocates from its own malloc arena).
"""

from __future__ import annotations

import json
import os
import queue
import statistics
import sys
import tempfile
import time
from typing import Any

from _rounds import interleaved, spread

BENCH = os.path.dirname(os.path.abspath(__file__))

SETUP = """
import json, os, resource, sys, time, torch
sys.path.insert(0, {bench!r})
import overhead
from nbtrainer import Trainer, TrainerWidget
if {before!r}:  # the panel as it was before issue 49: the kernel thread keeps its idle OpenMP pool
    import nbtrainer._threads as _t
    _t.release_openmp_pool = lambda: False
W = overhead.workloads({scale!r})

class Clock:
    def on_fit_start(self, trainer):
        self.faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        self.t0 = time.perf_counter()
    def on_fit_end(self, trainer, history):
        self.seconds = time.perf_counter() - self.t0
        self.faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - self.faults
        self.threads = len(os.listdir("/proc/self/task"))

def report(clock, w):
    res = {{"s_per_step": clock.seconds / w.steps, "threads": clock.threads, "faults": clock.faults / w.steps}}
    print("RESULT", json.dumps(res))

def panel(w, clock):
    model, opt, crit = w.fresh()
    return TrainerWidget(model, crit, opt, w.data, epochs=1, progress=False, callbacks=[clock])
print("threads", torch.get_num_threads(), "torch", torch.__version__)
"""

HEADLESS = """
w, clock = W[{key!r}], Clock()
model, opt, crit = w.fresh()
Trainer(model, crit, opt, progress=False, callbacks=[clock]).fit(w.data, epochs=1)
report(clock, w)
"""

FIT = """
w, clock = W[{key!r}], Clock()
h = panel(w, clock).fit()
assert h.status == "finished", h.status
report(clock, w)
"""

THREAD = """
from nbtrainer import start_training_thread
w, clock = W[{key!r}], Clock()
model, opt, crit = w.fresh()
trainer = Trainer(model, crit, opt, progress=False, callbacks=[clock])
start_training_thread(trainer.fit, args=(w.data,), kwargs={{"epochs": 1}}).join()
report(clock, w)
"""

START_MAKE = """
w, clock = W[{key!r}], Clock()
p = panel(w, clock)
display(p)
print("STATUS", p.view.status.model_id)
"""


class Kernel:
    """A kernel on this interpreter and a blocking client; every iopub message is read (and kept per request)."""

    def __init__(self) -> None:
        import jupyter_client

        self._dir = tempfile.TemporaryDirectory(prefix="nbt-bench-kernel-")
        spec = os.path.join(self._dir.name, "share", "kernels", "python3")
        os.makedirs(spec)
        with open(os.path.join(spec, "kernel.json"), "w") as fh:
            argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
            json.dump({"argv": argv, "display_name": "bench", "language": "python"}, fh)
        env = {"JUPYTER_PATH": os.path.join(self._dir.name, "share"), "JUPYTER_PLATFORM_DIRS": "1"}
        os.environ.update(env)
        os.environ.pop("OMP_NUM_THREADS", None)
        self.km, self.kc = jupyter_client.manager.start_new_kernel(kernel_name="python3", startup_timeout=120)
        self.values: list[tuple[str, str]] = []  # (comm id, value) of every widget value update read so far

    def _keep(self, m: dict[str, Any]) -> None:
        if m["msg_type"] == "comm_msg":
            value = (m["content"]["data"].get("state") or {}).get("value")
            if value is not None:
                self.values.append((m["content"].get("comm_id"), str(value)))

    def run(self, code: str, timeout: float = 600) -> str:
        """Execute ``code``; its stdout once the kernel is idle again (an error raises)."""
        msg_id = self.kc.execute(code)
        out, end = [], time.monotonic() + timeout
        while True:
            try:
                m = self.kc.get_iopub_msg(timeout=max(0.05, end - time.monotonic()))
            except queue.Empty as exc:
                raise TimeoutError(f"no end of {code[:60]!r} in {timeout} s") from exc
            self._keep(m)
            if m["parent_header"].get("msg_id") != msg_id:
                continue
            kind = m["msg_type"]
            if kind == "stream":
                out.append(m["content"]["text"])
            elif kind == "error":
                raise RuntimeError("\n".join(m["content"]["traceback"]))
            elif kind == "status" and m["content"]["execution_state"] == "idle":
                return "".join(out)

    def wait_status(self, model_id: str, word: str, timeout: float = 600) -> None:
        """Read iopub until the widget ``model_id`` is sent a value containing ``nbt-status-<word>``."""
        end, seen = time.monotonic() + timeout, 0
        while time.monotonic() < end:
            # only the values read since the last look: rescanning them all made this client a CPU load of its
            # own beside the kernel it times (quadratic in a run's updates)
            if any(c == model_id and f"nbt-status-{word}" in v for c, v in self.values[seen:]):
                return
            seen = len(self.values)
            try:
                self._keep(self.kc.get_iopub_msg(timeout=0.2))
            except queue.Empty:
                continue
        raise TimeoutError(f"the panel never showed {word!r}")

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)
        self._dir.cleanup()


def _result(text: str) -> dict[str, Any]:
    return json.loads(text.split("RESULT", 1)[1].strip().splitlines()[0])


def measure(workloads: list[str], rounds: int, scale: float, before: bool) -> list[dict[str, Any]]:
    """Per workload: the median seconds per step and the threads of each variant, in one kernel."""
    kernel = Kernel()
    try:
        print("#", kernel.run(SETUP.format(bench=BENCH, before=before, scale=scale)).strip(), flush=True)
        rows = []
        for key in workloads:
            threads: dict[str, int] = {}
            faults: dict[str, list[float]] = {}

            def run(name: str, key: str = key, threads: dict[str, int] = threads, faults=faults) -> float:
                if name == "headless":
                    res = _result(kernel.run(HEADLESS.format(key=key)))
                elif name == "thread":
                    res = _result(kernel.run(THREAD.format(key=key)))
                elif name == "w.fit()":
                    res = _result(kernel.run(FIT.format(key=key)))
                else:  # Start: the cell returns at once; the client waits for the panel to say "finished"
                    status_id = kernel.run(START_MAKE.format(key=key)).split("STATUS", 1)[1].split()[0]
                    kernel.run("p.start()")
                    kernel.wait_status(status_id, "finished")
                    res = _result(kernel.run("p.wait(); report(clock, w)"))
                threads[name] = res["threads"]
                faults.setdefault(name, []).append(res["faults"])
                return float(res["s_per_step"])

            res = interleaved(run, ["headless", "thread", "w.fit()", "Start"], rounds)
            row = {"workload": key, "threads": dict(threads)}
            row["faults"] = {name: statistics.median(v) for name, v in faults.items()}
            row.update({name: statistics.median(values) for name, values in res.items()})
            # each round's variants against that round's headless fit (the same minute of the machine's load)
            row["spread"] = {
                name: spread([v / b for v, b in zip(res[name], res["headless"], strict=True)]) for name in res
            }
            rows.append(row)
        return rows
    finally:
        kernel.close()


def table(rows: list[dict[str, Any]], label: str) -> None:
    names = ("headless", "thread", "w.fit()", "Start")
    print(
        f"| {label} | headless ms/step | thread / headless: median [IQR] of paired rounds | w.fit() / headless | "
        "Start / headless | "
        "threads at fit end: headless / thread / w.fit() / Start | page faults per step (same order) |"
    )
    print("|---|---:|---:|---:|---:|---|---|")
    for r in rows:
        base = r["headless"]
        threads = " / ".join(str(r["threads"][n]) for n in names)
        faults = " / ".join(f"{r['faults'][n]:.0f}" for n in names)
        cells = " | ".join(r["spread"][n] for n in ("thread", "w.fit()", "Start"))
        print(f"| {r['workload']} | {base * 1e3:.4f} | {cells} | {threads} | {faults} |", flush=True)
