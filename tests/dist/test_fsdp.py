"""FSDP2 (issue 23) on CPU with gloo: the same Trainer with ``strategy="fsdp"``.

Three torchrun launches of ``tests/dist/ddp_scripts/fsdp_scenario.py`` (2 ranks, several checks each) are compared
with single-process references computed here: 2 ranks at batch B give the weights and logs of 1 process at
batch 2B (SGD; AdamW with ragged accumulation windows and clipping), each rank holds about half of the
parameter and optimizer-state bytes, rank 0 alone writes and prints, bf16 goes through the
MixedPrecisionPolicy, a full checkpoint moves 2 ranks -> 1 process -> 2 ranks, and a run killed (SIGKILL) mid-epoch
resumes exactly from a full and from a sharded checkpoint. Bad input is checked in this process, on a world
of one (what ``strategy="fsdp"`` gives outside a launcher).
"""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch
import torch.distributed as dist
from _launch import run_group

if not (dist.is_available() and dist.is_gloo_available()):  # pragma: no cover - depends on the torch build
    pytest.skip("torch.distributed with the gloo backend is not available", allow_module_level=True)

from nbtrainer import FSDP, CheckpointError, History, ModelCheckpoint, Trainer, load_checkpoint, precision_support
from nbtrainer._dist._ddp import destroy_process_group

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ddp_scripts")
sys.path.insert(0, SCRIPTS)
import common  # noqa: E402
import fsdp_common as fc  # noqa: E402

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
ATOL = 1e-6
LOG_KEYS = ("loss", "acc_fn", "acc_tm", "val_loss", "val_acc_fn", "val_acc_tm")


def torchrun(out, *args: str, killed: bool = False) -> None:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([SCRIPTS, env.get("PYTHONPATH", "")]))
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TQDM_DISABLE"):
        env.pop(key, None)
    cmd = [*TORCHRUN, "--standalone", "--nproc_per_node=2", os.path.join(SCRIPTS, "fsdp_scenario.py"), *args]
    proc = run_group(cmd, what="torchrun", cwd=out, env=env)
    if killed:  # the ranks died by SIGKILL, as planned (an exception would name another cause)
        assert proc.returncode != 0 and "Signal 9 (SIGKILL)" in proc.stderr, proc.stderr[-6000:]
        return
    assert proc.returncode == 0, f"torchrun failed\nSTDOUT:\n{proc.stdout[-3000:]}\nSTDERR:\n{proc.stderr[-6000:]}"


def results(out, name: str) -> list[dict]:
    return [json.load(open(os.path.join(out, f"{name}.rank{r}.json"))) for r in (0, 1)]


def weights(out, name: str) -> list[dict]:
    return [torch.load(os.path.join(out, f"{name}.rank{r}.pt"), weights_only=True) for r in (0, 1)]


def assert_same_weights(a: dict, b: dict, atol: float = ATOL) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=atol, rtol=0, msg=f"{k}: differs by more than {atol}")


def assert_same_logs(a: dict, b: dict, keys=LOG_KEYS) -> None:
    for k in keys:
        assert a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-6), (k, a[k], b[k])


def reference(case: str, epochs: int, resume_from: str | None = None, seed: int = 0) -> tuple[Trainer, History]:
    """One process, twice the per-rank batch, the same global data order (``common.reference_loaders``)."""
    trainer = fc.make_trainer(case, "single", seed=seed)
    train, val = common.reference_loaders()
    return trainer, trainer.fit(train, val, epochs=epochs, resume_from=resume_from)


@pytest.fixture(scope="module")
def main_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp_main")
    torchrun(out, "main", str(out), str(out / "ckpts"))
    return out


@pytest.fixture(scope="module")
def resume_run(main_run, tmp_path_factory):
    """2 ranks -> 1 process -> 2 ranks: the FSDP checkpoint continued here one epoch, saved, and continued
    under FSDP; a run killed mid-epoch (its own launch) resumed from its full and its sharded checkpoint."""
    out = tmp_path_factory.mktemp("fsdp_resume")
    one, _ = reference("adamw", epochs=3, resume_from=str(main_run / "adamw.ckpt"), seed=3)
    single = str(out / "single.ckpt")
    one.save_checkpoint(single)
    torchrun(out, "killed", str(out), str(out / "ckpts"), killed=True)
    torchrun(out, "resume", str(out), str(out / "ckpts"), single)
    return out, single


