"""Batched fetch (issue 14): one indexing call per batch for DataLoaders over in-memory data.

Every run is compared with the same run on the loader's own per-sample iterator (``fast_fetch=False``):
final weights with ``torch.equal``, every history value but wall-clock ones, the per-step series, the
global RNG state and the sampler generator's state at the end. The model has dropout, so a generator
draw made differently (DataLoader's base seed, the sampler's permutation) would change the weights. Each
case also checks which path ran, from what the dataset saw: per-sample ``__getitem__`` calls or not.
"""

from __future__ import annotations

import dataclasses
import statistics

import pytest
import torch
from conftest import accuracy, make_classification
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from nbtrainer import Trainer
from nbtrainer._data._fetch import batched_fetch
from nbtrainer._data._prefetch import DataPath, choose_mode, fits_on_device

_CLOCK = ("time", "samples_per_s")


class Counting(TensorDataset):
    """A TensorDataset subclass (same reads) that counts per-sample reads: ``__getitem__`` is overridden,
    so the fast path must NOT treat it as a plain TensorDataset; used for the fallback cases."""

    calls = 0

    def __getitem__(self, index):
        Counting.calls += 1
        return super().__getitem__(index)


class Rows(Dataset):
    """A map-style dataset with ``__getitems__`` (returns a list of samples, as torch's contract says)."""

    def __init__(self, x, y, as_dict=False):
        self.x, self.y, self.as_dict = x, y, as_dict
        self.item_calls = self.items_calls = 0

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        self.item_calls += 1
        return {"x": self.x[i], "labels": self.y[i]} if self.as_dict else (self.x[i], self.y[i])

    def __getitems__(self, indices):
        self.items_calls += 1
        return [{"x": self.x[i], "labels": self.y[i]} if self.as_dict else (self.x[i], self.y[i]) for i in indices]


class DictModel(torch.nn.Module):
    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, x):
        return self.net(x)


class GlobalRNGBatches:
    """A custom batch sampler that draws from the global torch RNG for every batch (bucketing-style), so
    the interleaving of its draws with dropout's must be the loader's exactly."""

    def __init__(self, n, batch):
        self.n, self.batch = n, batch

    def __len__(self):
        return (self.n + self.batch - 1) // self.batch

    def __iter__(self):
        for start in range(0, self.n, self.batch):
            stop = min(start + self.batch, self.n)
            offset = int(torch.randint(0, stop - start, (1,)))
            yield [start + (k + offset) % (stop - start) for k in range(stop - start)]


def model_fn(seed=0, d=10):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(d, 16), torch.nn.Dropout(0.3), torch.nn.ReLU(), torch.nn.Linear(16, 3))


def _case(name):
    x, y = make_classification(n=150)
    xv, yv = make_classification(n=40, seed=1)
    val = DataLoader(TensorDataset(xv, yv), batch_size=16)
    g = torch.Generator().manual_seed(7)
    kw: dict = {}
    if name == "tensor-own-generator":
        loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True, generator=g)
    elif name == "tensor-no-generator":
        loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    elif name == "sequential":  # no sampler generator at all: the base-seed draw comes from the global RNG
        loader = DataLoader(TensorDataset(x, y), batch_size=16)
    elif name == "drop-last-accum":
        loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True, drop_last=True)
        kw["grad_accum_steps"] = 4
    elif name == "subset":
        train, _ = torch.utils.data.random_split(TensorDataset(x, y), [120, 30], generator=g)
        loader = DataLoader(train, batch_size=16, shuffle=True)
    elif name == "getitems":
        loader = DataLoader(Rows(x, y), batch_size=16, shuffle=True)
    elif name == "getitems-dict":
        loader = DataLoader(Rows(x, y, as_dict=True), batch_size=16, shuffle=True)
        val = DataLoader(Rows(xv, yv, as_dict=True), batch_size=16)
    elif name == "distributed-sampler":  # rank 1 of 2, shuffled, set_epoch by the trainer
        ds = TensorDataset(x, y)
        loader = DataLoader(ds, batch_size=16, sampler=DistributedSampler(ds, num_replicas=2, rank=1, seed=3))
    elif name == "weighted-sampler":
        sampler = torch.utils.data.WeightedRandomSampler((torch.rand(150, generator=g) + 0.1).tolist(), 150)
        loader = DataLoader(TensorDataset(x, y), batch_size=16, sampler=sampler)
    elif name == "custom-batch-sampler":
        loader = DataLoader(TensorDataset(x, y), batch_sampler=GlobalRNGBatches(150, 16))
    elif name == "batch-sampler-random":
        ds = TensorDataset(x, y)
        loader = DataLoader(ds, batch_sampler=BatchSampler(RandomSampler(ds, generator=g), 16, drop_last=False))
    else:  # pragma: no cover
        raise KeyError(name)
    return loader, val, kw


