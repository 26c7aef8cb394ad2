"""nbtrainer.launch(fn, nprocs=2, view=...) (issue 23): rank 0's progress reaches the launching process while two
real gloo ranks train, and a stop requested there ends both ranks after the same optimizer step, with the same
weights. Each launch runs in a subprocess (as a notebook's kernel would run it), with a timeout: a rank left
waiting in a collective fails the test instead of hanging it."""

from __future__ import annotations

import json
import os
import sys
import textwrap

import pytest
import torch.distributed as dist
from _launch import run_group

if not (dist.is_available() and dist.is_gloo_available()):  # pragma: no cover - depends on the torch build
    pytest.skip("torch.distributed with the gloo backend is not available", allow_module_level=True)


SCRIPT = textwrap.dedent("""
    import json, sys
    import torch
    import nbtrainer
    from nbtrainer import LaunchMonitor, Trainer

    EPOCHS = 400  # 64 steps per rank and epoch: 25600 steps if nothing stops it

    def train():
        import torch.distributed as dist
        torch.manual_seed(0)
        model = torch.nn.Linear(8, 1)
        x = torch.randn(512, 8); y = x.sum(1, keepdim=True)
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=4)
        trainer = Trainer(model, torch.nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.01),
                          progress=False, seed=0, refresh_interval=0.02)
        history = trainer.fit(loader, epochs=EPOCHS)
        return {"rank": dist.get_rank(), "status": history.status, "reason": history.stop_reason,
                "step": trainer.progress.global_step, "weight": trainer.model_state_dict()["weight"].tolist()}

    def make_view(kind):
        base = LaunchMonitor
        if kind == "widget":
            from nbtrainer.widgets import LaunchView as base

        class Stopper(base):
            def on_progress(self, snapshot):
                super().on_progress(snapshot)
                if snapshot["global_step"] >= 40 and not self.stop_requested:
                    self.stop_button.click() if kind == "widget" else self.request_stop()

        return Stopper()

    if __name__ == "__main__":
        view = make_view(sys.argv[1])
        results = nbtrainer.launch(train, nprocs=2, view=view)
        out = {"results": results, "steps": [s["global_step"] for s in view.snapshots],
               "ranks": sorted({s["rank"] for s in view.snapshots}), "world": view.snapshots[0]["world_size"],
               "final": view.final}
        if sys.argv[1] == "widget":
            out["widget"] = {"status": view.last_status, "points": len(view._line.x),
                             "stop_disabled": view.stop_button.disabled, "info": view.info.value}
        print("RESULT", json.dumps(out))
""")


def _run(tmp_path, kind: str) -> dict:
    script = tmp_path / "launch_view.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", NBTRAINER_FRONTEND="console")
    proc = run_group([sys.executable, str(script), kind], what="the launch", cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


def _check_stopped_together(out: dict) -> None:
    r0, r1 = out["results"]
    assert (r0["rank"], r1["rank"]) == (0, 1)
    # the channel: rank 0's snapshots only, in order, while the ranks trained
    assert out["ranks"] == [0] and out["world"] == 2
    assert len(out["steps"]) >= 3 and out["steps"] == sorted(out["steps"])
    # the stop: both ranks after the same optimizer step, long before the end, the same weights
    assert r0["status"] == r1["status"] == "stopped"
    assert r0["reason"] == r1["reason"] == "stopped from the launching process"
    assert r0["step"] == r1["step"] and 40 < r0["step"] < 400 * 64
    assert r0["weight"] == r1["weight"]
    assert out["final"]["status"] == "stopped" and out["final"]["global_step"] == r0["step"]


def test_launch_monitor_receives_progress_and_stops_every_rank(tmp_path) -> None:
    _check_stopped_together(_run(tmp_path, "monitor"))


def test_launch_view_stop_button_stops_every_rank(tmp_path) -> None:
    pytest.importorskip("ipywidgets")
    pytest.importorskip("bqplot")
    out = _run(tmp_path, "widget")
    _check_stopped_together(out)
    widget = out["widget"]
    assert widget["status"] == "stopped" and widget["stop_disabled"]
    assert widget["points"] >= 40  # the loss chart drew rank 0's steps
    assert "step " in widget["info"] and "samples/s" in widget["info"]


def test_launch_view_argument_is_checked() -> None:
    import nbtrainer

    with pytest.raises(TypeError, match="LaunchMonitor"):
        nbtrainer.launch(print, nprocs=1, view="panel")  # type: ignore[arg-type]
