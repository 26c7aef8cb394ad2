"""No host-device sync per step: host reads of tensors during a fit do not grow with the number of steps.

On CPU there is no device to wait for, so we count the calls that WOULD sync on a GPU
(``item``, ``tolist``, ``__bool__``, ``__float__``, ``__int__``, ``cpu``, ``numpy``) during fits of 10 and
of 80 batches: the counts must be equal (they come from per-epoch and per-refresh reads only).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from conftest import accuracy, make_classification, make_loader, mlp

from nbtrainer import Trainer

_METHODS = ("item", "tolist", "__bool__", "__float__", "__int__", "cpu", "numpy")


@pytest.fixture
def count_reads(monkeypatch):
    counts: dict[str, Any] = {"n": 0, "where": []}
    for name in _METHODS:
        original = getattr(torch.Tensor, name)

        def wrapper(self, *a, _orig=original, _name=name, **kw):
            counts["n"] += 1
            return _orig(self, *a, **kw)

        monkeypatch.setattr(torch.Tensor, name, wrapper)
    return counts


# data: "loader" is a DataLoader over a TensorDataset (the batched fetch), "per-sample" the same with
# fast_fetch=False (the loader's own iterator), "arrays" fit((x, y), batch_size=16), "subset" a Subset of it.
@pytest.mark.parametrize(
    "precision,accum,data",
    [
        ("fp32", 1, "loader"),
        ("bf16-mixed", 3, "loader"),
        ("fp32", 1, "per-sample"),
        ("fp32", 2, "arrays"),
        ("fp32", 1, "subset"),
    ],
)
def test_reads_do_not_grow_with_steps(count_reads, precision, accum, data):
    totals = []
    for n_batches in (10, 80):
        x, y = make_classification(n=16 * n_batches)
        model = mlp()
        trainer = Trainer(
            model,
            torch.nn.CrossEntropyLoss(),
            torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
            metrics={"acc": accuracy},
            precision=precision,
            grad_accum_steps=accum,
            max_grad_norm=1.0,
            progress=True,
            refresh_interval=3600.0,
            fast_fetch=data != "per-sample",
        )
        loader = make_loader(x, y, batch_size=16, shuffle=True)
        if data == "subset":
            sub = torch.utils.data.Subset(loader.dataset, list(range(len(x) - 1, -1, -1)))
            loader = torch.utils.data.DataLoader(sub, batch_size=16, shuffle=True)
        count_reads["n"] = 0
        if data == "arrays":
            trainer.fit((x, y), val_data=(x, y), batch_size=16, epochs=2)
        else:
            trainer.fit(loader, loader, epochs=2)
        totals.append(count_reads["n"])
    assert totals[0] == totals[1], f"host reads grew with the number of steps: {totals}"
    assert totals[0] <= 15 * 2  # per-epoch reads (DataLoader seeds/indices on CPU, flushes, validation)


# -- on CUDA: the device-resident and the pinned + prefetched paths (issue 14) ---------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("data_on_device", [0.5, 0.0])
def test_cuda_data_paths_add_no_sync_per_step(data_on_device):
    """CUDA's own sync detector: a fit of 80 batches syncs no more often than one of 10 (host reads at the
    refresh and epoch ends only), with the data copied to the GPU once (0.5) or prefetched (0.0)."""
    import warnings

    counts = []
    for n_batches in (10, 80):
        x, y = make_classification(n=16 * n_batches)
        model = mlp()
        trainer = Trainer(
            model,
            torch.nn.CrossEntropyLoss(),
            torch.optim.SGD(model.parameters(), lr=0.05),
            progress=False,
            refresh_interval=3600.0,
            timing_every=0,
            device="cuda",
            data_on_device=data_on_device,
        )
        loader = make_loader(x, y, batch_size=16, shuffle=True)
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                trainer.fit(loader, epochs=2)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        counts.append(sum("synchroniz" in str(w.message) for w in caught))
    # 70 more steps add no sync (on an H200 the 10-batch fit counted one more than the 80-batch one: 10 vs 9)
    assert counts[1] <= counts[0], f"syncs grew with the number of steps: {counts}"


def test_loggers_and_line_progress_add_no_reads(count_reads, tmp_path):
    """TensorBoardLogger / CSVLogger take per-step values from the refresh (already on the host) and
    ProgressBar's lines print at epoch ends: with them, host reads still do not grow with the steps."""
    from nbtrainer import CSVLogger, ProgressBar, TensorBoardLogger

    totals = []
    for n_batches in (10, 80):
        x, y = make_classification(n=16 * n_batches)
        model = mlp()
        trainer = Trainer(
            model,
            torch.nn.CrossEntropyLoss(),
            torch.optim.SGD(model.parameters(), lr=0.05),
            metrics={"acc": accuracy},
            callbacks=[TensorBoardLogger(tmp_path / f"tb{n_batches}"), CSVLogger(tmp_path / f"csv{n_batches}")],
            progress=ProgressBar(mode="lines", heartbeat=3600.0),
            refresh_interval=3600.0,
        )
        loader = make_loader(x, y, batch_size=16, shuffle=True)
        count_reads["n"] = 0
        trainer.fit(loader, loader, epochs=2)
        totals.append(count_reads["n"])
    assert totals[0] == totals[1], f"host reads grew with the number of steps: {totals}"


