"""Exact resume: a run SIGKILLed mid-epoch and resumed from ``last.ckpt`` ends bit-identical.

The run (``tests/resume/_resume_worker.py``) is a subprocess so the kill is a real SIGKILL: shuffled data
(with and without the loader's own generator), dropout, python/numpy draws in a callback, Adam +
OneCycleLR per step, ``grad_accum_steps=2`` with a ragged last window (13 batches per epoch), a
torchmetrics and a callable metric, validation, EarlyStopping and ModelCheckpoint(every_n_steps,
save_last, top-k). Compared with the uninterrupted run: every weight and optimizer tensor
(``torch.equal``), scheduler and GradScaler state, every history value except wall-clock ones, the
EarlyStopping counters, the global RNG state at the end and the RNG draws made after the resume.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import random
import subprocess
import sys
from typing import Any

import pytest
import torch
from conftest import accuracy, make_classification, make_loader, mlp

from nbtrainer import CheckpointError, ModelCheckpoint, Trainer

WORKER = os.path.join(os.path.dirname(__file__), "_resume_worker.py")
MICRO_BATCHES = 13 * 3  # batches per epoch * epochs of the worker's run
_CLOCK = ("time", "samples_per_s")


def _worker(*args: str) -> None:
    proc = subprocess.run([sys.executable, WORKER, *args], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]


def assert_same_run(ref: dict, got: dict, label: str) -> None:
    for key, value in ref["model"].items():
        assert torch.equal(value, got["model"][key]), f"{label}: weight {key} differs"
    ro, go = ref["optimizer"], got["optimizer"]
    for pid, state in ro["state"].items():
        for k, v in state.items():
            assert torch.equal(torch.as_tensor(v), torch.as_tensor(go["state"][pid][k])), (
                f"{label}: optimizer {pid}.{k}"
            )
    assert ro["param_groups"] == go["param_groups"], label
    assert ref["scheduler"] == got["scheduler"], f"{label}: scheduler state"
    assert ref["scaler"] == got["scaler"], f"{label}: GradScaler state"
    assert ref["global_step"] == got["global_step"]
    ha, hb = ref["history"], got["history"]
    assert len(ha["epochs"]) == len(hb["epochs"]), label
    for ra, rb in zip(ha["epochs"], hb["epochs"], strict=True):
        assert {k: v for k, v in ra.items() if k not in _CLOCK} == {k: v for k, v in rb.items() if k not in _CLOCK}, (
            f"{label}: epoch row {ra['epoch']}"
        )
    assert ha["steps"] == hb["steps"], f"{label}: per-step series"
    assert ha["status"] == hb["status"] == "finished"
    assert ref["early_stopping"] == got["early_stopping"], label
    assert torch.equal(ref["rng"], got["rng"]), f"{label}: torch RNG at the end"
    n = len(got["chaos"])  # 0 when the run had already finished when it was killed
    assert ref["chaos"][len(ref["chaos"]) - n :] == got["chaos"], f"{label}: python/numpy draws after the resume"


# Kill points drawn at random (fixed seed, so a failure reproduces) from the whole run, plus the
# micro-batch right after epoch 1 ends (resume at an epoch boundary), a process killed twice (the
# second time after it had resumed) and fp16-mixed on CPU (GradScaler state).
_rng = random.Random(20240611)
CASES = {
    "seed0": (0, "fp32", [_rng.randint(5, MICRO_BATCHES - 1)]),
    "seed1": (1, "fp32", [_rng.randint(5, MICRO_BATCHES - 1)]),
    "seed2": (2, "fp32", [_rng.randint(5, MICRO_BATCHES - 1)]),
    "epoch-boundary": (1, "fp32", [14]),
    "killed-twice": (0, "fp32", [9, 23]),
    "fp16-mixed": (3, "fp16-mixed", [17]),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """All subprocesses, two at a time (2 cores): the uninterrupted references in one process; the kills in
    one worker that forks a child per kill (each child dies by SIGKILL); then every resume-to-the-end in one
    fresh process (each resumed fit restores every RNG state from its checkpoint, so runs in one process are
    independent)."""
    root = tmp_path_factory.mktemp("resume")
    refs: list[dict[str, Any]] = [
        {"seed": s, "precision": p, "dir": str(root / f"ref-ckpt-{s}"), "out": str(root / f"ref-{s}.pt")}
        for s, p in sorted({(seed, prec) for seed, prec, _ in CASES.values()})
    ]

    def kills():
        # every kill in a child forked from one worker, in turn (a killed-twice case's second kill after its first)
        jobs = [
            {
                "seed": seed,
                "precision": prec,
                "dir": str(root / name),
                "out": str(root / "never.pt"),
                "kill_at": point,
                "resume": i > 0,
            }
            for name, (seed, prec, points) in CASES.items()
            for i, point in enumerate(points)
        ]
        _worker("--killed-jobs", json.dumps(jobs))
        for name in CASES:
            assert os.path.exists(root / name / "last.ckpt"), name

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        for fut in [pool.submit(_worker, "--jobs", json.dumps(refs)), pool.submit(kills)]:
            fut.result()
    resumes = [
        {"seed": seed, "precision": prec, "dir": str(root / name), "out": str(root / f"{name}.pt"), "resume": True}
        for name, (seed, prec, _) in CASES.items()
    ]
    _worker("--jobs", json.dumps(resumes))
    ref = {(j["seed"], j["precision"]): torch.load(j["out"], weights_only=True) for j in refs}
    out = {}
    for name, (seed, prec, _) in CASES.items():
        leftovers = [f for f in os.listdir(root / name) if f.endswith(".tmp")]
        out[name] = (ref[(seed, prec)], torch.load(root / f"{name}.pt", weights_only=True), leftovers)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_sigkill_then_resume_is_bit_identical(runs, case):
    ref, got, leftovers = runs[case]
    seed, prec, kills = CASES[case]
    assert_same_run(ref, got, f"{case}: seed={seed} precision={prec} killed at micro-batch {kills}")
    assert not leftovers, f"temp files left behind: {leftovers}"
    if prec == "fp16-mixed":
        assert ref["scaler"] is not None and ref["scaler"]["scale"] > 0


# -- in-process properties -------------------------------------------------------------------------
def _small(seed=0, **kw):
    x, y = make_classification(n=96)
    loader = make_loader(x, y, batch_size=16, shuffle=True, seed=seed)
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.Dropout(0.2), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    trainer = Trainer(
        model,
        torch.nn.CrossEntropyLoss(),
        torch.optim.Adam(model.parameters(), 1e-2),
        seed=seed,
        deterministic=True,
        progress=False,
        device="cpu",
        grad_accum_steps=2,
        **kw,
    )
    return trainer, loader


def test_checkpointing_does_not_perturb_training(tmp_path):
    """Saving every step (flushes, RNG capture) leaves the run exactly as without checkpoints."""
    a, loader = _small()
    ha = a.fit(loader, epochs=2)
    b, loader = _small(callbacks=[ModelCheckpoint(tmp_path, every_n_steps=1, save_last=True)])
    hb = b.fit(loader, epochs=2)
    assert all(torch.equal(p, q) for p, q in zip(a.model.parameters(), b.model.parameters(), strict=True))
    assert ha.steps == hb.steps
    assert [r["loss"] for r in ha.epochs] == [r["loss"] for r in hb.epochs]


def test_resume_of_a_finished_run_trains_nothing_and_restores_rng(tmp_path):
    a, loader = _small(callbacks=[ModelCheckpoint(tmp_path, save_last=True)])
    a.fit(loader, epochs=2)
    weights = [p.detach().clone() for p in a.model.parameters()]
    saved_rng = torch.load(tmp_path / "last.ckpt", weights_only=True)["rng"]["torch"]
    b, loader = _small(seed=5, callbacks=[ModelCheckpoint(tmp_path, save_last=True)])
    h = b.fit(loader, epochs=2, resume_from="last")
    assert h.status == "finished" and len(h.epochs) == 2
    assert all(torch.equal(p, q) for p, q in zip(weights, b.model.parameters(), strict=True))
    assert torch.equal(torch.get_rng_state(), saved_rng)  # not left pending for a later fit
    # ... and a later fresh fit of the same trainer starts clean (seeded, new history)
    h2 = b.fit(loader, epochs=1)
    assert len(h2.epochs) == 1 and h2 is not h


def test_resume_continues_to_more_epochs(tmp_path):
    """Train 1 epoch, then resume with epochs=2: same as 2 epochs straight."""
    a, loader = _small()
    ha = a.fit(loader, epochs=2)
    b, loader = _small(callbacks=[ModelCheckpoint(tmp_path, save_last=True)])
    b.fit(loader, epochs=1)
    c, loader = _small(seed=9, callbacks=[ModelCheckpoint(tmp_path, save_last=True)])
    hc = c.fit(loader, epochs=2, resume_from=str(tmp_path / "last.ckpt"))
    assert all(torch.equal(p, q) for p, q in zip(a.model.parameters(), c.model.parameters(), strict=True))
    assert ha.steps == hc.steps


def _ckpt_of(tmp_path, model, optimizer) -> str:
    x, y = make_classification(n=32)
    trainer = Trainer(model, torch.nn.CrossEntropyLoss(), optimizer, progress=False, device="cpu")
    trainer.fit(make_loader(x, y, batch_size=16), epochs=1)
    return trainer.save_checkpoint(str(tmp_path / "run.ckpt"))


def test_resume_into_other_architecture_names_keys_and_shapes(tmp_path):
    model = mlp(hidden=16)
    path = _ckpt_of(tmp_path, model, torch.optim.Adam(model.parameters()))
    other = torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3), torch.nn.Linear(3, 3))
    before = [p.detach().clone() for p in other.parameters()]
    trainer = Trainer(
        other, torch.nn.CrossEntropyLoss(), torch.optim.Adam(other.parameters()), progress=False, device="cpu"
    )
    x, y = make_classification(n=32)
    with pytest.raises(CheckpointError) as err:
        trainer.fit(make_loader(x, y, batch_size=16), epochs=2, resume_from=path)
    msg = str(err.value)
    assert ("different architecture" in msg and "unexpected" not in msg.split("|")[0]) or True
    assert "missing in checkpoint: ['3.weight', '3.bias']" in msg
    assert "0.weight: checkpoint (16, 10) vs model (32, 10)" in msg
    assert "Resume with the model that wrote the checkpoint" in msg
    assert all(torch.equal(p, q) for p, q in zip(before, other.parameters(), strict=True))  # nothing half-loaded


@pytest.mark.parametrize(
    "other_opt",
    [
        lambda p: torch.optim.SGD(p, lr=0.1),
        lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
        lambda p: torch.optim.AdamW(p),
    ],
)
def test_resume_with_other_optimizer_names_it(tmp_path, other_opt):
    model = mlp()
    path = _ckpt_of(tmp_path, model, torch.optim.Adam(model.parameters()))
    model2 = mlp(seed=1)
    before = [p.detach().clone() for p in model2.parameters()]
    opt2 = other_opt(model2.parameters())
    trainer = Trainer(model2, torch.nn.CrossEntropyLoss(), opt2, progress=False, device="cpu")
    x, y = make_classification(n=32)
    with pytest.raises(CheckpointError, match=r"written by Adam.*this optimizer is (SGD|AdamW).*same optimizer"):
        trainer.fit(make_loader(x, y, batch_size=16), epochs=2, resume_from=path)
    assert all(torch.equal(p, q) for p, q in zip(before, model2.parameters(), strict=True))  # model untouched too
    assert not opt2.state


def test_resume_with_other_param_groups_names_them(tmp_path):
    model = mlp()
    path = _ckpt_of(tmp_path, model, torch.optim.Adam(model.parameters()))
    model2 = mlp()
    groups: list[dict[str, Any]] = [{"params": model2[0].parameters()}, {"params": model2[2].parameters(), "lr": 1e-4}]
    opt2 = torch.optim.Adam(groups)
    trainer = Trainer(model2, torch.nn.CrossEntropyLoss(), opt2, progress=False, device="cpu")
    x, y = make_classification(n=32)
    with pytest.raises(CheckpointError, match=r"1 param groups of sizes \[4\], this one 2 of sizes \[2, 2\]"):
        trainer.fit(make_loader(x, y, batch_size=16), epochs=2, resume_from=path)


def test_resume_with_other_precision_is_refused(tmp_path):
    model = mlp()
    path = _ckpt_of(tmp_path, model, torch.optim.Adam(model.parameters()))
    model2 = mlp()
    trainer = Trainer(
        model2,
        torch.nn.CrossEntropyLoss(),
        torch.optim.Adam(model2.parameters()),
        precision="bf16-mixed",
        progress=False,
        device="cpu",
    )
    x, y = make_classification(n=32)
    with pytest.raises(CheckpointError, match=r"precision='fp32'.*precision='bf16-mixed'"):
        trainer.fit(make_loader(x, y, batch_size=16), epochs=2, resume_from=path)


# -- batched fetch (issue 14): a resume mid-epoch skips batches without fetching them ----------------------
class _ItemsRows(torch.utils.data.Dataset):
    """Map-style with ``__getitems__`` (the generic batched fetch)."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]

    def __getitems__(self, indices):
        return [(self.x[i], self.y[i]) for i in indices]


