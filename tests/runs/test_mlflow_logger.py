"""MLflowLogger against a real MLflow: a local SQLite tracking URI, and a real ``mlflow server`` over HTTP;
everything is read back with ``MlflowClient``."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import warnings

import pytest
import torch
from _ports import free_port
from conftest import LazyModule, accuracy, make_classification, make_loader, mlp, needs

from nbtrainer import MLflowLogger, ModelCheckpoint, Trainer
from nbtrainer._runs._mlflow import MAX_PARAM, flatten_params

pytestmark = needs("mlflow")
mlflow = LazyModule("mlflow")


@pytest.fixture(scope="module")
def uri(tmp_path_factory, mlflow_template):
    path = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    shutil.copyfile(mlflow_template, path)  # tests/conftest.py: an empty store at the schema's head
    return f"sqlite:///{path}"


def _fit(logger, tmp_path, *, epochs=2, callbacks=(), metrics=None, **kw):
    x, y = make_classification(n=96)
    trainer = Trainer(
        mlp(), torch.nn.CrossEntropyLoss(), "adamw", lr=3e-3, progress=False, metrics=metrics or {"acc": accuracy},
        callbacks=[*callbacks, logger], refresh_interval=0.0, run_store=tmp_path / "runs.db", **kw,
    )  # fmt: skip
    history = trainer.fit(make_loader(x, y, batch_size=16), make_loader(x[:32], y[:32]), epochs=epochs)
    if not logger.wait:
        assert logger.flush()  # fit returned at once; MLflow's calls finish on the logger's thread
    return trainer, history


@pytest.mark.slow
def test_an_experiment_created_by_another_process_between_lookup_and_create_is_joined(
    tmp_path, mlflow_uri, monkeypatch
):
    """Seen once under load, against a real server: the create failed with RESOURCE_ALREADY_EXISTS (the client had
    sent it again after a slow answer) and the run was not logged. The same race happens when two notebooks or a
    sweep's trials start the same new experiment. Here the other process creates it in the real store just after
    this logger looked it up and found nothing."""
    uri = mlflow_uri
    real = mlflow.MlflowClient.get_experiment_by_name
    raced: list[str] = []

    def lookup(self, name):
        found = real(self, name)
        if not raced:  # the first lookup finds nothing; the other process creates it right after
            raced.append(mlflow.MlflowClient(uri).create_experiment(name))
        return found

    monkeypatch.setattr(mlflow.MlflowClient, "get_experiment_by_name", lookup)
    logger = MLflowLogger(tracking_uri=uri, experiment="shared")
    _fit(logger, tmp_path, epochs=1)
    assert logger.error is None
    run = mlflow.MlflowClient(uri).get_run(logger.run_id)
    assert raced and run.info.experiment_id == raced[0] and run.info.status == "FINISHED"


class Windows:
    """The step points each refresh delivered (what MLflowLogger reduces to one point per window)."""

    def __init__(self):
        self.windows = []

    def on_refresh(self, trainer, progress):
        if progress.step_points:
            self.windows.append(list(progress.step_points))


class LowerLR:
    def on_epoch_end(self, trainer, epoch, logs):
        if epoch == 1:
            trainer.set_lr(1e-3)


@pytest.mark.slow
def test_a_fit_reads_back_from_mlflow(uri, tmp_path):
    ckpt = ModelCheckpoint(tmp_path / "ckpt", monitor="val_loss", save_last=True)
    logger = MLflowLogger(tracking_uri=uri, experiment="digits", run_name="first", log_checkpoints=True)
    windows = Windows()
    trainer, history = _fit(logger, tmp_path, callbacks=[LowerLR(), ckpt, windows], grad_accum_steps=2, seed=5)
    assert logger.error is None
    client = mlflow.MlflowClient(uri)
    run = client.get_run(logger.run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "first"
    assert client.get_experiment(run.info.experiment_id).name == "digits"
    params = run.data.params
    assert params["optimizer"] == "AdamW" and params["optimizer_params.lr"] == "0.003"
    assert params["grad_accum_steps"] == "2" and params["seed"] == "5" and params["model.params"] == "227"
    assert params["precision"] == "fp32" and params["env.torch"] == torch.__version__
    tags = run.data.tags
    assert tags["nbtrainer.status"] == "finished" and tags["nbtrainer.run_id"] == trainer.run_id
    steps = client.get_metric_history(logger.run_id, "step/loss")
    assert [m.step for m in steps] == [w[-1][0] for w in windows.windows]  # one point per refresh window
    assert [m.value for m in steps] == pytest.approx([sum(p[1] for p in w) / len(w) for w in windows.windows])
    assert [p[0] for w in windows.windows for p in w] == history.steps["step"]  # the windows cover every step
    lrs = client.get_metric_history(logger.run_id, "step/lr")
    assert [(m.step, m.value) for m in lrs] == [(w[-1][0], w[-1][2]) for w in windows.windows]
    val = client.get_metric_history(logger.run_id, "val_acc")
    assert [m.value for m in val] == pytest.approx(history["val_acc"]) and [m.step for m in val] == [3, 6]
    lr = client.get_metric_history(logger.run_id, "control/lr")
    changes = [(e["step"], e["new"]) for e in history.events if e["kind"] == "lr"]
    assert [(m.step, m.value) for m in lr] == changes and changes[0][1] == 1e-3
    artifacts = {a.path for a in client.list_artifacts(logger.run_id)}
    assert "events.json" in artifacts and "checkpoints" in artifacts
    files = {os.path.basename(a.path) for a in client.list_artifacts(logger.run_id, "checkpoints")}
    assert ckpt.best_model_path is not None
    assert "last.ckpt" in files and os.path.basename(ckpt.best_model_path) in files


def test_a_stopped_fit_ends_killed_with_its_reason(uri, tmp_path):
    class Stop:
        def on_epoch_end(self, trainer, epoch, logs):
            trainer.request_stop("enough")

    logger = MLflowLogger(tracking_uri=uri, experiment="digits")  # fit returns once MLflow has it all
    _, history = _fit(logger, tmp_path, epochs=3, callbacks=[Stop()])
    run = mlflow.MlflowClient(uri).get_run(logger.run_id)
    assert history.status == "stopped" and run.info.status == "KILLED"
    assert run.data.tags["nbtrainer.status"] == "stopped" and run.data.tags["nbtrainer.stop_reason"] == "enough"


def test_long_params_are_cut_to_what_mlflow_takes(uri):
    params = flatten_params({"blocks": ["layer"] * 2000, "name": "x" * 7000, "a": {"b": {"c": 1}}, "bad:key?": 2})
    assert len(params["blocks"]) == len(params["name"]) == MAX_PARAM and params["name"].endswith("...")
    # '?' is refused, ':' taken (outside Windows): the log_batch below has MLflow check it
    assert params["a.b.c"] == "1" and params["bad_key_" if os.name == "nt" else "bad:key_"] == "2"
    client = mlflow.MlflowClient(uri)
    exp = client.get_experiment_by_name("limits") or client.get_experiment(client.create_experiment("limits"))
    run = client.create_run(exp.experiment_id)
    from mlflow.entities import Param

    client.log_batch(run.info.run_id, params=[Param(k, v) for k, v in params.items()])  # accepted as is
    assert client.get_run(run.info.run_id).data.params == params


def test_an_unreachable_uri_is_said_once_and_training_goes_on(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    logger = MLflowLogger(tracking_uri=f"http://127.0.0.1:{port}", experiment="x")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer, history = _fit(logger, tmp_path)
        _fit(logger, tmp_path)
    said = [w for w in caught if "MLflowLogger: cannot log" in str(w.message)]
    assert len(said) == 2  # once per fit, not once per value
    assert "Training goes on" in str(said[0].message) and f"127.0.0.1:{port}" in str(said[0].message)
    assert history.status == "finished" and len(history.epochs) == 2
    from nbtrainer import Runs

    assert Runs(tmp_path / "runs.db")[trainer.run_id].steps == len(history.steps["step"])  # kept locally


def test_missing_mlflow_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)
    with pytest.raises(ImportError, match=r"nbtrainer\[mlflow\]"):
        MLflowLogger(tracking_uri="sqlite:///x.db")


@pytest.fixture
def mlflow_server(mlflow_server_process):
    return mlflow_server_process[0]


@pytest.fixture
def mlflow_server_process(tmp_path, mlflow_template):
    """A real ``mlflow server`` on localhost: (its URL, its process, the leader of its own process group)."""
    port = free_port()  # below the ephemeral range (tests/_ports.py)
    shutil.copyfile(mlflow_template, tmp_path / "server.db")  # at the schema's head: the server migrates nothing
    cmd = [
        sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}",
        "--artifacts-destination", str(tmp_path / "artifacts"), "--host", "127.0.0.1", "--port", str(port),
        "--workers", "1",
    ]  # fmt: skip
    # no job runner: MLflow 3's server starts a huey consumer for its GenAI jobs, which tracking over HTTP never
    # uses (the server's processes took 14.6 CPU seconds from start to 3 s after ready with it, 4.9 without)
    env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, env=env
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, "mlflow server exited at start"
            try:
                with urllib.request.urlopen(url + "/health", timeout=2):
                    break
            except OSError:
                assert time.monotonic() < deadline, "mlflow server did not answer in 180 s"
                time.sleep(0.5)
        yield url, proc
    finally:
        with contextlib.suppress(ProcessLookupError):  # a test may have killed it already
            os.killpg(proc.pid, signal.SIGTERM)  # its own session: the server and its workers, by its PID
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.slow
def test_logging_to_a_real_mlflow_server_over_http(mlflow_server, tmp_path):
    ckpt = ModelCheckpoint(tmp_path / "ckpt", save_last=True)
    logger = MLflowLogger(
        tracking_uri=mlflow_server, experiment="remote", log_checkpoints=True, tags={"team": "a"}, every_step=True
    )
    _, history = _fit(logger, tmp_path, callbacks=[ckpt])
    assert logger.error is None
    client = mlflow.MlflowClient(mlflow_server)
    run = client.get_run(logger.run_id)
    assert run.info.status == "FINISHED" and run.data.tags["team"] == "a"
    assert run.data.params["optimizer_params.lr"] == "0.003"
    assert [m.value for m in client.get_metric_history(logger.run_id, "step/loss")] == pytest.approx(
        history.steps["loss"], rel=1e-12
    )
    assert [m.value for m in client.get_metric_history(logger.run_id, "val_loss")] == pytest.approx(history["val_loss"])
    found = client.search_runs([run.info.experiment_id], filter_string="tags.team = 'a'")
    assert [r.info.run_id for r in found] == [logger.run_id]
    files = {os.path.basename(a.path) for a in client.list_artifacts(logger.run_id, "checkpoints")}
    assert "last.ckpt" in files


@pytest.mark.slow
def test_a_server_that_goes_down_mid_fit_fails_the_logger_at_once_and_fit_returns(mlflow_server_process, tmp_path):
    """Seen with a real server killed after epoch 1: fit() blocked in MLflow's HTTP retries (7, 2 s backoff doubling:
    minutes) up to flush_timeout, logger.error stayed None and the only warning said calls were still running. The
    logger's own calls are bounded: the first failure names the server and why, the later calls are skipped, and
    nothing is left queued for the end of the process to wait on."""
    url, proc = mlflow_server_process

    class KillServer:
        def on_epoch_end(self, trainer, epoch, logs):
            if epoch == 1:
                assert logger.flush(60) and logger.run_id  # the MLflow run exists and has epoch 1's values
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    logger = MLflowLogger(tracking_uri=url, experiment="down", send_interval=0.0, flush_timeout=90)
    before = {k: v for k, v in os.environ.items() if k.startswith("MLFLOW_HTTP")}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, history = _fit(logger, tmp_path, epochs=3, callbacks=[KillServer()])
    assert history.status == "finished" and len(history.epochs) == 3  # training went on
    assert logger.error is not None and url in logger.error and "refused" in logger.error.lower()
    said = [str(w.message) for w in caught if "MLflowLogger" in str(w.message)]
    assert len(said) == 1, said  # said once, not "still running after 90 s"
    assert f"cannot log to {url}" in said[0] and "Check that the tracking server" in said[0]
    assert logger.run_id is not None and logger.run_id in said[0]  # the MLflow run that holds what came before
    assert logger.flush(timeout=0)  # nothing queued or in flight: the process's exit waits on nothing
    assert {k: v for k, v in os.environ.items() if k.startswith("MLFLOW_HTTP")} == before  # bounded per call


class FailAt:
    def __init__(self, step):
        self.step = step

    def on_optimizer_step(self, trainer, step, skipped):
        if step == self.step:
            raise RuntimeError("boom at step 3")


@pytest.mark.slow
def test_the_mlflow_run_has_ended_with_every_metric_when_fit_returns(uri, tmp_path):
    # default wait: no flush() before reading; the run is over in MLflow when fit returns
    logger = MLflowLogger(tracking_uri=uri, experiment="ended", send_interval=3600.0)
    _, history = _fit(logger, tmp_path)
    client = mlflow.MlflowClient(uri)
    run = client.get_run(logger.run_id)
    assert run.info.status == "FINISHED" and run.info.end_time is not None
    assert [m.value for m in client.get_metric_history(logger.run_id, "loss")] == pytest.approx(history["loss"])
    failing = MLflowLogger(tracking_uri=uri, experiment="ended")
    with pytest.raises(RuntimeError, match="boom at step 3"):
        _fit(failing, tmp_path, callbacks=[FailAt(3)])
    assert client.get_run(failing.run_id).info.status == "FAILED"


def test_each_named_optimizer_is_a_param(uri, tmp_path):
    model = mlp()
    optimizers = {"body": torch.optim.SGD(model[0].parameters(), lr=0.01),
                  "head": torch.optim.Adam(model[2].parameters(), lr=0.003)}  # fmt: skip
    logger = MLflowLogger(tracking_uri=uri, experiment="named-optimizers")
    x, y = make_classification(n=32)
    Trainer(model, torch.nn.CrossEntropyLoss(), optimizers, progress=False, callbacks=[logger], run_store=False).fit(
        make_loader(x, y, batch_size=16), epochs=1
    )
    params = mlflow.MlflowClient(uri).get_run(logger.run_id).data.params
    assert params["optimizer.body"] == "SGD" and params["optimizer.head"] == "Adam" and "optimizer" not in params
    assert params["optimizer_params.body.lr"] == "0.01" and params["optimizer_params.head.lr"] == "0.003"


def test_metric_names_mlflow_cleans_alike_stay_apart(uri, tmp_path):
    """acc@1 and acc#1 both cleaned to acc_1 and interleaved as one series; top:5 was rewritten though MLflow
    takes ':'."""
    metrics = {"acc@1": accuracy, "acc#1": lambda o, t: torch.tensor(0.125), "top:5": lambda o, t: torch.tensor(0.75)}
    logger = MLflowLogger(tracking_uri=uri, experiment="keys")
    with pytest.warns(RuntimeWarning, match=r"'acc@1' and 'acc#1' both become 'acc_1'.*logged as 'acc_1_2'"):
        _, history = _fit(logger, tmp_path, metrics=metrics)
    client = mlflow.MlflowClient(uri)

    def series(key):
        return [m.value for m in sorted(client.get_metric_history(logger.run_id, key), key=lambda m: m.step)]

    assert series("acc_1") == pytest.approx(history["acc@1"]) and series("acc_1_2") == [0.125, 0.125]
    assert series("val_acc_1") == pytest.approx(history["val_acc@1"]) and series("val_acc_1_2") == [0.125, 0.125]
    assert series("top:5") == [0.75, 0.75] and "top_5" not in client.get_run(logger.run_id).data.metrics


def test_fit_more_extends_the_mlflow_run_and_a_fresh_fit_starts_another(uri, tmp_path):
    """Before: each fit_more started a second MLflow run for what the History and the run store keep as one run
    (its epochs split over two runs, the second without params)."""
    logger = MLflowLogger(tracking_uri=uri, experiment="more")
    trainer, history = _fit(logger, tmp_path, epochs=2)
    first = logger.run_id
    x, y = make_classification(n=128)
    history = trainer.fit_more(make_loader(x, y, batch_size=16), make_loader(x[:32], y[:32]), epochs=2)
    assert logger.flush() and logger.error is None
    assert logger.run_id == first
    client = mlflow.MlflowClient(uri)
    run = client.get_run(first)
    assert run.info.status == "FINISHED" and run.data.tags["nbtrainer.status"] == "finished"
    val = client.get_metric_history(first, "val_acc")
    assert [m.value for m in val] == pytest.approx(history["val_acc"]) and len(val) == 4
    assert run.data.params["optimizer"] == "AdamW"
    trainer.fit(make_loader(x, y, batch_size=16), epochs=1)
    assert logger.flush() and logger.run_id != first  # a fresh fit is a new run, in MLflow as in the run store
    assert len(client.search_runs([run.info.experiment_id])) == 2


def test_one_logger_for_two_trainers_extends_each_trainers_own_run(uri, tmp_path):
    """Before: fit_more continued the MLflow run the logger had logged last, whichever trainer it belonged to: with
    one logger for two trainers in a notebook, the first trainer's next epoch went into the second trainer's run."""
    logger = MLflowLogger(tracking_uri=uri, experiment="two trainers", every_step=True)
    first, _ = _fit(logger, tmp_path, epochs=1)
    first_run = logger.run_id
    second, _ = _fit(logger, tmp_path, epochs=1)
    second_run = logger.run_id
    x, y = make_classification(n=96)
    history = first.fit_more(make_loader(x, y, batch_size=16), make_loader(x[:32], y[:32]), epochs=1)
    assert logger.flush() and logger.error is None
    assert logger.run_id == first_run != second_run
    client = mlflow.MlflowClient(uri)
    losses = client.get_metric_history(first_run, "step/loss")
    assert [(m.step, m.value) for m in losses] == _approx_steps(history.steps)
    losses = client.get_metric_history(second_run, "step/loss")
    assert [(m.step, m.value) for m in losses] == _approx_steps(second.history.steps)


def _approx_steps(steps):
    return [(s, pytest.approx(v)) for s, v in zip(steps["step"], steps["loss"], strict=True)]


def test_a_resume_into_a_new_mlflow_run_holds_the_whole_history(uri, tmp_path):
    """Before: a fit resumed from a checkpoint by a new logger (a new process) started an MLflow run that began at the
    checkpoint's step, without the epochs and steps before it that its History and its run store run hold."""
    ckpt = ModelCheckpoint(tmp_path / "ckpt", save_last=True)
    _fit(MLflowLogger(tracking_uri=uri, experiment="resume"), tmp_path, epochs=2, callbacks=[ckpt])
    logger = MLflowLogger(tracking_uri=uri, experiment="resume", every_step=True)
    trainer = Trainer(
        mlp(), torch.nn.CrossEntropyLoss(), "adamw", lr=3e-3, progress=False, metrics={"acc": accuracy},
        callbacks=[logger], refresh_interval=0.0, run_store=tmp_path / "runs.db",
    )  # fmt: skip
    x, y = make_classification(n=96)
    train, val = make_loader(x, y, batch_size=16), make_loader(x[:32], y[:32])
    history = trainer.fit(train, val, epochs=3, resume_from=ckpt.last_model_path)
    assert logger.flush() and logger.error is None
    client = mlflow.MlflowClient(uri)
    losses = client.get_metric_history(logger.run_id, "step/loss")
    assert [(m.step, m.value) for m in losses] == _approx_steps(history.steps)
    val = client.get_metric_history(logger.run_id, "val_acc")
    assert [(m.step, m.value) for m in val] == [(r["steps"], pytest.approx(r["val_acc"])) for r in history.epochs]
    assert len(val) == 3


