"""Where a health report goes: the History (and its checkpoint and JSON), the progress line once per kind, the run
store and MLflow (no host read per step: ``tests/loop/test_sync_budget.py``)."""

from __future__ import annotations

import io
import json

import torch
from conftest import LazyModule, make_classification, make_loader, mlp, needs

from nbtrainer import EVENTS, Health, History, ModelCheckpoint, ProgressBar, Runs, Trainer, load_checkpoint


def _spiky(n: int = 100, bad: tuple[int, ...] = (70,)):
    x, y = make_classification(n=16 * n, d=10)
    for b in bad:
        y[b * 16 : b * 16 + 16] = (y[b * 16 : b * 16 + 16] + 1) % 3  # one batch of wrong labels: a loss spike
    return make_loader(x, y, batch_size=16)


def test_on_health_is_an_event_of_the_stream():
    assert EVENTS.index("on_control") < EVENTS.index("on_health") < EVENTS.index("on_epoch_end")


def test_reports_reach_the_history_the_progress_line_once_per_kind_and_the_run_store(tmp_path):
    out = io.StringIO()
    seen = []

    class Listener:
        def on_health(self, trainer, report):
            seen.append(report)

    trainer = Trainer(
        mlp(hidden=32),
        torch.nn.CrossEntropyLoss(),
        "adamw",
        lr=1e-2,
        callbacks=[Health(), Listener(), ModelCheckpoint(tmp_path / "ckpt", save_last=True)],
        progress=ProgressBar(mode="lines", file=out),
        run_store=tmp_path / "runs.db",
        seed=0,
    )
    history = trainer.fit(_spiky(), epochs=3)  # the bad batch spikes in epochs 1, 2 and 3 (steps 71, 171, 271)
    spikes = [r for r in seen if r.kind == "loss_spike"]
    assert [r.step for r in spikes] == [71, 171, 271]
    assert [r["step"] for r in history.health["reports"] if r["kind"] == "loss_spike"] == [71, 171, 271]
    assert [e["step"] for e in history.events if e["kind"] == "health"] == [r.step for r in seen]
    lines = [line for line in out.getvalue().splitlines() if line.startswith("health ")]
    assert lines == [str(spikes[0])]  # once per kind, not at every spike
    assert lines[0].startswith("health problem: The loss spiked to")
    # the run store: the events as the History has them
    run = Runs(tmp_path / "runs.db").last
    stored = [e for e in run.history.events if e["kind"] == "health"]
    assert [(e["step"], e["old"]) for e in stored] == [(r.step, r.kind) for r in seen]
    # the checkpoint and JSON carry the health series and reports (weights_only=True loads them)
    saved = History()
    saved.load_state_dict(load_checkpoint(tmp_path / "ckpt" / "last.ckpt")["history"])
    assert saved.health["grad_norm"]["total"] == history.health["grad_norm"]["total"]
    assert saved.health["reports"] == history.health["reports"]
    again = History()
    again.load_state_dict(json.loads(history.to_json()))
    assert again.health["update_ratio"]["0"] == history.health["update_ratio"]["0"]


def test_a_resumed_run_keeps_its_health_series(tmp_path):
    ckpt = ModelCheckpoint(tmp_path, save_last=True)
    first = Trainer(
        mlp(), torch.nn.CrossEntropyLoss(), "sgd", lr=0.1, callbacks=[Health(every_n_steps=10), ckpt], progress=False
    )
    loader = _spiky(n=20, bad=())
    first.fit(loader, epochs=1)
    resumed = Trainer(
        mlp(), torch.nn.CrossEntropyLoss(), "sgd", lr=0.1, callbacks=[Health(every_n_steps=10), ckpt], progress=False
    )
    history = resumed.fit(loader, epochs=2, resume_from="last")
    assert [s for s, _ in history.health["grad_norm"]["total"]] == [1, 10, 20, 21, 30, 40]  # each fit's first step too


mlflow = LazyModule("mlflow")


@needs("mlflow")
def test_reports_reach_mlflow(mlflow_uri):
    from nbtrainer import MLflowLogger

    logger = MLflowLogger(tracking_uri=mlflow_uri, experiment="health")
    trainer = Trainer(
        mlp(hidden=32),
        torch.nn.CrossEntropyLoss(),
        "adamw",
        lr=1e-2,
        callbacks=[Health(), logger],
        progress=False,
        run_store=False,
        seed=0,
    )
    trainer.fit(_spiky(), epochs=1)
    client = mlflow.MlflowClient(tracking_uri=logger.tracking_uri)
    run = client.get_run(logger.run_id)
    assert run.data.tags["nbtrainer.health.loss_spike"].startswith("The loss spiked to")
    assert [m.step for m in client.get_metric_history(logger.run_id, "health/loss_spike")] == [71]