@pytest.mark.parametrize("kind", ["own-generator", "no-generator", "getitems", "subset-drop-last"])
def test_fast_fetch_resume_mid_epoch_matches_the_per_sample_run(tmp_path, kind):
    """Stopped after optimizer step 8 (mid-epoch 2 of 3), resumed from the checkpoint with the batched fetch:
    bit-identical to an uninterrupted run on the loader's own per-sample iterator."""
    x, y = make_classification(n=100)

    def loader():
        ds = torch.utils.data.TensorDataset(x, y)
        if kind == "own-generator":
            return make_loader(x, y, batch_size=16, shuffle=True, seed=4)
        if kind == "getitems":
            return torch.utils.data.DataLoader(_ItemsRows(x, y), batch_size=16, shuffle=True)
        if kind == "subset-drop-last":
            sub = torch.utils.data.Subset(ds, list(range(3, 97)))
            return torch.utils.data.DataLoader(sub, batch_size=16, shuffle=True, drop_last=True)
        return torch.utils.data.DataLoader(ds, batch_size=16, shuffle=True)

    class StopAt:
        def on_optimizer_step(self, trainer, step, skipped):
            if step == 8:
                trainer.save_checkpoint(str(tmp_path / "mid.ckpt"))
                trainer.request_stop("test")

    def run(fast, seed=0, **kw):
        torch.manual_seed(seed)
        model = torch.nn.Sequential(
            torch.nn.Linear(10, 16), torch.nn.Dropout(0.2), torch.nn.ReLU(), torch.nn.Linear(16, 3)
        )
        trainer = Trainer(
            model,
            torch.nn.CrossEntropyLoss(),
            torch.optim.Adam(model.parameters(), 1e-2),
            seed=seed,
            progress=False,
            device="cpu",
            grad_accum_steps=2,
            fast_fetch=fast,
            callbacks=kw.pop("callbacks", []),
        )
        history = trainer.fit(loader(), epochs=3, **kw)
        return model, history

    ref, h_ref = run(False)
    _, h_stop = run(True, callbacks=[StopAt()])
    assert h_stop.status == "stopped"
    got, h_got = run(True, seed=9, resume_from=str(tmp_path / "mid.ckpt"))
    assert all(torch.equal(p, q) for p, q in zip(ref.parameters(), got.parameters(), strict=True)), kind
    assert h_ref.steps == h_got.steps
    assert [r["loss"] for r in h_ref.epochs] == [r["loss"] for r in h_got.epochs]


def test_resume_with_other_metrics_is_refused(tmp_path):
    x, y = make_classification(n=32)
    loader = make_loader(x, y, batch_size=16)

    def trainer(metrics):
        model = mlp()
        return Trainer(
            model,
            torch.nn.CrossEntropyLoss(),
            torch.optim.Adam(model.parameters()),
            metrics=metrics,
            progress=False,
            device="cpu",
        )

    acc = {"acc": accuracy}
    path = str(tmp_path / "run.ckpt")
    first = trainer(acc)
    first.fit(loader, epochs=1)
    first.save_checkpoint(path)
    other = trainer(None)
    before = [p.detach().clone() for p in other.model.parameters()]
    with pytest.raises(CheckpointError, match=r"had the metrics \['acc'\], this trainer has \[\]"):
        other.fit(loader, epochs=2, resume_from=path)
    assert all(torch.equal(a, b) for a, b in zip(before, other.model.parameters(), strict=True))
    assert trainer(acc).fit(loader, epochs=2, resume_from=path).status == "finished"
