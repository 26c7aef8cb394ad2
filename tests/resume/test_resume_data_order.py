"""Resume mid-epoch when the data order or the workers' seeds come from torch's global RNG, and the refusal of a
loader on which the saved position (a count of batches) would not mean the same samples.

Each run: 100 samples in batches of 16 (7 batches an epoch), 2 epochs, stopped after optimizer step 9 (2 batches
into epoch 2), saved, and resumed by a new Trainer with another seed; compared with the uninterrupted run.
"""

from __future__ import annotations

import pytest
import torch
from conftest import make_classification

from nbtrainer import CheckpointError, Trainer

N, BS, STOP = 100, 16, 9
X, Y = make_classification(n=N)


def _trainer(seed: int = 0, device: str = "cpu") -> Trainer:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.Dropout(0.2), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return Trainer(model, torch.nn.CrossEntropyLoss(), opt, seed=seed, progress=False, device=device, run_store=False)


def _same_as_uninterrupted(
    make_loader, tmp_path, *, stop_at: int = STOP, device: str = "cpu"
) -> tuple[Trainer, Trainer]:
    full = _trainer(device=device)
    full.fit(make_loader(), epochs=2)
    stopped = _trainer(device=device)
    stopped.fit(make_loader(), epochs=2, max_steps=stop_at)
    path = stopped.save_checkpoint(str(tmp_path / "mid.ckpt"))
    resumed = _trainer(seed=7, device=device)
    resumed.fit(make_loader(), epochs=2, resume_from=path)
    assert full.global_step == resumed.global_step == 14
    return full, resumed


def _equal(a: Trainer, b: Trainer) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a.model.parameters(), b.model.parameters(), strict=True))


class _GlobalShuffle(torch.utils.data.Sampler):
    """Shuffles with torch's global RNG (no ``generator`` attribute)."""

    def __len__(self) -> int:
        return N

    def __iter__(self):
        return iter(torch.randperm(N).tolist())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_shuffled_loader_resumes_mid_epoch_on_cuda(tmp_path):
    """A checkpoint is loaded onto the training device, so the sampler generator's saved state arrived as a CUDA
    tensor, which Generator.set_state refuses: the first H200 soak failed 2 of 4 resumes on "RNG state must be a
    torch.ByteTensor"."""
    ds = torch.utils.data.TensorDataset(X, Y)
    full, resumed = _same_as_uninterrupted(
        lambda: torch.utils.data.DataLoader(ds, batch_size=BS, shuffle=True), tmp_path, device="cuda"
    )
    assert _equal(full, resumed)


def test_custom_sampler_on_the_global_rng_resumes_exactly(tmp_path):
    ds = torch.utils.data.TensorDataset(X, Y)
    full, resumed = _same_as_uninterrupted(
        lambda: torch.utils.data.DataLoader(ds, batch_size=BS, sampler=_GlobalShuffle()), tmp_path
    )
    assert _equal(full, resumed)


class _Stream(torch.utils.data.IterableDataset):
    """A stream shuffled each epoch with torch's global RNG (a shuffle buffer's way), recording what it yields."""

    def __init__(self, seen: list[int], n: int = N) -> None:
        self.seen, self.n = seen, n

    def __iter__(self):
        for i in torch.randperm(self.n).tolist():
            self.seen.append(i)
            yield X[i], Y[i]


def test_iterable_dataset_on_the_global_rng_resumes_with_the_rest_of_the_epoch(tmp_path):
    seen_full: list[int] = []
    full = _trainer()
    full.fit(torch.utils.data.DataLoader(_Stream(seen_full), batch_size=BS), epochs=2)
    stopped = _trainer()
    stopped.fit(torch.utils.data.DataLoader(_Stream([]), batch_size=BS), epochs=2, max_steps=STOP)
    path = stopped.save_checkpoint(str(tmp_path / "mid.ckpt"))
    seen: list[int] = []
    resumed = _trainer(seed=7)
    resumed.fit(torch.utils.data.DataLoader(_Stream(seen), batch_size=BS), epochs=2, resume_from=path)
    # epoch 2 replayed in the uninterrupted run's order: its first 2 batches skipped, the rest trained
    assert seen == seen_full[N:]
    assert _equal(full, resumed)


class _Augmented(torch.utils.data.Dataset):
    """Noise drawn in ``__getitem__`` (in a worker: seeded from the loader's base seed)."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, i):
        return X[i] + 0.1 * torch.randn(10), Y[i]


def test_workers_augmenting_with_a_sampler_of_its_own_generator_resume_exactly(tmp_path):
    """The sampler has a generator, the DataLoader none: the workers' seeds follow the run, not the fresh trainer."""

    def loader():
        sampler = torch.utils.data.WeightedRandomSampler([1.0] * N, N, generator=torch.Generator().manual_seed(3))
        return torch.utils.data.DataLoader(_Augmented(), batch_size=BS, sampler=sampler, num_workers=1)

    full, resumed = _same_as_uninterrupted(loader, tmp_path)
    assert _equal(full, resumed)


