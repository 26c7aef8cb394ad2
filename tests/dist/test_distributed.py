"""DDP (issue 8) on CPU with gloo and 2 processes: the same Trainer under torchrun.

The 2-process runs (``tests/dist/ddp_scripts/scenario.py`` under ``torchrun --standalone``) are compared with
single-process references computed here: same weights as one process with twice the per-device batch,
the same reduced metrics, rank-0-only files and output, EarlyStopping without hangs, one gradient
all-reduce per optimizer step under accumulation, exact resume, and checkpoints that move between DDP
and single-process runs. Every launch has a timeout, so a hang fails instead of blocking the suite.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from collections.abc import Callable

import pytest
import torch
import torch.distributed as dist
from _launch import run_group

if not (dist.is_available() and dist.is_gloo_available()):  # pragma: no cover - depends on the torch build
    pytest.skip("torch.distributed with the gloo backend is not available", allow_module_level=True)

from nbtrainer import DDP, ModelCheckpoint, Trainer, load_checkpoint
from nbtrainer._dist._ddp import ShardSampler, destroy_process_group
from nbtrainer._dist._placement import SingleDevice

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.join(HERE, "ddp_scripts")
sys.path.insert(0, SCRIPTS)
import common  # noqa: E402

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
ATOL = 1e-6
LOG_KEYS = ("loss", "acc_fn", "acc_tm", "val_loss", "val_acc_fn", "val_acc_tm")


def _env() -> dict:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([SCRIPTS, env.get("PYTHONPATH", "")]))
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TQDM_DISABLE"):
        env.pop(key, None)
    return env


def torchrun(tmp_path, *args: str) -> None:
    cmd = [*TORCHRUN, "--standalone", "--nproc_per_node=2", os.path.join(SCRIPTS, "scenario.py"), *args]
    proc = run_group(cmd, what="torchrun", cwd=tmp_path, env=_env())
    assert proc.returncode == 0, f"torchrun failed\nSTDOUT:\n{proc.stdout[-3000:]}\nSTDERR:\n{proc.stderr[-6000:]}"


def results(out, name: str) -> list[dict]:
    return [json.load(open(os.path.join(out, f"{name}.rank{r}.json"))) for r in (0, 1)]


def weights(out, name: str) -> list[dict]:
    return [torch.load(os.path.join(out, f"{name}.rank{r}.pt"), weights_only=True) for r in (0, 1)]


def _prefixed(key: str) -> Callable[[str], str]:
    return lambda message: f"{key}: {message}"


def assert_same_weights(a: dict, b: dict, atol: float = ATOL) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=atol, rtol=1e-5, msg=_prefixed(k))


def assert_same_logs(a: dict, b: dict, keys=LOG_KEYS) -> None:
    for k in keys:
        assert a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-6), (k, a[k], b[k])


def reference(epochs: int, accum: int = 1, callbacks=(), resume_from=None):
    """One process, twice the per-device batch, the same global data order."""
    model = common.make_model(0)
    train, val = common.reference_loaders()
    trainer = Trainer(
        model,
        torch.nn.CrossEntropyLoss(),
        common.sgd(model),
        metrics=common.metrics(),
        seed=common.SAMPLER_SEED,
        progress=False,
        grad_accum_steps=accum,
        strategy="single",
        callbacks=list(callbacks),
    )
    history = trainer.fit(train, val, epochs=epochs, resume_from=resume_from)
    return trainer, history


@pytest.fixture(scope="module")
def parity_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp_parity")
    torchrun(out, "parity", str(out), str(out / "ckpts"))
    return out


def test_two_processes_match_one_with_twice_the_batch(parity_run):
    r0, r1 = results(parity_run, "parity")
    assert r0["type"] == "DDP" and r0["world_size"] == 2 and r0["device"] == "cpu"  # strategy="auto" under torchrun
    assert r0["model_type"] == "DistributedDataParallel" and not r0["ckpt_keys_prefixed"]
    ref, ref_history = reference(epochs=3)
    w0, w1 = weights(parity_run, "parity")
    assert_same_weights(w0, w1, atol=0)  # ranks stay identical
    assert_same_weights(w0, ref.model_state_dict())
    # Loss, a callable metric and a torchmetrics Accuracy: reduced over ranks = the single-process values,
    # for training (sharded by a DistributedSampler) and validation (37 samples: an uneven, unpadded shard).
    for r in (r0, r1):
        assert len(r["epochs"]) == 3 and r["status"] == "finished" and r["steps"] == ref.global_step == 12
        for got, want in zip(r["epochs"], ref_history.epochs, strict=True):
            assert_same_logs(got, want)
    evaluated = ref.evaluate(common.reference_loaders()[1])
    assert_same_logs(r0["evaluate"], evaluated, keys=("val_loss", "val_acc_fn", "val_acc_tm"))
    assert r1["evaluate"] == r0["evaluate"]


def test_a_validation_set_smaller_than_the_world_is_evaluated_alike_on_every_rank(parity_run):
    """One validation item on two ranks: rank 1's share is empty. Every rank reports the item's loss and accuracy
    (rank 1 once returned no val_loss), and the fit validates on both (rank 1 once refused it alone and hung)."""
    ranks = results(parity_run, "tiny_val")
    model = common.make_model(0)
    single = Trainer(model, torch.nn.CrossEntropyLoss(), common.sgd(model), metrics=common.metrics(), progress=False,
                     strategy="single")  # fmt: skip
    expected = single.evaluate(common.tiny_val())
    for rank in ranks:
        assert rank["evaluate"].keys() == expected.keys(), rank
        assert_same_logs(rank["evaluate"], expected, keys=list(expected))
        assert rank["status"] == "finished" and "val_loss" in rank["epochs"][-1], rank
    timed = ("time", "samples_per_s")  # each rank's own clock
    assert [{k: v for k, v in row.items() if k not in timed} for row in ranks[0]["epochs"]] == [
        {k: v for k, v in row.items() if k not in timed} for row in ranks[1]["epochs"]
    ]


def test_only_rank_zero_writes_and_prints(parity_run):
    r0, r1 = results(parity_run, "parity")
    assert r1["writes"] == []
    assert len(r0["writes"]) == 6  # top-2 candidates and last.ckpt at each of 3 epochs
    # top-2 by val_loss (which falls every epoch here) and last: no duplicates, no temp files left
    files = sorted(os.listdir(parity_run / "ckpts"))
    best = sorted(e for e in r0["writes"] if e != "last.ckpt")[1:]
    assert files == sorted([*best, "last.ckpt"]), files
    # torchrun pipes the output: rank 0 prints plain epoch lines (no bars, no carriage returns)
    assert "epoch 3/3" in r0["output"] and "training finished" in r0["output"] and "\r" not in r0["output"]
    assert "epoch" not in r1["output"] and "%|" not in r1["output"], r1["output"][-500:]


def test_accumulation_all_reduces_once_per_optimizer_step(parity_run):
    a0, a1 = results(parity_run, "accum")
    # 4 micro-batches per rank and epoch with grad_accum_steps=3: windows of 3 and 1 (ragged), 2 epochs.
    assert a0["steps"] == a1["steps"] == 4
    assert a0["hook_calls"] == a1["hook_calls"] == 4  # no_sync on forward+backward of non-final micro-steps
    assert all(a0["hook_last"])  # one bucket per step for this tiny model
    ref, ref_history = reference(epochs=2, accum=3)
    w0, w1 = weights(parity_run, "accum")
    assert_same_weights(w0, ref.model_state_dict())
    assert_same_weights(w0, w1, atol=0)
    for got, want in zip(a0["epochs"], ref_history.epochs, strict=True):
        assert_same_logs(got, want)


def test_training_step_under_ddp_matches_one_process_with_twice_the_batch(parity_run):
    """training_step= (issue 36) on 2 ranks with accumulation: each optimizer sees only its own loss's gradient
    (a partial backward DDP itself refuses), averaged across ranks once per window: the weights of one process
    with twice the batch, identical on both ranks."""
    m0, m1 = results(parity_run, "manual")
    ref = common.manual_trainer(strategy="single")
    history = ref.fit(*common.reference_loaders(), epochs=2)
    assert m0["steps"] == m1["steps"] == ref.global_step == 4
    w0, w1 = weights(parity_run, "manual")
    assert_same_weights(w0, w1, atol=0)
    assert_same_weights(w0, ref.model_state_dict())
    for got, want in zip(m0["epochs"], history.epochs, strict=True):
        assert_same_logs(got, want, keys=("loss", "body_loss", "val_loss"))  # validated on both ranks' shards


def test_training_step_with_fsdp_is_refused_naming_ddp(world_of_one):
    model = common.make_model(0)
    with pytest.raises(ValueError, match=r"strategy='fsdp' is not supported.*strategy='ddp'"):
        Trainer(model, None, common.manual_optimizers(model), training_step=common.manual_step, strategy="fsdp")


def test_ddp_checkpoint_resumes_in_a_single_process(parity_run):
    path = str(parity_run / "ckpts" / "last.ckpt")
    ckpt = load_checkpoint(path)
    assert not any(k.startswith("module.") for k in ckpt["model"])
    assert len(ckpt["ranks"]) == 2 and ckpt["loop"]["epoch_complete"]
    model = common.make_model(0)
    single = Trainer(model, torch.nn.CrossEntropyLoss(), common.sgd(model), metrics=common.metrics(), progress=False)
    single.load_model_state_dict(ckpt["model"])  # plain load_state_dict keys
    ref4, ref4_history = reference(epochs=4)
    resumed, resumed_history = reference(epochs=4, resume_from=path)  # continues epoch 4 in one process
    assert_same_weights(resumed.model_state_dict(), ref4.model_state_dict())
    assert_same_logs(resumed_history.epochs[-1], ref4_history.epochs[-1])
    assert len(resumed_history.epochs) == 4


def test_early_stopping_stops_every_rank(tmp_path):
    torchrun(tmp_path, "stop", str(tmp_path))
    r0, r1 = results(tmp_path, "stop")
    for r in (r0, r1):
        # constant val_loss (lr=0), patience=1: both ranks stop after epoch 2, on the same reduced value
        assert r["early"]["epochs"] == 2 and r["early"]["status"] == "stopped"
        assert "EarlyStopping" in r["early"]["reason"]
        # a stop decided by rank 1 alone at epoch 3 is shared at the epoch end: both stop, none hangs
        assert r["one_rank"]["epochs"] == 3 and r["one_rank"]["status"] == "stopped"
    assert r1["one_rank"]["reason"] == "rank 1 says stop"
    assert r0["one_rank"]["reason"] == "another rank stopped"


def test_resume_under_ddp_and_single_checkpoint_into_ddp(tmp_path):
    # A single-process checkpoint at the end of epoch 2 (continued under DDP by the scenario).
    single_dir = tmp_path / "single"
    reference(epochs=2, callbacks=[ModelCheckpoint(single_dir, save_top_k=0, save_last=True)])
    ref3, ref3_history = reference(epochs=3)
    torchrun(tmp_path, "resume", str(tmp_path), str(tmp_path / "ckpts"), str(single_dir / "last.ckpt"))
    r0, r1 = results(tmp_path, "resume")
    # Mid-epoch checkpoint (step 6 = batch 2 of epoch 2) holding each rank's own RNG and running sums.
    assert r0["ckpt_ranks"] == 2 and r0["ckpt_epoch"] == 1 and r0["ckpt_batch"] == 2
    assert r0["ckpt_samples"] == [16, 16]
    w0, w1 = weights(tmp_path, "resume")
    for w in (w0, w1):  # resumed (per-rank dropout RNG restored) == uninterrupted, exactly
        assert_same_weights(w["b"], w["c"], atol=0)
    assert_same_weights(w0["b"], w1["b"], atol=0)
    for r in (r0, r1):
        assert r["b_status"] == "finished" and len(r["b"]) == len(r["c"]) == 3
        for got, want in zip(r["b"], r["c"], strict=True):
            assert_same_logs(got, want)
    # The single-process checkpoint continued under DDP == the single-process run to epoch 3.
    s0, _s1 = results(tmp_path, "from_single")
    f0, f1 = weights(tmp_path, "from_single")
    assert s0["status"] == "finished" and len(s0["epochs"]) == 3
    assert_same_weights(f0, ref3.model_state_dict())
    assert_same_weights(f0, f1, atol=0)
    assert_same_logs(s0["epochs"][-1], ref3_history.epochs[-1])


def test_batched_fetch_under_ddp_matches_the_per_sample_loader(tmp_path):
    """Issue 14: under DDP the batched fetch reads the trainer's DistributedSampler exactly as the loader
    does (set_epoch, shuffle, each rank's share), and arrays are sharded the same way."""
    torchrun(tmp_path, "fetch", str(tmp_path))
    logs, ws = results(tmp_path, "fetch"), weights(tmp_path, "fetch")
    for rank in (0, 1):
        w = ws[rank]
        for key in w["fast"]:
            assert torch.equal(w["fast"][key], w["per-sample"][key]), (rank, key)
            assert torch.equal(w["fast"][key], w["arrays"][key]), (rank, key)
        assert logs[rank]["fast"] == logs[rank]["per-sample"] == logs[rank]["arrays"]
        assert logs[rank]["fast"]["batches"] == common.N_TRAIN // (2 * common.BATCH)  # this rank's share
    assert all(torch.equal(ws[0]["fast"][k], ws[1]["fast"][k]) for k in ws[0]["fast"])


LAUNCH_SCRIPT = textwrap.dedent("""
    import json, sys, torch
    import nbtrainer
    from nbtrainer import Trainer

    def train(epochs):  # defined in __main__, as in a notebook cell
        import torch.distributed as dist
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        x = torch.randn(32, 4); y = x.sum(1, keepdim=True)
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=4, shuffle=True)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        trainer = Trainer(model, torch.nn.MSELoss(), opt, progress=False, seed=0)
        # the README's OneCycle recipe: total_steps counts this rank's share of the batches
        total = trainer.total_steps(loader, epochs=epochs)
        trainer.set_scheduler(torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=total))
        history = trainer.fit(loader, epochs=epochs)
        return {"rank": dist.get_rank(), "world": dist.get_world_size(), "strategy": type(trainer.strategy).__name__,
                "batches": trainer.progress.batches, "weight": trainer.model_state_dict()["weight"].tolist(),
                "epochs": len(history.epochs), "total_steps": total, "scheduler_steps": trainer.scheduler.last_epoch}

    if __name__ == "__main__":
        print("RESULT", json.dumps(nbtrainer.launch(train, 2, nprocs=2)))
""")


def test_launch_from_main_module(tmp_path):
    script = tmp_path / "nb.py"
    script.write_text(LAUNCH_SCRIPT)
    proc = run_group([sys.executable, str(script)], what="launch", cwd=tmp_path, env=_env())
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    r0, r1 = json.loads(line[len("RESULT ") :])
    assert (r0["rank"], r1["rank"]) == (0, 1) and r0["world"] == 2 and r0["strategy"] == r1["strategy"] == "DDP"
    assert r0["batches"] == 4 and r0["epochs"] == 2  # each rank trains on half of the 8 batches
    assert r0["total_steps"] == r0["scheduler_steps"] == 8  # the schedule ran to its end, not refused
    assert r0["weight"] == r1["weight"]


def test_launch_refuses_after_cuda_init(monkeypatch):
    import nbtrainer
    from nbtrainer._dist import _launch

    monkeypatch.setattr(_launch, "_cuda_initialized", lambda: True)
    with pytest.raises(RuntimeError, match="CUDA has already been initialised in this kernel"):
        nbtrainer.launch(print, nprocs=2, start_method="fork")
    with pytest.raises(ValueError, match="nprocs"):
        nbtrainer.launch(print, nprocs=0)


@pytest.mark.parametrize(
    ("fn", "kwargs", "error", "message"),
    [
        ("train", {}, TypeError, r"got str 'train'.*launch\(train, nprocs=2\)"),
        (print, {"threads_per_process": 0}, ValueError, "threads_per_process must be an int >= 1"),
        (print, {"threads_per_process": -1}, ValueError, "threads_per_process must be an int >= 1"),
    ],
)
def test_launch_refuses_a_bad_function_or_thread_count_before_any_process_starts(fn, kwargs, error, message):
    """Before: the processes started, then each failed ('str' object is not callable; set_num_threads expects a
    positive integer), or threads_per_process=0 was silently ignored."""
    import multiprocessing

    import nbtrainer

    before = multiprocessing.active_children()
    with pytest.raises(error, match=message):
        nbtrainer.launch(fn, nprocs=2, **kwargs)
    assert multiprocessing.active_children() == before


def test_launch_propagates_a_rank_failure(tmp_path):
    code = textwrap.dedent("""
        import nbtrainer, os
        def boom():
            if os.environ["RANK"] == "1":
                raise ValueError("rank one failed")
            import torch.distributed as dist  # rank 0 would wait forever for rank 1 in a collective
            import time; time.sleep(60)
        if __name__ == "__main__":
            nbtrainer.launch(boom, nprocs=2)
    """)
    proc = run_group([sys.executable, "-c", code], what="launch", cwd=tmp_path, env=_env())
    assert proc.returncode != 0 and "rank one failed" in proc.stderr


# -- in-process: strategy selection, a world of one, sharding helpers --------------------------------
def test_strategy_selection(monkeypatch):
    model = common.make_model(0)
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    t = Trainer(model, torch.nn.CrossEntropyLoss(), common.sgd(model), progress=False)
    assert isinstance(t.strategy, SingleDevice) and t.is_global_zero
    # ("fsdp" is a strategy now: tests/dist/test_fsdp.py)
    with pytest.raises(ValueError, match="strategy must be one of"):
        Trainer(model, torch.nn.CrossEntropyLoss(), common.sgd(model), progress=False, strategy="zero3")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(RuntimeError, match="launch with torchrun"):
        Trainer(model, torch.nn.CrossEntropyLoss(), common.sgd(model), progress=False)


@pytest.fixture
def world_of_one(monkeypatch):
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    yield
    destroy_process_group()


def test_ddp_world_of_one_matches_single_device(world_of_one, tmp_path):
    """strategy="ddp" outside a launcher: a one-process group (in-process store); same result as single."""

    def run(strategy):
        model = common.make_model(0)
        train, val = common.ddp_loaders()
        t = Trainer(
            model,
            torch.nn.CrossEntropyLoss(),
            common.sgd(model),
            metrics=common.metrics(),
            progress=False,
            seed=1,
            strategy=strategy,
            grad_accum_steps=2,
        )
        return t, t.fit(train, val, epochs=2)

    ddp, h_ddp = run("ddp")
    assert isinstance(ddp.strategy, DDP) and ddp.strategy.world_size == 1 and ddp.strategy.backend == "gloo"
    assert type(ddp.model).__name__ == "DistributedDataParallel"
    single, h_single = run("single")
    assert_same_weights(ddp.model_state_dict(), single.model_state_dict())
    for a, b in zip(h_ddp.epochs, h_single.epochs, strict=True):
        assert_same_logs(a, b)
    path = ddp.save_checkpoint(str(tmp_path / "one.ckpt"))
    assert len(load_checkpoint(path)["ranks"]) == 1
    assert ddp.strategy.reduce_sums([1.5, 2.0]) == [1.5, 2.0] and ddp.strategy.any_rank(True)


def test_destroying_the_group_releases_the_wrapper_and_a_later_fit_wraps_again(world_of_one):
    """The group's exit handler first drops the DDP wrappers' reducers (a trainer alive at interpreter exit would
    otherwise free its gloo group during finalization, which can abort the process); a later fit gets a new
    wrapper over a new group and trains."""
    from torch.nn.parallel import DistributedDataParallel

    model = common.make_model(0)
    train, _ = common.ddp_loaders()
    t = Trainer(model, torch.nn.CrossEntropyLoss(), common.sgd(model), progress=False, strategy="ddp")
    t.fit(train, epochs=1)
    old = t.model
    assert isinstance(old, DistributedDataParallel) and hasattr(old, "reducer")
    destroy_process_group()
    assert not dist.is_initialized() and not hasattr(old, "reducer") and old.process_group is None
    t2 = Trainer(old.module, torch.nn.CrossEntropyLoss(), common.sgd(old.module), progress=False, strategy="ddp")
    t2.model = old  # as a trainer that kept its released wrapper would hold it
    history = t2.fit(train, epochs=1)
    assert t2.model is not old and isinstance(t2.model, DistributedDataParallel) and len(history.epochs) == 1


def test_shard_sampler_covers_every_sample_once():
    shards = [list(ShardSampler(37, r, 3)) for r in range(3)]
    assert sorted(i for s in shards for i in s) == list(range(37))
    assert [len(ShardSampler(37, r, 3)) for r in range(3)] == [13, 12, 12]


NOTEBOOK_CELLS = (
    textwrap.dedent("""
        import torch, nbtrainer
        from nbtrainer import Trainer

        def train(epochs):  # defined in a notebook cell: launch forks, so the children have it
            torch.manual_seed(0)
            model = torch.nn.Linear(4, 1)
            x = torch.randn(32, 4); y = x.sum(1, keepdim=True)
            loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=4, shuffle=True)
            trainer = Trainer(model, torch.nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.05),
                              progress=False, seed=0)
            history = trainer.fit(loader, epochs=epochs)
            print(f"rank {trainer.strategy.rank} of {trainer.strategy.world_size} done", flush=True)
            return [round(e["loss"], 6) for e in history.epochs]
    """),
    "results = nbtrainer.launch(train, 2, nprocs=2)\nprint('RESULTS', results)",
)


@pytest.mark.slow
def test_launch_in_a_real_kernel(tmp_path, monkeypatch):
    """From a Jupyter kernel: a cell-defined function on 2 forked ranks; their prints reach the cell."""
    nbformat = pytest.importorskip("nbformat")
    pytest.importorskip("nbclient")
    from _kernels import notebook_client

    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    for key, value in _env().items():
        monkeypatch.setenv(key, value)
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(src) for src in NOTEBOOK_CELLS]
    notebook_client(nb, timeout=None, resources={"metadata": {"path": str(tmp_path)}}).execute()
    text = "".join(o.get("text", "") for o in nb.cells[1].outputs if o.output_type == "stream")
    assert "rank 0 of 2 done" in text and "rank 1 of 2 done" in text, nb.cells[1].outputs
    line = next(ln for ln in text.splitlines() if ln.startswith("RESULTS"))
    r0, r1 = eval(line[len("RESULTS ") :])
    assert r0 == r1 and len(r0) == 2  # epoch losses are global: the same on both ranks