@pytest.fixture(scope="module", autouse=True)
def _no_group_left():
    yield
    destroy_process_group()  # the world of one the in-process tests created


def test_two_ranks_match_one_process_at_twice_the_batch_sgd(main_run):
    r0, r1 = results(main_run, "main")
    w0, w1 = weights(main_run, "main")
    assert r0["sgd"]["units"] == ["2.2", "2.1", "2.0", ""]  # the repeated blocks, innermost first, the root last
    ref, history = reference("sgd", fc.EPOCHS["sgd"])
    assert_same_weights(w0["sgd"], w1["sgd"], atol=0)  # gathered: every rank sees the same full model
    assert_same_weights(w0["sgd"], ref.model_state_dict())
    for r in (r0, r1):
        assert r["sgd"]["status"] == "finished"
        for got, want in zip(r["sgd"]["epochs"], history.epochs, strict=True):
            assert_same_logs(got, want)
    val = common.reference_loaders()[1]
    assert_same_logs(r0["sgd"]["evaluate"], ref.evaluate(val), keys=("val_loss", "val_acc_fn", "val_acc_tm"))
    # 21 samples in batches of 5: 3 and 2 loader batches per rank, evened out (every forward is a collective)
    assert_same_logs(r0["sgd"]["uneven"], ref.evaluate(fc.uneven_val()), keys=("val_loss", "val_acc_fn", "val_acc_tm"))
    assert r1["sgd"]["uneven"] == r0["sgd"]["uneven"]
    predicted = ref.predict(common.ddp_loaders()[1])
    for r in (r0, r1):
        torch.testing.assert_close(torch.tensor(r["sgd"]["predict"]), predicted, atol=ATOL, rtol=0)


def test_adamw_with_ragged_accumulation_and_clipping_matches(main_run):
    r0, _ = results(main_run, "main")
    w0, _ = weights(main_run, "main")
    ref, history = reference("adamw", fc.EPOCHS["adamw"])
    assert r0["adamw"]["steps"] == ref.global_step == 4  # windows of 3 and 1 micro-batches, 2 epochs
    # reduce-scatter only on the micro-step that closes a window: before it, no sharded gradient exists
    assert r0["adamw"]["synced"] == [False, False, True, True] * 2
    assert_same_weights(w0["adamw"], ref.model_state_dict())
    for got, want in zip(r0["adamw"]["epochs"], history.epochs, strict=True):
        assert_same_logs(got, want)


def test_each_rank_holds_about_half_of_parameters_and_optimizer_state(main_run):
    mems = [r["adamw"]["memory"] for r in results(main_run, "main")]
    for m in mems:
        assert m["dtensor"]
        assert 0.45 < m["param_local"] / m["param_full"] < 0.55, m
        assert 0.45 < m["optim_local"] / m["optim_full"] < 0.55, m  # exp_avg and exp_avg_sq, sharded like the params
    # nothing held twice: the shards add up to the whole
    assert sum(m["param_local"] for m in mems) == mems[0]["param_full"]
    assert sum(m["optim_local"] for m in mems) == mems[0]["optim_full"]


def test_only_rank_zero_writes_and_prints(main_run):
    r0, r1 = results(main_run, "main")
    assert r1["sgd"]["writes"] == []
    assert r0["sgd"]["writes"].count("last.ckpt") == 3 and len(r0["sgd"]["writes"]) >= 4  # + the best so far
    files = sorted(os.listdir(main_run / "ckpts"))  # top-1 by val_loss and last, no temp file left
    assert len(files) == 2 and files[0].startswith("epoch") and files[1] == "last.ckpt", files
    assert "epoch 3/3" in r0["sgd"]["output"] and "training finished" in r0["sgd"]["output"]
    assert r1["sgd"]["output"] == ""


