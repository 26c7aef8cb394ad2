"""Health's reference cases, each reported within 50 steps of its cause, with the advice an engineer can act on;
and the healthy runs beside them, which must stay quiet."""

from __future__ import annotations

import math
import random
import statistics
import time

import pytest
import torch
from conftest import PoisonNet, make_classification, make_loader, mlp, poisoned_loader

from nbtrainer import Health, HealthReport, Trainer
from nbtrainer._health import SignalState
from nbtrainer._health._advice import round_readable
from nbtrainer._health._health_report import readable
from nbtrainer._health._loss_watch import LossWatch


def _reports(history) -> list[HealthReport]:
    return [HealthReport.from_dict(r) for r in history.health["reports"]]


def _problems(history) -> list[HealthReport]:
    return [r for r in _reports(history) if r.level == "problem"]


# -- LR set 100x too high ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,lr", [("sgd", 0.05), ("adamw", 1e-3)], ids=["sgd", "adamw"])
def test_lr_100x_too_high_is_reported_within_50_steps_with_a_lower_lr(name, lr):
    x, y = make_classification(n=3200, d=10)
    found = {}
    for factor in (1, 100):
        model = mlp(hidden=64)
        trainer = Trainer(
            model, torch.nn.CrossEntropyLoss(), name, lr=lr * factor, callbacks=[Health()], progress=False, seed=0
        )
        found[factor] = _problems(trainer.fit(make_loader(x, y, batch_size=32, shuffle=True), epochs=1))
    assert found[1] == []  # the sane LR: no problem at all
    first = found[100][0]
    assert first.step <= 50, first
    assert first.kind == "update_ratio"
    # computed from the measurement: scaled to move the weights by 1% a step, rounded to 1, 2 or 5 x 10^k
    ratio = first.data["update_ratio"]
    assert first.data["lr"] == pytest.approx(round_readable(lr * 100 * 0.01 / ratio))
    assert lr / 10 <= first.data["lr"] <= lr * 10  # back near the sane LR
    assert f"{ratio:.0%} of their norm at LR {readable(lr * 100)}" in first.advice and "rounded to" in first.advice
    assert first.action == f"apply LR {readable(first.data['lr'])}"


def test_lr_advice_takes_the_lr_finders_valley():
    x, y = make_classification(n=3200, d=10)
    model = mlp(hidden=64)
    trainer = Trainer(model, torch.nn.CrossEntropyLoss(), "sgd", lr=5.0, callbacks=[Health()], progress=False, seed=0)
    loader = make_loader(x, y, batch_size=32, shuffle=True)
    result = trainer.lr_find(loader, steps=40)
    valley = result.suggestions["valley"]
    assert valley is not None and valley < 5.0
    first = _problems(trainer.fit(loader, epochs=1))[0]
    assert first.data["lr"] == pytest.approx(valley)  # the ratio's LR is higher: the valley bounds it
    assert f"kept at the LR finder's valley {readable(valley)}" in first.advice


# -- a module that produces NaN for one batch -------------------------------------------------------------------
def test_a_nan_from_one_module_is_located_on_the_batch_that_made_it():
    """on_nonfinite="skip": the bad window is skipped, Health runs its batch again with hooks and names the module,
    the step, the batch and the epoch, at that very step (0 steps after the cause)."""
    model = PoisonNet()
    weights: dict[int, torch.Tensor] = {}

    class Watch:
        def on_optimizer_step(self, trainer, step, skipped):
            weights[step] = model.head.weight.detach().clone()

    trainer = Trainer(
        model,
        torch.nn.CrossEntropyLoss(),
        torch.optim.SGD(model.parameters(), lr=0.05),
        callbacks=[Health(), Watch()],
        on_nonfinite="skip",
        progress=False,
    )
    history = trainer.fit(poisoned_loader(batch=17), epochs=2)
    nonfinite = [r for r in _reports(history) if r.kind == "nonfinite"]
    first = nonfinite[0]
    assert first.step == 18 and first.epoch == 1 and first.data["batch"] == 17
    assert first.message == "NaN first appears in the output of layers.0.1 (Fragile) at step 18, batch 17 of epoch 1."
    assert first.data["module"] == "layers.0.1" and first.data["module_type"] == "Fragile"
    assert torch.equal(weights[18], weights[17])  # the step was skipped: the weights did not move
    assert torch.isfinite(model.head.weight).all()
    # epoch 2 meets the same batch at step 82, skipped again and counted, not told again within window=100 steps
    assert len(nonfinite) == 1 and history.status == "finished"
    assert history.epochs[-1]["skipped_steps"] == 2
    assert trainer.callbacks.callbacks[1].signals["non-finite"].summary == "2 step(s) skipped, the last at step 82"