def test_a_sampler_of_its_own_generator_seeds_the_workers_too():
    """The workers' base seed is drawn from the generator the order is saved with, not from the global RNG; the
    loader gets its own value back at the epoch's end."""
    from nbtrainer._data._order import ShuffleOrder

    gen = torch.Generator().manual_seed(3)
    sampler = torch.utils.data.WeightedRandomSampler([1.0] * N, N, generator=gen)
    loader = torch.utils.data.DataLoader(_Augmented(), batch_size=BS, sampler=sampler)
    order = ShuffleOrder(loader)
    assert order.lend() is gen and loader.generator is gen and sampler.generator is gen
    order.give_back()
    assert loader.generator is None and sampler.generator is gen


# -- a mid-epoch position only fits the loader it was saved with -------------------------------------------------
def _shuffled(n: int = N, batch_size: int = BS) -> torch.utils.data.DataLoader:
    ds = torch.utils.data.TensorDataset(X[:n], Y[:n])
    gen = torch.Generator().manual_seed(4)
    return torch.utils.data.DataLoader(ds, batch_size=batch_size, shuffle=True, generator=gen)


def _saved_at(tmp_path, stop_at: int, **loader) -> str:
    stopped = _trainer()
    stopped.fit(_shuffled(**loader), epochs=2, max_steps=stop_at)
    return stopped.save_checkpoint(str(tmp_path / f"at{stop_at}.ckpt"))


@pytest.mark.parametrize(
    ("loader", "said"),
    [
        ({"batch_size": 32}, "7 batches of 16 (100 samples) an epoch; this one has 4 batches of 32 (100 samples)"),
        ({"n": 40}, "7 batches of 16 (100 samples) an epoch; this one has 3 batches of 16 (40 samples)"),
        ({"n": 97}, "7 batches of 16 (100 samples) an epoch; this one has 7 batches of 16 (97 samples)"),
    ],
)
def test_a_mid_epoch_resume_on_another_loader_is_refused_before_anything_loads(tmp_path, loader, said):
    path = _saved_at(tmp_path, STOP)
    trainer = _trainer(seed=7)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    with pytest.raises(CheckpointError) as err:
        trainer.fit(_shuffled(**loader), epochs=2, resume_from=path)
    msg = str(err.value)
    assert "is 2 batch(es) into epoch 2" in msg and said in msg, msg
    assert "original DataLoader settings (batch_size=16" in msg and "epoch's end" in msg
    assert _equal_to(before, trainer)
    with pytest.raises(CheckpointError, match="this one has 4 batches of 32"):  # fit_more checks it too
        _trainer(seed=7).fit_more(_shuffled(batch_size=32), epochs=1, resume_from=path, scheduler=None)
    stopped = _trainer()
    stopped.fit(_shuffled(), epochs=2, max_steps=STOP)
    with pytest.raises(CheckpointError, match="this one has 4 batches of 32"):  # and in place
        stopped.fit_more(_shuffled(batch_size=32), epochs=1)


def _equal_to(weights: list[torch.Tensor], trainer: Trainer) -> bool:
    return all(torch.equal(p, q) for p, q in zip(weights, trainer.model.parameters(), strict=True))


def test_an_epoch_boundary_resume_takes_another_batch_size(tmp_path):
    path = _saved_at(tmp_path, 7)  # epoch 1 complete
    history = _trainer(seed=7).fit(_shuffled(batch_size=32), epochs=2, resume_from=path)
    assert history.status == "finished" and history.epochs[-1]["steps"] == 7 + 4


def _without_new_fields(path: str) -> str:
    """The checkpoint as a version before ``epoch_rng`` and ``loader_size`` were saved wrote it."""
    ckpt = torch.load(path, weights_only=True)
    for key in ("epoch_rng", "loader_size"):
        ckpt["loop"].pop(key, None)
    old = path.replace(".ckpt", "-old.ckpt")
    torch.save(ckpt, old)
    return old


def test_a_checkpoint_without_the_new_fields_resumes_as_before(tmp_path):
    full = _trainer()
    full.fit(_shuffled(), epochs=2)
    old = _without_new_fields(_saved_at(tmp_path, STOP))
    resumed = _trainer(seed=7)
    resumed.fit(_shuffled(), epochs=2, resume_from=old)
    assert _equal(full, resumed)  # the order is the sampler generator's: exact as it always was
    # on a loader that ends before the saved position: a clear error, not a bare StopIteration
    old = _without_new_fields(_saved_at(tmp_path, 6))
    with pytest.raises(
        CheckpointError, match=r"resumes 6 batch\(es\) into an epoch, and this training loader has only 3"
    ):
        _trainer(seed=7).fit(_shuffled(n=40), epochs=2, resume_from=old)


def test_a_stream_shorter_than_the_saved_position_is_a_clear_error(tmp_path):
    """Without len() the sizes cannot be compared up front: the replay tells it."""
    stopped = _trainer()
    stopped.fit(torch.utils.data.DataLoader(_Stream([]), batch_size=BS), epochs=2, max_steps=6)
    path = stopped.save_checkpoint(str(tmp_path / "stream.ckpt"))
    short = torch.utils.data.DataLoader(_Stream([], n=60), batch_size=BS)  # 4 batches: the position is batch 6
    with pytest.raises(CheckpointError, match=r"resumes 6 batch\(es\) into an epoch.*has only 4"):
        _trainer(seed=7).fit(short, epochs=2, resume_from=path)