FAST_CASES = [
    "tensor-own-generator",
    "tensor-no-generator",
    "sequential",
    "drop-last-accum",
    "subset",
    "getitems",
    "getitems-dict",
    "distributed-sampler",
    "weighted-sampler",
    "custom-batch-sampler",
    "batch-sampler-random",
]


def _fit(name, fast, epochs=3, **extra):
    loader, val, kw = _case(name)
    net = model_fn()
    model = DictModel(net) if name == "getitems-dict" else net
    trainer = Trainer(
        model,
        torch.nn.CrossEntropyLoss(),
        torch.optim.Adam(model.parameters(), 1e-2),
        metrics={"acc": accuracy},
        seed=0,
        progress=False,
        device="cpu",
        fast_fetch=fast,
        refresh_interval=0.0,
        **kw,
        **extra,
    )
    history = trainer.fit(loader, val, epochs=epochs)
    sampler_gen = getattr(loader.sampler, "generator", None)
    return {
        "trainer": trainer,
        "history": history,
        "loader": loader,
        "rng": torch.get_rng_state(),
        "sampler_state": sampler_gen.get_state() if sampler_gen is not None else None,
    }


def assert_same(a, b, label):
    pa, pb = a["trainer"].model.parameters(), b["trainer"].model.parameters()
    assert all(torch.equal(p, q) for p, q in zip(pa, pb, strict=True)), f"{label}: weights differ"
    ha, hb = a["history"], b["history"]
    strip = [{k: v for k, v in row.items() if k not in _CLOCK} for row in ha.epochs]
    assert strip == [{k: v for k, v in row.items() if k not in _CLOCK} for row in hb.epochs], label
    assert ha.steps == hb.steps, f"{label}: per-step series"
    assert torch.equal(a["rng"], b["rng"]), f"{label}: global RNG state at the end"
    if a["sampler_state"] is not None:
        assert torch.equal(a["sampler_state"], b["sampler_state"]), f"{label}: sampler generator state"


@pytest.mark.parametrize("name", FAST_CASES)
def test_batched_fetch_is_bit_identical_to_the_loader(name, monkeypatch):
    reads = {"n": 0}
    original = TensorDataset.__getitem__

    def counting(self, index):  # torch's own TensorDataset, counted
        reads["n"] += 1
        return original(self, index)

    monkeypatch.setattr(TensorDataset, "__getitem__", counting)
    iterators = {"n": 0}
    single = torch.utils.data.dataloader._SingleProcessDataLoaderIter
    init = single.__init__

    def counting_init(self, loader):  # torch's DataLoader iterators, counted
        iterators["n"] += 1
        init(self, loader)

    monkeypatch.setattr(single, "__init__", counting_init)
    slow = _fit(name, fast=False)
    slow_reads, slow_iterators = reads["n"], iterators["n"]
    reads["n"] = iterators["n"] = 0
    fast = _fit(name, fast=True)
    assert_same(fast, slow, name)
    # 3 epochs of training + 3 validations + fit()'s peek at the first validation batch; the fast path
    # makes none but the peek (it reads the loader's own batch sampler instead)
    assert (slow_iterators, iterators["n"]) == (7, 1), name
    dataset = fast["loader"].dataset
    if isinstance(dataset, Rows):
        assert dataset.item_calls == 0 and dataset.items_calls == 3 * len(fast["loader"])
    else:
        # 16: the one validation batch fit() peeks at through the loader itself, before training
        peek = 0 if name == "getitems-dict" else 16
        assert slow_reads > peek and reads["n"] == peek, f"{name}: per-sample reads on the fast path: {reads['n']}"


def test_training_changes_with_the_order_so_the_comparison_can_fail():
    """The comparison above is sensitive: another shuffle seed gives other weights."""
    a = _fit("tensor-own-generator", fast=True, epochs=1)
    loader, val, _ = _case("tensor-own-generator")
    loader.sampler.generator.manual_seed(8)
    net = model_fn()
    trainer = Trainer(
        net, torch.nn.CrossEntropyLoss(), torch.optim.Adam(net.parameters(), 1e-2), seed=0, progress=False
    )
    trainer.fit(loader, val, epochs=1)
    assert not all(torch.equal(p, q) for p, q in zip(a["trainer"].model.parameters(), net.parameters(), strict=True))