def test_a_nan_under_raise_is_reported_with_what_to_do():
    model = PoisonNet()
    trainer = Trainer(
        model,
        torch.nn.CrossEntropyLoss(),
        torch.optim.SGD(model.parameters(), lr=0.05),
        callbacks=[Health()],
        progress=False,
        refresh_interval=0.0,  # the loss is read after every batch: the error comes at the bad step
    )
    with pytest.raises(Exception, match="non-finite"):
        trainer.fit(poisoned_loader(batch=3), epochs=1)
    (report,) = _reports(trainer.history)
    assert report.kind == "nonfinite" and report.step == 4
    assert "on_nonfinite='skip'" in report.advice
    # the step that raised updated the weights with NaN: the action goes back to the weights Health kept before
    # step 1 (the LR did not change, so it is not what the advice changes)
    assert "lr" not in report.data and report.action == "restore the weights before step 1"
    assert "the loss of the last batch is nan" in report.advice
    assert "applies the LR" not in report.advice  # the action sets no LR: the advice must not say it does


def test_nan_inputs_under_raise_are_named_as_the_cause():
    """Some training items hold NaN: the fit raises a few steps later, when every batch's loss is NaN (the
    weights took the bad step). The report names the data, not the LR."""
    x, y = make_classification(n=320)
    x[100:110, 3] = float("nan")
    model = mlp()
    trainer = Trainer(model, torch.nn.CrossEntropyLoss(), "adamw", lr=1e-3, callbacks=[Health()], progress=False)
    with pytest.raises(Exception, match="non-finite"):
        trainer.fit(make_loader(x, y, batch_size=32, shuffle=True), epochs=2)
    (report,) = _reports(trainer.history)
    assert report.kind == "nonfinite" and report.data["where"] == "input"
    assert "The likely cause is the data" in report.advice and "NaN" in report.advice
    assert "lr" not in report.data and "the LR" not in report.advice


def test_the_first_module_whose_inputs_turn_nonfinite_is_told_apart():
    """A NaN made by a module's own code (outside its submodules) is told as the input of the next submodule."""

    class Parent(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.inner(torch.log(x))  # log of a negative number: NaN, in Parent's own code

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), Parent(), torch.nn.Linear(4, 2))
    from nbtrainer._health._locate import locate_nonfinite

    def compute(batch):
        out = model(batch)
        return out.sum(), out, None

    finding = locate_nonfinite(model, compute, -torch.ones(3, 4).abs() - 10, torch.autocast("cpu", enabled=False))
    assert finding.where == "input" and finding.module == "1.inner" and finding.parent == "1"
    assert "the forward of 1 (outside" in finding.describe()
    with torch.no_grad():
        model[0].weight.fill_(float("nan"))  # type: ignore[operator]
    finding = locate_nonfinite(model, compute, torch.ones(3, 4), torch.autocast("cpu", enabled=False))
    assert finding.where == "weights" and finding.module == "0"


# -- a loader that sleeps -------------------------------------------------------------------------------------
class Sleepy(torch.utils.data.Dataset):
    """An in-memory dataset whose fetch sleeps ``pause`` s an item, or only at item ``only`` (one stalled fetch, as
    a busy machine descheduling it)."""

    def __init__(self, x, y, pause: float, only: int | None = None) -> None:
        self.x, self.y, self.pause, self.only = x, y, pause, only

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):
        if self.pause and self.only in (None, i):
            time.sleep(self.pause)
        return self.x[i], self.y[i]