_KILLED_CHILD = """
import os, signal, sys
sys.path.insert(0, {tests!r})
import torch
from conftest import accuracy, make_classification, make_loader, mlp
from nbtrainer import MLflowLogger, ModelCheckpoint, Trainer

class KillAfterCheckpoint:
    # step 8: epoch 1's last.ckpt (step 6) is written and MLflow holds the run's first points
    def on_train_batch_end(self, trainer, **kw):
        if trainer.global_step == 8:
            assert logger.flush()
            os.kill(os.getpid(), signal.SIGKILL)

logger = MLflowLogger(tracking_uri={uri!r}, experiment="killed", send_interval=0.0)
trainer = Trainer(
    mlp(), torch.nn.CrossEntropyLoss(), "adamw", lr=3e-3, progress=False, metrics={{"acc": accuracy}},
    callbacks=[ModelCheckpoint({ckpt!r}, save_last=True), logger, KillAfterCheckpoint()],
    refresh_interval=0.0, run_store=False,
)
x, y = make_classification(n=96)
trainer.fit(make_loader(x, y, batch_size=16), make_loader(x[:32], y[:32]), epochs=3)
"""


@pytest.mark.slow
def test_the_mlflow_run_of_a_killed_process_is_ended_when_a_new_process_resumes_it(tmp_path, mlflow_uri):
    """Before: a fit whose process was SIGKILLed left its MLflow run RUNNING for good; the resume from another process
    started a new run and nothing ended (or pointed at) the killed one. Now the killed run ends KILLED, tagged with
    the run that continues it, which is tagged with the run it resumes."""
    uri, ckpt = mlflow_uri, tmp_path / "ckpt"
    code = _KILLED_CHILD.format(tests=os.path.dirname(os.path.dirname(__file__)), uri=uri, ckpt=str(ckpt))
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert child.returncode == -signal.SIGKILL, child.stderr[-3000:]
    client = mlflow.MlflowClient(uri)
    (killed,) = client.search_runs([client.get_experiment_by_name("killed").experiment_id])
    assert killed.info.status == "RUNNING"  # what the killed process left
    logger = MLflowLogger(tracking_uri=uri, experiment="killed")
    trainer = Trainer(
        mlp(), torch.nn.CrossEntropyLoss(), "adamw", lr=3e-3, progress=False, metrics={"acc": accuracy},
        callbacks=[ModelCheckpoint(ckpt, save_last=True), logger], refresh_interval=0.0, run_store=False,
    )  # fmt: skip
    x, y = make_classification(n=96)
    history = trainer.fit(make_loader(x, y, batch_size=16), make_loader(x[:32], y[:32]), epochs=3, resume_from="last")
    assert history.status == "finished" and logger.error is None
    old, new = client.get_run(killed.info.run_id), client.get_run(logger.run_id)
    assert old.info.status == "KILLED" and old.info.end_time is not None
    assert old.data.tags["nbtrainer.status"] == "killed" and "killed" in old.data.tags["nbtrainer.stop_reason"]
    assert old.data.tags["nbtrainer.continued_by"] == new.info.run_id
    assert new.info.status == "FINISHED" and new.data.tags["nbtrainer.resumed_from"] == old.info.run_id
    assert [m.value for m in client.get_metric_history(new.info.run_id, "val_acc")] == pytest.approx(history["val_acc"])