def _loader(**kw):
    x, y = make_classification(n=64)
    return DataLoader(kw.pop("dataset", TensorDataset(x, y)), batch_size=8, **kw)


@pytest.mark.parametrize(
    "kind",
    [
        "custom-collate",
        "workers",
        "timeout",
        "no-auto-batching",
        "subclass-getitem",
        "plain-dataset",
        "iterable",
        "list",
    ],
)
def test_what_cannot_be_proven_equivalent_takes_the_loader(kind):
    x, y = make_classification(n=64)
    if kind == "custom-collate":
        loader = _loader(collate_fn=lambda samples: torch.utils.data.default_collate(samples))
    elif kind == "workers":
        loader = _loader(num_workers=2)
    elif kind == "timeout":  # a DataLoader refuses timeout= without workers when iterated: so must we
        loader = _loader(timeout=5)
    elif kind == "no-auto-batching":
        loader = DataLoader(TensorDataset(x, y), batch_size=None)
    elif kind == "subclass-getitem":
        loader = _loader(dataset=Counting(x, y))
    elif kind == "plain-dataset":  # only __getitem__: a dataset of files, augmentations...

        class Plain(Dataset):
            def __len__(self):
                return 64

            def __getitem__(self, i):
                return x[i], y[i]

        loader = _loader(dataset=Plain())
    elif kind == "iterable":

        class Stream(torch.utils.data.IterableDataset):
            def __iter__(self):
                return iter(zip(x, y, strict=True))

        loader = DataLoader(Stream(), batch_size=8)
    else:
        loader = [(x[:8], y[:8])]
    assert batched_fetch(loader) is None
    path = DataPath(loader, device=torch.device("cpu"), enabled=True, fraction=0.5)
    assert path.mode == "loader"


def test_custom_collate_runs_per_sample_and_trains():
    x, y = make_classification(n=64)
    Counting.calls = 0
    loader = DataLoader(Counting(x, y), batch_size=8, collate_fn=torch.utils.data.default_collate)
    net = model_fn()
    Trainer(net, torch.nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), 0.1), progress=False).fit(loader)
    assert Counting.calls == 64


def test_data_time_is_sampled_for_the_fast_path():
    """``Progress.step_times['data']`` (the panel's data share) is measured around the batched fetch: far
    smaller than the per-sample path's on large batches."""

    def sampled(fast):
        x, y = make_classification(n=512 * 12, d=32)
        loader = DataLoader(TensorDataset(x, y), batch_size=512, shuffle=True)
        seen = []

        class Grab:
            def on_refresh(self, trainer, progress):
                if progress.step_times is not None:
                    seen.append(progress.step_times["data"])

        net = model_fn(d=32)
        trainer = Trainer(
            net,
            torch.nn.CrossEntropyLoss(),
            torch.optim.SGD(net.parameters(), 0.1),
            progress=False,
            timing_every=1,
            refresh_interval=0.0,
            callbacks=[Grab()],
            fast_fetch=fast,
        )
        trainer.fit(loader, epochs=2)
        assert set(trainer.progress.step_times or {}) == {"data", "forward", "backward", "optimizer"}
        return seen

    fast, slow = sampled(True), sampled(False)
    assert len(fast) >= 20 and all(v > 0 for v in fast)
    assert statistics.median(fast) < 0.5 * statistics.median(slow), (statistics.median(fast), statistics.median(slow))


# -- on CUDA: where the data lives (decisions are pure Python, tested without a GPU) ------------------------
CUDA = torch.device("cuda")


def test_fits_on_device():
    assert fits_on_device(100, 1000, 0.5)
    assert fits_on_device(500, 1000, 0.5)
    assert not fits_on_device(501, 1000, 0.5)
    assert not fits_on_device(1, 10**12, 0.0)  # 0 disables
    assert fits_on_device(1000, 1000, 1.0)


def _no_query():
    raise AssertionError("free memory must not be queried here")