@pytest.mark.parametrize("precision,accum", [("fp32", 1), ("bf16-mixed", 2)])
def test_health_at_its_defaults_adds_no_read_per_step(count_reads, precision, accum):
    """``Health()`` (gradient norms, update ratios and dead units every 50 steps, spikes, data wait): fits of 200 and
    800 batches an epoch (each epoch holds sampled steps) read equally often: its device values are read with the
    refresh, never per step; a problem it files may read once more (one diagnostic forward of the last batch tells
    damaged weights), so the reads are counted net of the problems. (SGD: Adam reads its CPU step counters.)"""
    from nbtrainer import Health

    totals = []
    for n_batches in (200, 800):
        x, y = make_classification(n=16 * n_batches)
        model = mlp()
        trainer = Trainer(
            model,
            torch.nn.CrossEntropyLoss(),
            torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
            callbacks=[Health(every_n_steps=50)],  # exactly every 50 steps (the default spaces them on a small model)
            precision=precision,
            grad_accum_steps=accum,
            max_grad_norm=1.0,
            progress=False,
            refresh_interval=3600.0,
        )
        count_reads["n"] = 0
        history = trainer.fit(make_loader(x, y, batch_size=16, shuffle=True), epochs=2)
        problems = sum(r["level"] == "problem" for r in history.health.get("reports", []))
        totals.append(count_reads["n"] - problems)
        assert len(history.health["grad_norm"]["total"]) >= 4  # it did measure, in both epochs
    assert totals[0] == totals[1], f"host reads grew with the number of steps: {totals}"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_resume_adds_no_sync_per_step(tmp_path):
    """A fit resumed on CUDA with a user's ``torch.optim.Adam`` (foreach, not fused) syncs no more often over 80
    batches than over 10. The checkpoint is loaded onto the GPU, which brought Adam's step counters there too;
    non-capturable Adam then read each with .item() every step (found by the GPU soak: the resumed state's
    counters were on cuda:0, the uninterrupted run's on the CPU). The string "adam" builds a fused Adam on CUDA,
    whose counters belong on the device: a first version of this test used it and found them there."""
    import warnings

    path = str(tmp_path / "first.ckpt")
    x, y = make_classification(n=16 * 10)
    model = mlp()
    first = Trainer(
        model, torch.nn.CrossEntropyLoss(), torch.optim.Adam(model.parameters(), lr=1e-3), progress=False, device="cuda"
    )
    first.fit(make_loader(x, y, batch_size=16), epochs=1)
    first.save_checkpoint(path)
    counts = []
    for n_batches in (10, 80):
        x, y = make_classification(n=16 * n_batches)
        model = mlp()
        adam = torch.optim.Adam(model.parameters(), lr=1e-3)
        trainer = Trainer(
            model,
            torch.nn.CrossEntropyLoss(),
            adam,
            progress=False,
            refresh_interval=3600.0,
            timing_every=0,
            device="cuda",
        )
        loader = make_loader(x, y, batch_size=16)
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                trainer.fit(loader, epochs=2, resume_from=path)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        steps = [s["step"] for s in adam.state.values()]
        assert steps and all(s.device.type == "cpu" for s in steps), [s.device for s in steps]
        counts.append(sum("synchroniz" in str(w.message) for w in caught))
    assert counts[1] <= counts[0], f"syncs grew with the number of steps after a resume: {counts}"


@pytest.mark.parametrize("data", ["loader", "per-sample", "list"])
def test_a_data_map_adds_no_read_per_step(count_reads, data):
    """``DataMap()`` keeps each step's logits and index list and adds them up on the device when ``flush_rows`` wait
    (here every 4 batches, so the reduction runs mid-epoch many times): fits of 10 and 80 batches read equally often,
    through the batched fetch, the loader's own iterator and a list of batches."""
    from nbtrainer import DataMap

    totals = []
    for n_batches in (10, 80):
        x, y = make_classification(n=16 * n_batches)
        dm = DataMap(flush_rows=64)
        trainer = Trainer(
            mlp(),
            torch.nn.CrossEntropyLoss(),
            "sgd",
            lr=0.05,
            callbacks=[dm],
            progress=False,
            refresh_interval=3600.0,
            fast_fetch=data != "per-sample",
        )
        loader: Any = make_loader(x, y, batch_size=16, shuffle=True)
        if data == "list":
            loader = [(x[i : i + 16], y[i : i + 16]) for i in range(0, len(x), 16)]
        count_reads["n"] = 0
        trainer.fit(loader, epochs=2)
        totals.append(count_reads["n"])
        assert int(dm.visits.sum()) == 2 * len(x)  # it did record every item, after the counted fit
    assert totals[0] == totals[1], f"host reads grew with the number of steps: {totals}"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("data_on_device", [0.5, 0.0])
def test_cuda_data_map_adds_no_sync_per_step(data_on_device):
    """CUDA's own sync detector with a ``DataMap`` (reduced every 4 batches): a fit of 80 batches syncs no more often
    than one of 10, with the data on the device (indices copied asynchronously) or prefetched."""
    import warnings

    from nbtrainer import DataMap

    counts = []
    for n_batches in (10, 80):
        x, y = make_classification(n=16 * n_batches)
        dm = DataMap(flush_rows=64)
        trainer = Trainer(
            mlp(),
            torch.nn.CrossEntropyLoss(),
            "sgd",
            lr=0.05,
            callbacks=[dm],
            progress=False,
            refresh_interval=3600.0,
            timing_every=0,
            device="cuda",
            data_on_device=data_on_device,
        )
        loader = make_loader(x, y, batch_size=16, shuffle=True)
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                trainer.fit(loader, epochs=2)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        counts.append(sum("synchroniz" in str(w.message) for w in caught))
        assert int(dm.visits.sum()) == 2 * len(x) and bool((dm.given == y).all())
    assert counts[1] <= counts[0], f"syncs grew with the number of steps: {counts}"