def test_bf16_goes_through_the_mixed_precision_policy(main_run):
    r0, _ = results(main_run, "main")
    w0, _ = weights(main_run, "main")
    bf16 = r0["bf16"]
    # computed with bf16 parameters, the loss fed fp32 outputs, fp32 master weights kept
    assert bf16["seen"] == {"param": "torch.bfloat16", "output": "torch.float32"}
    assert bf16["stored"] == ["torch.float32"]
    ref, history = reference("bf16", 1)  # single process: autocast
    fp32, _ = reference("sgd", 1)
    diffs = [float((w0["bf16"][k] - ref.model_state_dict()[k]).abs().max()) for k in w0["bf16"]]
    from_fp32 = [float((w0["bf16"][k] - fp32.model_state_dict()[k]).abs().max()) for k in w0["bf16"]]
    assert max(diffs) < 2e-2, diffs  # bf16 rounding apart, the same training
    assert max(from_fp32) > 1e-5, from_fp32  # and not fp32 in disguise
    assert bf16["epochs"][0]["loss"] == pytest.approx(history.epochs[0]["loss"], rel=2e-2)


def test_stopping_agrees_across_ranks(main_run):
    for r in results(main_run, "main"):
        assert r["stop"]["early"] == [2, "stopped"]  # EarlyStopping on the reduced val_loss, the same epoch
        assert r["stop"]["one_rank"][:2] == [3, "stopped"]  # rank 1 alone asked; both stopped after epoch 3


def test_uneven_list_of_evaluation_batches_is_refused_with_the_fix(main_run):
    r0, r1 = results(main_run, "main")
    for r in (r0, r1):
        assert "3 evaluation batches cannot be split evenly across 2 ranks" in r["sgd"]["list_refused"]
        assert "Pass a DataLoader" in r["sgd"]["list_refused"]


def test_too_small_evaluation_set_is_refused_on_every_rank(main_run):
    for r in results(main_run, "main"):
        assert "evaluation set (3 samples) is too small" in r["sgd"]["small_refused"]
        assert "pass batch_size >= 2" in r["sgd"]["small_refused"]


def test_full_checkpoint_is_the_single_process_format(main_run):
    ckpt = load_checkpoint(str(main_run / "adamw.ckpt"))
    ref, _ = reference("adamw", fc.EPOCHS["adamw"])
    own = ref.state_dict()
    assert ckpt["model"].keys() == own["model"].keys()
    assert ckpt["optimizer"]["param_groups"] == own["optimizer"]["param_groups"]
    assert ckpt["optimizer"]["state"].keys() == own["optimizer"]["state"].keys() == {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}
    for i, state in own["optimizer"]["state"].items():
        for key, value in state.items():
            torch.testing.assert_close(ckpt["optimizer"]["state"][i][key], value, atol=ATOL, rtol=0)
    assert_same_weights(ckpt["model"], own["model"])
    assert len(ckpt["ranks"]) == 2


def test_checkpoint_two_ranks_to_one_process_to_two_ranks(resume_run):
    out, single = resume_run
    r0, _ = results(out, "resume")
    w0, w1 = weights(out, "resume")
    # the single-process continuation of the same file, to the same epoch
    one, history = reference("adamw", epochs=4, resume_from=single, seed=9)
    assert r0["from_single"]["status"] == "finished" and len(r0["from_single"]["epochs"]) == 4
    assert_same_weights(w0["from_single"], one.model_state_dict())
    assert_same_weights(w0["from_single"], w1["from_single"], atol=0)
    assert_same_logs(r0["from_single"]["epochs"][-1], history.epochs[-1])


@pytest.mark.parametrize("kind", ["full", "sharded"])
def test_killed_mid_epoch_resumes_exactly(resume_run, kind):
    out, _ = resume_run
    r0, _ = results(out, "resume")
    w0, _ = weights(out, "resume")
    got = r0[kind]
    assert got["saved_at"] == [6, 1, 2]  # step 6: epoch 2 (0-based 1), 2 of its 4 batches done
    assert got["status"] == "finished"
    assert_same_weights(w0[kind], w0["uninterrupted"], atol=0)
    for a, b in zip(got["epochs"], r0["uninterrupted"], strict=True):
        assert_same_logs(a, b)
    assert got["listing"] == ["last.ckpt"]  # the kill came between saves: no temp file or directory left
    assert got["last_is_dir"] == (kind == "sharded")


# -- in this process: a world of one ------------------------------------------------------------------


def _fsdp_trainer(model=None, strategy=None, **kwargs) -> Trainer:
    model = model if model is not None else fc.make_model(0)
    # quantize= / lora= replace layers: the optimizer is then given by name (built over the new ones)
    by_name = "lora" in kwargs or "quantize" in kwargs
    return Trainer(
        model,
        torch.nn.CrossEntropyLoss(),
        "adamw" if by_name else torch.optim.AdamW(model.parameters(), lr=0.01),
        lr=0.01 if by_name else None,
        progress=False,
        seed=1,
        strategy=strategy if strategy is not None else "fsdp",
        **kwargs,
    )