@pytest.mark.parametrize("pause,accum", [(0.0, 1), (0.0005, 1), (0.0005, 5)])
def test_a_loader_that_sleeps_is_reported_within_50_steps_with_what_helps(pause, accum):
    # a model whose step takes a few ms: an in-memory fetch is about a tenth of it, far from the 30% a warning needs
    # (a 10-32-3 MLP's step is so short that the fetch of 16 items is already 25-30% of it); accumulating 5
    # micro-batches a step, the loop's samples once never fell on a window's last micro-batch, so nothing was told
    x, y = make_classification(n=16 * 60, d=256)
    model = mlp(d=256, hidden=2048)
    trainer = Trainer(
        model, torch.nn.CrossEntropyLoss(), "sgd", lr=0.05, grad_accum_steps=accum, callbacks=[Health()],
        progress=False,
    )  # fmt: skip
    history = trainer.fit(torch.utils.data.DataLoader(Sleepy(x, y, pause), batch_size=16), epochs=1)
    waits = [r for r in _reports(history) if r.kind == "data_wait"]
    if not pause:
        assert waits == []  # an in-memory loader without sleeps: the model's time dominates
        return
    (report,) = waits
    assert report.step <= 50 and report.level == "warning"
    assert "num_workers=" in report.advice  # this loader has none
    assert history.health["data_wait"][-1][1] > 0.3


@pytest.mark.parametrize("batch", [11, 21, 31, 51])  # micro-batches the loop samples (1, 11, 21, 31, 51...)
def test_one_stalled_fetch_is_not_reported_as_a_slow_loader(batch):
    x, y = make_classification(n=16 * 60, d=256)  # the model of the test above: its fetch is a tenth of the step
    health = Health()
    model = mlp(d=256, hidden=2048)
    trainer = Trainer(model, torch.nn.CrossEntropyLoss(), "sgd", lr=0.05, callbacks=[health], progress=False)
    # a stall of 0.2 s: over 0.9 of its step with the step's compute up to 20 ms. At 0.05 s it read 0.88 in a quiet
    # suite run (the same compute's CPU time 6-7 ms among the suite's workers, against 4-5 ms alone)
    history = trainer.fit(torch.utils.data.DataLoader(Sleepy(x, y, 0.2, only=16 * batch), batch_size=16), epochs=1)
    stalled = [share for step, share in history.health["data_wait"] if step == batch + 1]
    assert stalled and stalled[0] > 0.9  # the stall was sampled: most of that step waited for data
    assert [r for r in _reports(history) if r.kind == "data_wait"] == []
    assert health.signals["data"].level == "ok"


# -- spikes ---------------------------------------------------------------------------------------------------
def _spiky(bad_batch: int, n: int = 100):
    x, y = make_classification(n=16 * n, d=10)
    y[bad_batch * 16 : bad_batch * 16 + 16] = (y[bad_batch * 16 : bad_batch * 16 + 16] + 1) % 3  # wrong labels
    return make_loader(x, y, batch_size=16)


def test_a_loss_spike_is_reported_with_its_step_and_batch():
    model = mlp(hidden=32)
    trainer = Trainer(
        model, torch.nn.CrossEntropyLoss(), "adamw", lr=1e-2, callbacks=[Health()], progress=False, seed=0
    )
    history = trainer.fit(_spiky(bad_batch=70), epochs=2)
    spikes = [r for r in _reports(history) if r.kind == "loss_spike"]
    assert [(r.step, r.epoch, r.data["batch"]) for r in spikes][:2] == [(71, 1, 70), (171, 2, 70)]
    assert "lr" not in spikes[0].data  # no LR increase before it: the advice is clipping and the batch
    assert "batch 70 of epoch 1" in spikes[0].message
    # the clipping norm comes from the measured norms: about twice their median before the spike
    totals = [v for s, v in history.health["grad_norm"]["total"] if s < 71]
    clip = spikes[0].data["max_grad_norm"]
    assert clip == pytest.approx(round_readable(2 * statistics.median(totals)))
    assert f"Trainer(max_grad_norm={readable(clip)})" in spikes[0].advice and "median of" in spikes[0].advice


