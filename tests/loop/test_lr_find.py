"""LR finder: suggestions inside a known-good range, early stop on divergence, state restored exactly."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from conftest import make_classification, make_loader, mlp, needs
from torch import nn

from nbtrainer import LRFinderResult, Trainer
from nbtrainer._loop._lr_find import suggest


def _regression(seed: int = 0, n: int = 256, d: int = 10):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g) * torch.linspace(0.5, 2.0, d)
    y = x @ torch.randn(d, 1, generator=g) + 0.5
    xa = torch.cat([x, torch.ones(n, 1)], dim=1)  # the bias is a parameter too
    # MSE's Hessian is 2 X^T X / n; gradient descent diverges for lr > 2 / L
    L = torch.linalg.eigvalsh(2 * xa.T @ xa / n).max().item()
    return x, y, 2.0 / L


@pytest.mark.parametrize("batch_size", [256, 64])
def test_suggestion_falls_in_the_known_good_range_of_linear_regression(batch_size):
    x, y, diverge_lr = _regression()
    torch.manual_seed(0)
    model = nn.Linear(x.shape[1], 1)
    trainer = Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.01), progress=False)
    result = trainer.lr_find(make_loader(x, y, batch_size=batch_size, shuffle=True), min_lr=1e-7, max_lr=10, steps=100)
    assert isinstance(result, LRFinderResult)
    good = (diverge_lr / 100, diverge_lr)  # below divergence, and not uselessly small
    for rule, lr in result.suggestions.items():
        assert good[0] < lr < good[1], (rule, lr, good)
    assert result.suggestion == result.suggestions["valley"]
    # the sweep went past 2/L, saw the loss blow up and stopped before max_lr
    assert result.stopped_early and "diverged" in result.stop_reason
    assert len(result.lrs) < 100 and result.lrs[-1] > diverge_lr
    assert result.lrs[0] == pytest.approx(1e-7)
    ratios = [b / a for a, b in itertools.pairwise(result.lrs)]
    assert max(ratios) == pytest.approx(min(ratios)) == pytest.approx(1e8 ** (1 / 99))


def _snapshot(trainer):
    model = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    opt = trainer.optimizer.state_dict()
    state = {
        id_: {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in s.items()}
        for id_, s in opt["state"].items()
    }
    groups = [{k: v for k, v in g.items() if k != "params"} for g in opt["param_groups"]]
    return model, state, groups


def test_arrays_sweep_as_fit_trains_on_them():
    # fit((x, y), batch_size=64) trains on arrays; lr_find refused batch_size= and, given (x, y) alone, iterated the
    # tuple: "The batch has no targets" about x, a (256, 10) tensor taken for one batch
    x, y, _ = _regression()
    results = []
    for data, kw in (((x, y), {"batch_size": 64, "shuffle": False}), (make_loader(x, y, batch_size=64), {})):
        torch.manual_seed(0)
        model = nn.Linear(x.shape[1], 1)
        trainer = Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.01), progress=False)
        results.append(trainer.lr_find(data, min_lr=1e-5, max_lr=1, steps=20, **kw))
    assert results[0].losses == results[1].losses and results[0].suggestion == results[1].suggestion
    with pytest.raises(TypeError, match=r"no batch_size was given.*lr_find\(\(x, y\), batch_size=32\)"):
        trainer.lr_find((x, y))


def test_model_optimizer_and_data_order_are_restored():
    x, y = make_classification(n=128)

    def build():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(10, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 3))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.05)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
        return Trainer(model, nn.CrossEntropyLoss(), opt, scheduler=sched, progress=False)

    loader_a = make_loader(x, y, batch_size=16, shuffle=True, seed=1)
    loader_b = make_loader(x, y, batch_size=16, shuffle=True, seed=1)
    a, b = build(), build()
    torch.manual_seed(123)  # dropout draws from the global RNG: the sweep must give it back too
    a.fit(loader_a, epochs=1)
    before = _snapshot(a)
    assert before[1], "the optimizer has state to restore"
    result = a.lr_find(loader_a, steps=30, max_lr=100.0)
    assert len(result.lrs) >= 5 and "model" in result.restored
    after = _snapshot(a)
    for k, v in before[0].items():
        assert torch.equal(after[0][k], v), k
    assert before[1].keys() == after[1].keys()
    for pid, s in before[1].items():
        for k, v in s.items():
            assert torch.equal(torch.as_tensor(after[1][pid][k]), torch.as_tensor(v)), (pid, k)
    assert after[2] == before[2]  # lr, initial_lr, betas, weight decay...
    assert a.model.training
    assert all(p.grad is None for p in a.model.parameters())
    # ... and the next fit is exactly the fit that would have happened without the sweep
    a.fit(loader_a, epochs=1)
    torch.manual_seed(123)
    b.fit(loader_b, epochs=1)
    b.fit(loader_b, epochs=1)
    for (name, pa), pb in zip(a.model.named_parameters(), b.model.parameters(), strict=True):
        assert torch.equal(pa, pb), name


def test_each_module_keeps_its_training_flag():
    x, y = make_classification(n=128)
    model = nn.Sequential(nn.Linear(10, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))
    trainer = Trainer(model, nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=0.1), progress=False)
    model[1].eval()  # a frozen BatchNorm inside a training model stays frozen
    trainer.lr_find(make_loader(x, y, batch_size=16), steps=6)
    assert [m.training for m in model.modules()] == [True, True, False, True, True]
    model.eval()
    trainer.lr_find(make_loader(x, y, batch_size=16), steps=6)
    assert not any(m.training for m in model.modules())


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.fc2, self.head = nn.Linear(10, 64), nn.Linear(64, 64), nn.Linear(64, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


@needs("bitsandbytes", "peft")
def test_a_quantized_base_is_restored_and_the_next_fit_unchanged():
    # a QLoRA model's state dict has keys (weight.absmax, quant_map...) that load_state_dict does not take back
    x, y = make_classification(n=128)
    loader = make_loader(x, y, batch_size=32)

    def build() -> Trainer:
        return Trainer(
            _Net(), nn.CrossEntropyLoss(), "adamw", lr=1e-2, quantize="nf4",
            lora={"r": 4, "target_modules": ["fc1", "fc2"]}, trainable=["head.*"], progress=False, seed=0,
        )  # fmt: skip

    swept, twin = build(), build()
    for t in (swept, twin):
        t.fit(loader, epochs=1)
    result = swept.lr_find(loader, steps=8, max_lr=10.0)
    assert len(result.lrs) >= 2 and "model" in result.restored
    for t in (swept, twin):  # the next fit is the fit that would have happened without the sweep
        t.fit(loader, epochs=1)
    a, b = swept.model_state_dict(), twin.model_state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_restored_even_when_the_sweep_fails():
    model = nn.Linear(10, 3)
    trainer = Trainer(model, nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=0.1), progress=False)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    calls = []

    def loader():
        for i in range(100):
            calls.append(i)
            if i == 7:
                raise RuntimeError("bad batch")
            yield torch.randn(8, 10), torch.randint(0, 3, (8,))

    class Loader:
        def __iter__(self):
            return loader()

    with pytest.raises(RuntimeError, match="bad batch"):
        trainer.lr_find(Loader(), steps=20)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())
    assert trainer.current_lr == 0.1


def test_result_table_chart_and_argument_checks():
    x, y = make_classification(n=64)
    model = nn.Linear(10, 3)
    trainer = Trainer(
        model, nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=0.1), progress=False, grad_accum_steps=2
    )
    result = trainer.lr_find(make_loader(x, y, batch_size=16), steps=20, max_lr=1.0)
    frame = result.to_pandas()
    assert list(frame.columns) == ["lr", "loss", "smoothed"] and len(frame) == len(result.lrs)
    page = result._repr_html_()
    assert "<svg" in page and "</svg>" in page and "valley" in page
    assert set(result.alternatives) == {"steepest", "minimum/10"}
    assert "LRFinderResult(suggestion=" in repr(result)
    for bad in ({"min_lr": 1.0, "max_lr": 0.1}, {"steps": 2}, {"rule": "median"}):
        with pytest.raises(ValueError):
            trainer.lr_find(make_loader(x, y), **bad)


def test_suggest_rules_on_a_synthetic_curve():
    lrs = [10 ** (-6 + 6 * i / 99) for i in range(100)]
    # flat at 2, falls between 1e-4 and 1e-2 (steepest at 1e-3), minimum near 1e-1, then rises
    losses = [2 - 1.5 / (1 + math.exp(-3 * (math.log10(lr) + 3))) + 4 * max(0.0, math.log10(lr) + 1) ** 2 for lr in lrs]
    s = suggest(lrs, losses)
    steepest, valley, tenth = s["steepest"], s["valley"], s["minimum/10"]
    assert steepest is not None and valley is not None and tenth is not None
    assert 3e-4 < steepest < 3e-3
    assert 1e-4 < valley < 1e-1
    assert 3e-3 < tenth < 3e-2
    assert suggest(lrs[:2], losses[:2]) == {"valley": None, "steepest": None, "minimum/10": None}


def test_python_and_numpy_generators_are_restored_for_the_next_fit():
    # an augmentation drawing from random / numpy.random (albumentations does) moved those generators during the
    # sweep: torch's were forked and put back, these were not, so the fit after lr_find saw other noise than the
    # fit without it
    import random

    import numpy as np

    x, y = make_classification(n=128)

    class Noisy(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(x)

        def __getitem__(self, i: int):
            return x[i] + random.random() + float(np.random.rand()), y[i]

    weights = []
    for sweep in (True, False):
        model = mlp()
        trainer = Trainer(model, nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=0.05), progress=False)
        loader = torch.utils.data.DataLoader(Noisy(), batch_size=32)
        random.seed(0)
        np.random.seed(0)
        if sweep:
            trainer.lr_find(loader, steps=10, max_lr=1.0)
        trainer.fit(loader, epochs=1)
        weights.append(trainer.model_state_dict())
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


@pytest.mark.parametrize(
    "bad,match",
    [
        ({"max_lr": math.inf}, "both finite"),
        ({"diverge": 1.0}, "diverge must be a number > 1"),
        ({"diverge": 0.5}, "diverge must be a number > 1"),
        ({"diverge": math.nan}, "diverge must be a number > 1"),
    ],
)
def test_a_sweep_that_cannot_give_a_curve_is_refused_before_a_step(bad, match):
    # max_lr=inf swept to lr=inf ("loss not finite", no suggestion); diverge <= 1 stopped at the second step on any
    # loss ("diverged at lr=1.20e-7", no suggestion): both ran steps and returned nothing usable, without an error
    x, y = make_classification(n=64)
    model = mlp()
    trainer = Trainer(model, nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=0.1), progress=False)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=match):
        trainer.lr_find(make_loader(x, y, batch_size=16), steps=20, **bad)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())
    assert trainer.run_state.lr_finder is None


def test_a_short_last_micro_batch_is_weighted_by_its_size_as_fit_weighs_it():
    # 80 samples in batches of 32, 32 and 16, accumulated 3 at a time: fit weighs each micro-batch by its items (one
    # step over the 80 samples' mean); the sweep averaged the three losses alike, the 16 samples counted double
    x, y = make_classification(n=80)
    loader = make_loader(x, y, batch_size=32)
    lr = 1e-3

    def trainer():
        model = mlp()
        sgd = torch.optim.SGD(model.parameters(), lr=lr)
        return Trainer(model, nn.CrossEntropyLoss(), sgd, progress=False, grad_accum_steps=3), model

    fitted, model = trainer()
    history = fitted.fit(loader, epochs=1)
    assert history.steps["step"] == [1]  # the three batches are one window
    swept, swept_model = trainer()
    after_first: list[list[torch.Tensor]] = []

    def keep_first(opt, args, kwargs):
        if not after_first:
            after_first.append([p.detach().clone() for p in swept_model.parameters()])

    swept.optimizer.register_step_post_hook(keep_first)
    result = swept.lr_find(loader, min_lr=lr, max_lr=1.0, steps=5)  # its first step at min_lr
    assert result.lrs[0] == lr
    for a, b in zip(after_first[0], model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert result.losses[0] == history.steps["loss"][0]