def test_world_of_one_with_offload_matches_a_single_process():
    trainer = _fsdp_trainer(strategy=FSDP(offload=True), max_grad_norm=0.5)
    single = _fsdp_trainer(strategy="single", max_grad_norm=0.5)
    train, val = common.ddp_loaders()
    trainer.fit(train, val, epochs=2)
    train, val = common.ddp_loaders()
    single.fit(train, val, epochs=2)
    assert type(trainer.strategy).__name__ == "FSDP" and trainer.strategy.world_size == 1
    assert_same_weights(trainer.model_state_dict(), single.model_state_dict(), atol=0)


def test_sharded_checkpoint_on_another_world_size_is_refused(resume_run):
    out, _ = resume_run
    trainer = _fsdp_trainer()
    train, _ = common.ddp_loaders()
    with pytest.raises(CheckpointError, match=r"written by 2 process\(es\), and this run has 1.*--nproc-per-node 2"):
        trainer.fit(train, epochs=2, resume_from=str(out / "ckpts" / "sharded" / "last.ckpt"))
    single = _fsdp_trainer(strategy="single")
    with pytest.raises(CheckpointError, match=r"sharded checkpoint directory.*strategy='fsdp'"):
        single.fit(train, epochs=2, resume_from=str(out / "ckpts" / "sharded" / "last.ckpt"))


def test_bad_input_is_refused_before_the_first_step(tmp_path):
    with pytest.raises(ValueError, match="nothing to shard"):
        Trainer(torch.nn.ReLU(), torch.nn.MSELoss(), strategy="fsdp", progress=False)
    from torch.distributed.fsdp import CPUOffloadPolicy, FullyShardedDataParallel, MixedPrecisionPolicy

    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match=r"pin_memory=True\)\) needs CUDA.*pin_memory=False"):
            FSDP(offload=CPUOffloadPolicy())
    with pytest.raises(ValueError, match=r"wrap=\['GRU'\]\) matches no module.*Linear"):
        _fsdp_trainer(strategy=FSDP(wrap=[torch.nn.GRU]))
    with pytest.raises(ValueError, match="both set the precision"):
        _fsdp_trainer(
            strategy=FSDP(mixed_precision=MixedPrecisionPolicy(param_dtype=torch.bfloat16)), precision="bf16-mixed"
        )
    with pytest.raises(TypeError, match=r"list of nn\.Module types"):
        FSDP(wrap="Block")  # type: ignore[arg-type]
    trainer = _fsdp_trainer(strategy="single", callbacks=[ModelCheckpoint(tmp_path, sharded=True)])
    with pytest.raises(ValueError, match=r"sharded=True\) writes per-rank shards.*strategy='fsdp'"):
        trainer.fit(common.ddp_loaders()[0], epochs=1)
    assert trainer.global_step == 0
    FSDP().connect("cpu")  # the world of one, so that FSDP1 can wrap a model here
    wrapped = FullyShardedDataParallel(fc.make_model(0), device_id=torch.device("cpu"))
    with pytest.raises(TypeError, match=r"FSDP1.*Pass the plain model"):
        _fsdp_trainer(model=wrapped)
    with pytest.raises(TypeError, match=r"DistributedDataParallel.*Pass model\.module"):
        _fsdp_trainer(model=torch.nn.parallel.DistributedDataParallel(fc.make_model(0)))


def test_strategy_string_and_public_name():
    import nbtrainer

    assert "FSDP" in nbtrainer.dist.__all__ and nbtrainer.dist.FSDP is FSDP and nbtrainer.FSDP is FSDP
    trainer = _fsdp_trainer(strategy="fsdp")
    assert isinstance(trainer.strategy, FSDP) and trainer.strategy.units == ["2.2", "2.1", "2.0", ""]
    with pytest.raises(ValueError, match="'fsdp'"):
        _fsdp_trainer(strategy="zero3")