@pytest.mark.parametrize("huge", [1e12, 2.39e26, 1e200], ids=["1e12", "1e26", "square-overflows"])
def test_one_huge_loss_in_the_warmup_leaves_no_false_spike_after_it_left_the_window(huge):
    """A diverging first step (or the last step before a fix restored the weights) feeds a loss like 1e26 into the
    running sums during the warm-up, where nothing is tested. Once it has left the window the statistics are the
    window's own again: no false spike at every later step, the mean exact, a real spike still seen."""
    watch = LossWatch(window=100, zscore=6.0)
    rng = random.Random(0)
    points = [(s, 1.4 - 0.002 * s + rng.gauss(0, 0.05), 0.01) for s in range(1, 400)]  # (step, loss, lr)
    points[4] = (5, huge, 0.01)
    spikes = []
    for i in range(0, len(points), 37):  # in refresh-sized chunks, as the loop delivers them
        spikes += watch.add(points[i : i + 37])
    assert spikes == []
    last = [loss for _, loss, _ in points[-100:]]
    assert watch.mean == pytest.approx(sum(last) / 100, rel=1e-9)
    assert [s.step for s in watch.add([(400, 3.0, 0.01)])] == [400]


def _spikes_by_the_definition(losses: list[float], window: int, zscore: float, warmup: int) -> list[int]:
    """The spikes of ``LossWatch``'s docstring, from the window's values each time (no running sums, no shortcut)."""
    recent: list[float] = []
    found = []
    for step, loss in enumerate(losses, 1):
        if not math.isfinite(loss):
            continue
        if len(recent) >= warmup:
            mean = statistics.fmean(recent)
            std = max(statistics.pstdev(recent), 0.01 * abs(mean), 1e-12)
            if loss > mean + zscore * std:
                found.append(step)
                continue
        recent = [*recent, loss][-window:]
    return found


@pytest.mark.parametrize("seed", range(4))
def test_the_spikes_found_are_the_definitions(seed):
    """The refresh's loop over its points keeps running sums, not the window's values: it must find the spikes the
    definition finds, among noise, a falling loss, NaNs and spikes from barely over the band to far over it, fed in
    refresh-sized chunks."""
    rng = random.Random(seed)
    losses = [2.0 * math.exp(-s / 300) + rng.gauss(0, 0.05) for s in range(1, 1200)]
    for s in rng.sample(range(30, len(losses)), 40):
        losses[s] += rng.choice([0.2, 0.3, 0.35, 0.5, 1.0, 10.0])  # 4-200 standard deviations of the noise
    for s in rng.sample(range(len(losses)), 5):
        losses[s] = math.nan
    watch = LossWatch(window=100, zscore=6.0)
    points = [(s, loss, 0.01) for s, loss in enumerate(losses, 1)]
    found = []
    for i in range(0, len(points), 53):
        found += [spike.step for spike in watch.add(points[i : i + 53])]
    expected = _spikes_by_the_definition(losses, 100, 6.0, watch.warmup)
    assert 10 <= len(expected) < 40  # the band is crossed by some injected values and missed by others
    assert found == expected