# -- one rank goes wrong: every rank decides alike, or the launch ends with the error ----------------------------


@pytest.fixture(scope="module")
def failures_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp_failures")
    cmd = [*TORCHRUN, "--standalone", "--nproc_per_node=2", os.path.join(SCRIPTS, "scenario.py"), "failures", str(out)]
    # a rank that hangs fails the test, and the whole group (torchrun and both ranks) is ended with it
    return out, run_group(cmd, what="torchrun (a rank hung)", cwd=out, env=_env())


def _nan_reference() -> tuple[Trainer, str]:
    trainer = common.nan_trainer("skip")
    trainer.fit(torch.utils.data.DataLoader(common.nan_data(), batch_size=8), epochs=2)
    return trainer, trainer.run_state.history.status


def _check_one_rank_exception(out, proc) -> None:
    # the failing rank skips the end-of-fit barrier: its error ends the launch instead of a hang
    assert proc.returncode != 0 and "failure raised on rank 1 only" in proc.stderr, proc.stderr[-4000:]


def _check_nonfinite_skip(out, proc) -> None:
    ref, status = _nan_reference()
    for r in results(out, "failures"):
        skip = r["skip"]
        # rank 1's NaN window is skipped on rank 0 too: one process at twice the batch, every epoch's step skipped
        assert skip["status"] == status == "finished" and skip["finite"], skip
        assert skip["skipped"] == ref.run_state.loop_state.skipped_steps == 2
        got = {k: torch.tensor(v) for k, v in skip["weights"].items()}
        assert_same_weights(got, ref.model_state_dict())


def _check_nonfinite_stop(out, proc) -> None:
    r0, r1 = results(out, "failures")
    for r in (r0, r1):
        assert r["stop"]["status"] == "stopped" and r["stop"]["steps"] == 1 and r["stop"]["finite"], r["stop"]
        assert "non-finite loss at optimizer step 1 (epoch 1)" in r["stop"]["reason"]
    assert r0["stop"]["reason"] == r1["stop"]["reason"] and r0["stop"]["weights"] == r1["stop"]["weights"]


def _check_empty_shard(out, proc) -> None:
    for r in results(out, "failures"):
        assert "each of the 2 ranks gets 6 sample(s), fewer than batch_size=8" in r["empty"], r["empty"]
        assert "batch_size <= 6 (or drop_last=False)" in r["empty"]


@pytest.mark.parametrize(
    "check", [_check_one_rank_exception, _check_nonfinite_skip, _check_nonfinite_stop, _check_empty_shard]
)
def test_a_failure_on_one_rank_is_every_ranks(failures_run, check):
    """One launch (its cases stay on one worker): a NaN loss on rank 1 alone is skipped / stops on both ranks,
    a training share without a batch is refused on both, an exception on rank 1 alone ends the launch with it."""
    check(*failures_run)