def test_device_resident_decision_given_free_memory():
    x, y = make_classification(n=64)  # 64 * 10 * 4 + 64 * 8 bytes
    nbytes = 64 * 10 * 4 + 64 * 8
    loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)
    fetch = batched_fetch(loader)
    assert fetch is not None and fetch.source is not None and fetch.source.nbytes == nbytes
    assert choose_mode(fetch, CUDA, 0.5, lambda: 2 * nbytes) == "device"
    assert choose_mode(fetch, CUDA, 0.5, lambda: 2 * nbytes - 1) == "pinned"
    assert choose_mode(fetch, CUDA, 0.0, lambda: 10**12) == "pinned"
    assert choose_mode(fetch, CUDA, 0.0, _no_query) == "pinned"  # evaluate / predict: data_on_device off
    assert choose_mode(fetch, torch.device("cpu"), 0.5, _no_query) == "batched"
    assert choose_mode(None, CUDA, 0.5, _no_query) == "loader"
    # the same through DataPath, with a fake free-memory figure
    assert DataPath(loader, device=CUDA, enabled=True, fraction=0.5, free_bytes=lambda: 10**9).mode == "device"
    assert DataPath(loader, device=CUDA, enabled=True, fraction=0.5, free_bytes=lambda: 10).mode == "pinned"
    assert DataPath(loader, device=CUDA, enabled=False, fraction=0.5, free_bytes=_no_query).mode == "loader"


def test_custom_sampler_is_never_indexed_on_the_gpu():
    """A custom sampler's indices are not known to be in range (a bad index on a GPU is a device-side
    assert), so its batches are gathered on the host, pinned, whatever the free memory."""
    x, y = make_classification(n=64)
    loader = DataLoader(TensorDataset(x, y), batch_sampler=GlobalRNGBatches(64, 8))
    assert choose_mode(batched_fetch(loader), CUDA, 1.0, lambda: 10**12) == "pinned"
    weighted = torch.utils.data.WeightedRandomSampler([1.0] * 80, 64)  # weights longer than the data
    loader = DataLoader(TensorDataset(x, y), batch_size=8, sampler=weighted)
    assert choose_mode(batched_fetch(loader), CUDA, 1.0, lambda: 10**12) == "pinned"
    # stock samplers over this dataset (and a Subset of it) are in range
    sub = torch.utils.data.Subset(TensorDataset(x, y), list(range(10, 50)))
    for loader in (
        DataLoader(sub, batch_size=8, shuffle=True),
        DataLoader(sub, batch_size=8),
        DataLoader(sub, batch_size=8, sampler=DistributedSampler(sub, num_replicas=2, rank=0)),
    ):
        assert choose_mode(batched_fetch(loader), CUDA, 1.0, lambda: 10**12) == "device"


def test_generic_getitems_dataset_is_not_copied_to_the_device():
    x, y = make_classification(n=64)
    loader = DataLoader(Rows(x, y), batch_size=8, shuffle=True)
    assert choose_mode(batched_fetch(loader), CUDA, 1.0, _no_query) == "batched"


def test_subset_with_out_of_range_indices_keeps_the_loader_error():
    x, y = make_classification(n=16)
    loader = DataLoader(torch.utils.data.Subset(TensorDataset(x, y), [0, 5, 99]), batch_size=2)
    fetch = batched_fetch(loader)
    assert fetch is None or fetch.source is None
    with pytest.raises(IndexError):
        list(DataPath(loader, device=torch.device("cpu"), enabled=True, fraction=0.5))


def test_negative_indices_follow_python_indexing():
    """index_select refuses negative indices; dataset[i] accepts them: the fast path must too."""
    x, y = make_classification(n=16)

    class Backwards:
        def __len__(self):
            return 2

        def __iter__(self):
            return iter([[-1, -2, 3], [0, -16]])

    for dataset in (TensorDataset(x, y), torch.utils.data.Subset(TensorDataset(x, y), list(range(-1, -17, -1)))):
        loader = DataLoader(dataset, batch_sampler=Backwards())
        fast = list(DataPath(loader, device=torch.device("cpu"), enabled=True, fraction=0.5))
        slow = list(iter(loader))
        assert len(fast) == len(slow) == 2
        for a, b in zip(fast, slow, strict=True):
            assert type(a) is type(b) is list
            assert all(torch.equal(p, q) and p.dtype == q.dtype for p, q in zip(a, b, strict=True))


def test_data_already_on_an_accelerator_is_sliced_there_only_with_in_range_indices():
    meta = TensorDataset(torch.empty(64, 10, device="meta"), torch.empty(64, device="meta"))
    shuffled = DataLoader(meta, batch_size=8, shuffle=True)
    custom = DataLoader(meta, batch_sampler=GlobalRNGBatches(64, 8))
    meta_device = torch.device("meta")
    assert choose_mode(batched_fetch(shuffled), meta_device, 0.5, _no_query) == "device"
    assert choose_mode(batched_fetch(custom), meta_device, 0.5, _no_query) == "loader"
    assert choose_mode(batched_fetch(shuffled), torch.device("cpu"), 0.5, _no_query) == "loader"