def test_a_spike_after_an_lr_increase_gets_a_concrete_lr():
    model = mlp(hidden=32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

    class Raise:
        def on_optimizer_step(self, trainer, step, skipped):
            if step == 60:
                trainer.set_lr(0.3)

    trainer = Trainer(
        model,
        torch.nn.CrossEntropyLoss(),
        opt,
        callbacks=[Health(), Raise()],
        progress=False,
        seed=0,
        refresh_interval=0.0,  # each step read at once: the advice knows the samples of steps 1 and 50
    )
    history = trainer.fit(_spiky(bad_batch=1000, n=150), epochs=1)
    later = [r for r in _problems(history) if r.step > 60]
    assert later and later[0].step <= 110 and "LR increase (set at step 60)" in later[0].advice
    # the last ratio (step 50, at LR 0.01) scales in proportion to the LR now, 0.3; the advice moves the weights
    # by 1% a step: back near the LR before the raise
    (ratio,) = [v for s, v in history.health["update_ratio"]["total"] if s == 50]
    assert later[0].data["lr"] == pytest.approx(round_readable(0.3 * 0.01 / (ratio * 30)))
    assert f"so about {ratio * 3000:.2g}% at LR 0.3" in later[0].advice
    assert later[0].data["lr"] <= 0.02


# -- dead units and vanishing gradients -------------------------------------------------------------------------
def test_dead_relu_units_are_measured_on_the_sampled_steps_and_a_dead_module_is_red():
    """24 of 32 units dead: a warning; all of them: a problem naming the module, in plain text."""
    x, y = make_classification(n=160, d=10)
    found = {}
    for dead in (24, 32):
        model = mlp(hidden=32)
        with torch.no_grad():
            model[0].bias[:dead] = -100.0  # type: ignore[operator]  # these hidden units never turn on
        health = Health(every_n_steps=5)
        trainer = Trainer(model, torch.nn.CrossEntropyLoss(), "sgd", lr=1e-3, callbacks=[health], progress=False)
        history = trainer.fit(make_loader(x, y, batch_size=16), epochs=2)
        found[dead] = (history, health)
    history, health = found[24]
    steps = [s for s, _ in history.health["dead_units"]["1"]]
    assert steps == [1, 5, 10, 15, 20]  # the sampled steps, on their own forwards
    assert {share for _, share in history.health["dead_units"]["1"]} == {0.75}
    (report,) = [r for r in _reports(history) if r.kind == "dead_units"]
    assert (
        report.level == "warning"
        and "of 1 (ReLU)" in report.message
        and health.signals["dead units"].level == "warning"
    )
    history, health = found[32]
    report = next(r for r in _reports(history) if r.kind == "dead_units")
    assert report.level == "problem" and report.step == 1  # dead before the first update: the initialization
    assert report.message.startswith("All 32 units of 1 (ReLU) are dead at step 1")
    assert health.signals["dead units"] == SignalState("problem", "1 (ReLU): 100% dead")
    assert "`" not in report.message + report.advice + health.signals["dead units"].summary
    assert report.data["reinit"] == ["0"] and report.action == "re-initialize 0"  # the layer feeding them


def test_a_vanishing_block_gradient_is_a_warning():
    class Dimmed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.body = torch.nn.Linear(10, 16)
            self.head = torch.nn.Linear(16, 3)

        def forward(self, x):
            return self.head(torch.relu(self.body(x) * 1e-12) + 1.0)

    x, y = make_classification(n=64, d=10)
    trainer = Trainer(Dimmed(), torch.nn.CrossEntropyLoss(), "sgd", lr=0.1, callbacks=[Health()], progress=False)
    history = trainer.fit(make_loader(x, y, batch_size=16), epochs=1)
    (report,) = [r for r in _reports(history) if r.kind == "grad_norm"]
    assert report.level == "warning" and "of block body vanishes" in report.message


def test_a_flat_loss_with_no_chance_level_is_a_warning():
    """A regressor whose loss does not move: told (a warning), not acted on: without a chance level a flat loss may
    be a model that starts where it ends."""
    torch.manual_seed(0)
    x = torch.randn(16 * 60, 10)
    y = x.sum(1, keepdim=True)
    model = torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    health = Health(window=40, on_problem="stop")
    trainer = Trainer(model, torch.nn.MSELoss(), "sgd", lr=1e-7, callbacks=[health], progress=False)
    history = trainer.fit(make_loader(x, y, batch_size=16), epochs=1)
    (report,) = [r for r in _reports(history) if r.kind == "not_learning"]
    assert report.level == "warning" and report.data["why"] == "flat" and report.data["chance"] is None
    assert history.status == "finished"  # on_problem="stop" did not stop it
    assert health.signals["learning rate"].level == "warning"


def test_a_summed_cross_entropy_that_learns_is_not_called_stuck_above_chance():
    """ln C is one item's loss at chance: CrossEntropyLoss(reduction="sum") of a batch of 32 that learnt well (noisy
    labels, so its loss stays ~0.8 an item) sat at ~27 against 'chance 1.39' and was told, as a problem, that it
    did not learn and that its weights were damaged, with the advice to restore those from before step 1."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2048, 10, generator=g)
    y = (x[:, :3].sum(1) > 0).long() + 2 * (x[:, 3] > 0).long()
    noisy = torch.rand(2048, generator=g) < 0.2
    y[noisy] = torch.randint(0, 4, (int(noisy.sum()),), generator=g)
    model = mlp(d=10, hidden=32, out=4)
    health = Health(window=40)
    criterion = torch.nn.CrossEntropyLoss(reduction="sum")
    trainer = Trainer(model, criterion, "adamw", lr=1e-2, callbacks=[health], progress=False)
    history = trainer.fit(make_loader(x, y, batch_size=32, shuffle=True), epochs=2)
    with torch.no_grad():
        assert (model(x).argmax(1) == y).float().mean() > 0.7  # it learnt
    assert _problems(history) == [] and health._loss.chance is None
    assert health.signals["learning rate"].level == "ok"


def test_a_large_first_gradient_that_moves_the_weights_little_is_not_called_exploded():
    """Before a median exists the first gradients are judged against the weights' norm, which depends on the loss's
    scale: a summed cross-entropy over batches of 256 gave AdamW a first gradient 14x its weights' norm and got
    "the gradient norm exploded at step 1" as a problem (on_problem="pause" would halt a healthy run). Its step
    moved the weights by about 1%: the same gradient with an update that large is still a problem."""
    from sklearn.datasets import load_digits

    data, target = load_digits(return_X_y=True)
    x, y = torch.tensor(data, dtype=torch.float32) / 16, torch.tensor(target)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    health = Health()
    criterion = torch.nn.CrossEntropyLoss(reduction="sum")
    trainer = Trainer(model, criterion, "adamw", lr=1e-3, callbacks=[health], progress=False)
    history = trainer.fit(make_loader(x, y, batch_size=256, shuffle=True), epochs=5)
    with torch.no_grad():
        assert (model(x).argmax(1) == y).float().mean() > 0.7  # it learns (chance: 0.1)
    assert [r.kind for r in _problems(history)] == [], [r.message for r in _problems(history)]

    # the same summed loss with plain SGD at a step size that really moves the weights by far more than 10%
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    health = Health()
    trainer = Trainer(model, criterion, "sgd", lr=0.5, callbacks=[health], progress=False)
    history = trainer.fit(make_loader(x, y, batch_size=256, shuffle=True), epochs=1)
    kinds = {r.kind for r in _problems(history)}
    assert kinds & {"grad_norm", "update_ratio", "nonfinite"}, [r.message for r in _reports(history)]


def test_a_converged_regressor_continued_in_a_new_fit_is_not_called_stuck_but_a_stuck_one_still_is():
    """Continuing a fit that brought the loss to its noise floor: the loss is flat where the last fit ended and far
    below where it started, which is convergence. A run stuck from the start stays told in the next fit."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3000, 10, generator=g)
    noisy = x @ torch.randn(10, 1, generator=g) + 0.3 * torch.randn(3000, 1, generator=g)  # noise floor 0.09
    runs = [("adamw", 3e-3, noisy, 32, False), ("sgd", 1e-7, x.sum(1, keepdim=True), 16, True)]
    for optimizer, lr, y, batch_size, stuck in runs:
        model = mlp(10, hidden=32, out=1)
        health = Health(window=40)
        trainer = Trainer(model, torch.nn.MSELoss(), optimizer, lr=lr, callbacks=[health], progress=False)
        trainer.fit(make_loader(x, y, batch_size=batch_size), epochs=2)
        for _ in range(2):
            history = trainer.fit(make_loader(x, y, batch_size=batch_size), epochs=1)
            told = [r for r in _reports(history) if r.kind == "not_learning"]
            assert bool(told) == stuck, [r.message for r in told]
        if not stuck:
            assert history.epochs[-1]["loss"] < 0.15


# -- bad input ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"on_problem": "halt"}, "on_problem.*'warn', 'pause', 'stop'"),
        ({"every_n_steps": 0}, "every_n_steps.*>= 1"),
        ({"every_n_steps": 2.5}, "every_n_steps"),
        ({"spike_zscore": 0}, "spike_zscore"),
        ({"window": 3}, "window"),
    ],
)
def test_bad_options_are_refused_with_the_fix(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Health(**kwargs)


def test_the_diagnostic_rerun_puts_back_each_modules_own_mode() -> None:
    """Before: the re-run that locates a non-finite value put the model back with ``model.train(was)``, turning a
    BatchNorm the user froze in eval mode back to training (the twin of what predict and evaluate once did)."""
    from nbtrainer._health._locate import locate_nonfinite

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))
    model.train()
    model[1].eval()  # frozen statistics

    def compute(batch):
        out = model(batch)
        return out.sum(), out, None

    locate_nonfinite(model, compute, torch.randn(3, 4), torch.autocast("cpu", enabled=False))
    assert model.training and model[0].training and not model[1].training