@pytest.mark.parametrize(
    "options",
    [{"activation_checkpointing": [fc.Block]}, {"freeze": ["0.*"]}, {"grad_accum_steps": 3, "max_grad_norm": 0.1}],
    ids=["activation-checkpointing", "frozen-layer", "accumulation-clipping"],
)
def test_world_of_one_matches_a_single_process_with_memory_switches(options):
    trainer = _fsdp_trainer(**options)
    single = _fsdp_trainer(strategy="single", **options)
    for t in (trainer, single):
        train, val = common.ddp_loaders()
        t.fit(train, val, epochs=2)
    assert_same_weights(trainer.model_state_dict(), single.model_state_dict(), atol=0)


def test_fp16_goes_through_the_policy_with_a_grad_scaler():
    trainer = _fsdp_trainer(precision="fp16-mixed")
    seen: list[torch.dtype] = []

    def record(module: torch.nn.Module, args: tuple) -> None:
        weight = module.weight
        assert isinstance(weight, torch.Tensor)
        seen.append(weight.dtype)

    block = trainer.model.get_submodule("2.0.fc")
    block.register_forward_pre_hook(record)
    train, val = common.ddp_loaders()
    history = trainer.fit(train, val, epochs=1)
    reference = _fsdp_trainer(strategy="single")
    train, val = common.ddp_loaders()
    ref_history = reference.fit(train, val, epochs=1)
    assert trainer.scaler is not None and set(seen) == {torch.float16}
    assert history.epochs[0]["loss"] == pytest.approx(ref_history.epochs[0]["loss"], rel=1e-2)