def test_a_resume_leaves_a_finished_run_and_a_run_still_training_as_they_are(uri, tmp_path):
    """Branching from a checkpoint of a run that finished, or of one whose process still trains (here: this
    process), ends nothing; the earlier run only gets the pointer to the branch."""
    ckpt = ModelCheckpoint(tmp_path / "ckpt", save_last=True)
    first = MLflowLogger(tracking_uri=uri, experiment="branch")
    _fit(first, tmp_path, epochs=1, callbacks=[ckpt])
    client = mlflow.MlflowClient(uri)
    for status in ("FINISHED", "RUNNING"):
        client.update_run(first.run_id, status=status)  # RUNNING: as a process that still trains shows it
        logger = MLflowLogger(tracking_uri=uri, experiment="branch")
        trainer = Trainer(
            mlp(), torch.nn.CrossEntropyLoss(), "adamw", lr=3e-3, progress=False, metrics={"acc": accuracy},
            callbacks=[ModelCheckpoint(tmp_path / status, save_last=True), logger], refresh_interval=0.0,
            run_store=tmp_path / "runs.db",
        )  # fmt: skip
        x, y = make_classification(n=96)
        trainer.fit(make_loader(x, y, batch_size=16), epochs=2, resume_from=ckpt.last_model_path)
        assert logger.error is None and logger.run_id != first.run_id
        earlier = client.get_run(first.run_id)
        assert earlier.info.status == status and earlier.data.tags["nbtrainer.continued_by"] == logger.run_id