# -- on a real GPU -----------------------------------------------------------------------------------------
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _cuda_fit(fast, fraction, sampler="shuffle", epochs=2, device="cuda"):
    x, y = make_classification(n=600, d=10)
    ds = TensorDataset(x, y)
    if sampler == "custom":
        loader = DataLoader(ds, batch_sampler=GlobalRNGBatches(600, 32))
    else:
        loader = DataLoader(ds, batch_size=32, shuffle=True, generator=torch.Generator().manual_seed(1))
    val = DataLoader(TensorDataset(*make_classification(n=100, seed=1)), batch_size=32)
    modes = []

    class Mode:
        def on_fit_start(self, trainer):
            modes.append(trainer.run_state.loop.train_data.mode)

    net = model_fn()
    trainer = Trainer(
        net,
        torch.nn.CrossEntropyLoss(),
        torch.optim.Adam(net.parameters(), 1e-2),
        seed=0,
        deterministic=True,
        progress=False,
        device=device,
        fast_fetch=fast,
        data_on_device=fraction,
        callbacks=[Mode()],
    )
    history = trainer.fit(loader, val, epochs=epochs)
    weights = {k: v.detach().cpu().clone() for k, v in trainer.model_state_dict().items()}
    return weights, history, modes


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize(
    ("fraction", "sampler", "mode"), [(0.5, "shuffle", "device"), (0.0, "shuffle", "pinned"), (0.5, "custom", "pinned")]
)
def test_cuda_paths_are_bit_identical(fraction, sampler, mode):
    ref, h_ref, _ = _cuda_fit(False, fraction, sampler)
    got, h_got, modes = _cuda_fit(True, fraction, sampler)
    assert modes == [mode]
    assert all(torch.equal(ref[k], got[k]) for k in ref)
    assert [r["val_loss"] for r in h_ref.epochs] == [r["val_loss"] for r in h_got.epochs]


def test_prefetch_orders_copies_waits_and_record_stream(monkeypatch):
    """The side-stream protocol, with torch.cuda's stream calls replaced by recorders (no GPU here): batch
    i+1 is fetched and its copy queued on the side stream only AFTER the compute stream was told to wait
    for batch i's copy, and every tensor of batch i is record_stream-ed on the compute stream before the
    step gets it. (The real streams run in the GPU tests.)"""
    import contextlib

    from nbtrainer._data import _prefetch

    log: list[str] = []

    class Stream:
        def __init__(self, name):
            self.name = name

        def wait_stream(self, other):
            log.append(f"{self.name}.wait({other.name})")

    main, side = Stream("main"), Stream("side")

    @contextlib.contextmanager
    def on_stream(stream):
        log.append(f"enter {stream.name}")
        yield
        log.append(f"exit {stream.name}")

    monkeypatch.setattr(torch.cuda, "stream", on_stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: main)
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda t, s: log.append(f"record {int(t[0])} on {s.name}"))

    @dataclasses.dataclass
    class Extra:
        z: torch.Tensor

    def batches():  # every container move_to_device rebuilds: each tensor must be recorded
        for i in range(3):
            log.append(f"fetch {i}")
            yield [torch.tensor([i]), {"y": torch.tensor([i])}, Extra(torch.tensor([i]))]

    out = []
    # `side` stands in for a torch.cuda.Stream (the real streams run in the GPU tests)
    for batch in _prefetch.prefetch(batches(), torch.device("cpu"), side):  # type: ignore[arg-type]
        log.append(f"step {int(batch[0][0])}")
        out.append(batch)
    assert [int(b[0][0]) for b in out] == [0, 1, 2]
    assert log == [
        "fetch 0", "enter side", "exit side",
        "main.wait(side)", "record 0 on main", "record 0 on main", "record 0 on main",
        "fetch 1", "enter side", "exit side",  # queued after the wait: overlaps step 0
        "step 0",
        "main.wait(side)", "record 1 on main", "record 1 on main", "record 1 on main",
        "fetch 2", "enter side", "exit side",
        "step 1",
        "main.wait(side)", "record 2 on main", "record 2 on main", "record 2 on main",
        "step 2",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("kw", "exc", "pattern"),
    [
        ({"fast_fetch": "yes"}, TypeError, r"fast_fetch must be True or False, got 'yes'"),
        ({"data_on_device": 1.5}, ValueError, r"data_on_device must be a fraction .* \[0, 1\] \(0: never"),
        ({"data_on_device": True}, ValueError, r"data_on_device must be a fraction"),
    ],
)
def test_data_options_are_checked_when_the_trainer_is_built(kw, exc, pattern):
    net = model_fn()
    with pytest.raises(exc, match=pattern):
        Trainer(net, torch.nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), 0.1), progress=False, **kw)