class _Tied(torch.nn.Module):
    """Embedding and head share one weight; the blocks hold most of the parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(50, 16)
        self.layers = torch.nn.ModuleList([torch.nn.Linear(16, 16) for _ in range(8)])
        self.norm = torch.nn.LayerNorm(16)
        self.head = torch.nn.Linear(16, 50, bias=False)
        self.head.weight = self.emb.weight


def test_units_are_the_blocks_and_tied_weights_stay_with_the_root():
    from nbtrainer._dist._fsdp import shard_units

    model = _Tied()
    units = shard_units(model, None)
    assert units == list(model.layers)[::-1]  # innermost / last first; emb and head (tied) stay with the root
    assert shard_units(model, [torch.nn.LayerNorm]) == [model.norm]
    # no repeated blocks: the children holding at least 10% of the parameters (here 82% and 18%)
    two = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
    assert [u.out_features for u in shard_units(two, None)] == [2, 64]
    assert [type(u).__name__ for u in shard_units(fc.make_model(0), None)] == ["Block", "Block", "Block"]


def test_lora_checkpoints_hold_the_adapters_and_move_both_ways(tmp_path):
    """A LoRA run under FSDP writes what a single-process LoRA run writes (the adapters, not the frozen base)."""
    pytest.importorskip("peft")
    # The adapters are initialised from the global RNG after the model's seed; the first Trainer of a process
    # probes precision support with torch.randn in between (cached afterwards): probe now, both start alike.
    precision_support("cpu")
    lora = {"r": 4, "target_modules": ["fc"]}
    fsdp, single = _fsdp_trainer(lora=lora), _fsdp_trainer(strategy="single", lora=lora)
    for t in (fsdp, single):
        train, val = common.ddp_loaders()
        t.fit(train, val, epochs=1)
    fsdp.save_checkpoint(str(tmp_path / "fsdp.ckpt"))
    single.save_checkpoint(str(tmp_path / "single.ckpt"))
    a, b = load_checkpoint(str(tmp_path / "fsdp.ckpt")), load_checkpoint(str(tmp_path / "single.ckpt"))
    assert a["model"].keys() == b["model"].keys() and all("lora_" in k for k in a["model"])
    assert_same_weights(a["model"], b["model"], atol=0)
    # and back: the single-process file continued under FSDP equals its continuation in one process
    for t, name in ((_fsdp_trainer(lora=lora), "fsdp"), (_fsdp_trainer(strategy="single", lora=lora), "single")):
        train, val = common.ddp_loaders()
        t.fit(train, val, epochs=2, resume_from=str(tmp_path / "single.ckpt"))
        t.save_checkpoint(str(tmp_path / f"{name}2.ckpt"))
    a, b = load_checkpoint(str(tmp_path / "fsdp2.ckpt")), load_checkpoint(str(tmp_path / "single2.ckpt"))
    assert_same_weights(a["model"], b["model"], atol=0)


def test_a_quantized_base_is_refused_with_the_alternatives():
    pytest.importorskip("bitsandbytes")
    with pytest.raises(ValueError, match=r"cannot shard bitsandbytes' quantized weights.*strategy='ddp'"):
        _fsdp_trainer(quantize="nf4", lora={"r": 4, "target_modules": ["fc"]})


def test_sharded_top_k_keeps_directories_and_resumes_in_a_world_of_one(tmp_path):
    cb = ModelCheckpoint(tmp_path, monitor="val_loss", mode="max", save_top_k=1, save_last=True, sharded=True)
    trainer = _fsdp_trainer(callbacks=[cb])
    train, val = common.ddp_loaders()
    history = trainer.fit(train, val, epochs=3)
    # top-1: the other epochs' directories were written and removed again
    best = max(range(3), key=lambda i: history.epochs[i]["val_loss"]) + 1
    assert os.path.basename(cb.best_model_path or "").startswith(f"epoch{best:03d}")
    assert sorted(os.listdir(tmp_path)) == sorted([os.path.basename(cb.best_model_path or ""), "last.ckpt"])
    assert all(os.path.isdir(tmp_path / name) for name in os.listdir(tmp_path))
    again = _fsdp_trainer(model=fc.make_model(3))
    train, val = common.ddp_loaders()
    resumed = again.fit(train, val, epochs=3, resume_from=str(tmp_path / "last.ckpt"))
    assert resumed.status == "finished" and len(resumed.epochs) == 3  # resumed at the end: nothing left to run
    assert_same_weights(again.model_state_dict(), trainer.model_state_dict(), atol=0)


def test_a_model_sharded_by_the_user_is_used_as_is():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    FSDP().connect("cpu")
    model = fc.make_model(0)
    fully_shard(model, mesh=init_device_mesh("cpu", (1,)))
    with pytest.raises(ValueError, match=r"already sharded with fully_shard.*precision='fp32'"):
        _fsdp_trainer(model=model, precision="bf16-mixed")
    trainer = _fsdp_trainer(model=model)  # its optimizer was built over the sharded parameters
    single = _fsdp_trainer(strategy="single")
    for t in (trainer, single):
        train, val = common.ddp_loaders()
        t.fit(train, val, epochs=1)
    assert isinstance(trainer.strategy, FSDP) and trainer.strategy.units == []  # nothing sharded again
    assert_same_weights(trainer.model_state_dict(), single.model_state_dict(), atol=0)


@pytest.mark.parametrize("name", ["sgd", "adam", "adamw"])
def test_optimizers_by_name_step_on_shards_as_in_one_process(name):
    def trainer(strategy: str) -> Trainer:
        model = fc.make_model(0)
        return Trainer(model, torch.nn.CrossEntropyLoss(), name, lr=0.01, progress=False, seed=1, strategy=strategy)

    sharded, single = trainer("fsdp"), trainer("single")
    assert sharded.optimizer is not None
    # torch has fused kernels for sharded Adam / AdamW only: SGD steps unfused there (fused in one process)
    assert sharded.optimizer.param_groups[0]["fused"] is (name != "sgd")
    for t in (sharded, single):
        train, val = common.ddp_loaders()
        t.fit(train, val, epochs=1)
    assert sharded.global_step == single.global_step > 0
    assert_same_weights(sharded.model_state_dict(), single.model_state_dict())


def test_sgd_by_name_over_parameters_sharded_by_the_user_is_not_fused():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    FSDP().connect("cpu")
    model = fc.make_model(0)
    fully_shard(model, mesh=init_device_mesh("cpu", (1,)))
    trainer = Trainer(model, torch.nn.CrossEntropyLoss(), "sgd", lr=0.01, progress=False, seed=1, strategy="fsdp")
    trainer.fit(common.ddp_loaders()[0], epochs=1)
    assert trainer.optimizer is not None
    assert trainer.global_step > 0 and not trainer.optimizer.param_groups[0]["fused"]


def test_a_fused_sgd_instance_is_refused_with_the_fix():
    model = fc.make_model(0)
    fused = torch.optim.SGD(model.parameters(), lr=0.01, fused=True)
    with pytest.raises(ValueError, match=r"cannot run SGD\(fused=True\).*fused=False"):
        Trainer(model, torch.nn.CrossEntropyLoss(), fused, progress=False, strategy="fsdp")
