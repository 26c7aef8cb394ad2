"""A run's progress across fits (``nbtrainer._loop._run_state.RunState``), as the Trainer owns it."""

from __future__ import annotations

import torch
from conftest import make_classification, make_loader, mlp

from nbtrainer import Trainer, load_checkpoint
from nbtrainer._events._history import History
from nbtrainer._loop._metrics import MetricSet
from nbtrainer._loop._run_state import RunState


def _trainer(**kw):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    return Trainer(model, torch.nn.CrossEntropyLoss(), opt, progress=False, **kw)


def test_the_run_state_follows_a_run_across_fit_fit_more_and_a_checkpoint(tmp_path):
    x, y = make_classification(n=64)
    loader = make_loader(x, y, batch_size=16)  # 4 steps an epoch
    trainer = _trainer(seed=0)
    run = trainer.run_state
    seen = {}

    class Watch:
        def on_fit_start(self, trainer):
            seen["fitting"], seen["loop"] = trainer.run_state.fitting, trainer.run_state.loop

    trainer.add_callback(Watch())
    history = trainer.fit(loader, epochs=2)
    assert seen["fitting"] and seen["loop"] is not None  # the running fit's loop, while it runs
    assert not run.fitting and run.loop is None  # dropped at the end
    assert history is trainer.history is run.history is run.recorder.history
    assert run.loop_state.global_step == trainer.global_step == 8 and run.loop_state.epoch + 1 == trainer.current_epoch
    assert run.elapsed() == run.elapsed_before > 0
    assert run.has_validation is trainer.has_validation is False

    more = trainer.fit_more(loader, epochs=1)
    assert more is not history and len(history.epochs) == 2 and len(more.epochs) == 3  # its own History
    assert run.loop_state.global_step == 12 and run.elapsed_before > 0
    path = trainer.save_checkpoint(str(tmp_path / "run.ckpt"))

    resumed = _trainer()
    resumed.load_state_dict(load_checkpoint(path))
    other = resumed.run_state
    saved, own = other.loop_state.state_dict(), run.loop_state.state_dict()
    assert torch.equal(saved.pop("epoch_rng")["torch"], own.pop("epoch_rng")["torch"])  # RNG states: tensors
    assert saved == own
    assert other.elapsed_before == load_checkpoint(path)["config"]["elapsed"] > 0
    assert [row["epoch"] for row in other.history.epochs] == [1, 2, 3]
    assert other.pending_rng is not None  # restored once the loop has replayed the data order
    assert other.take_pending_rng() is not None and other.pending_rng is None


def test_preserved_puts_back_what_a_fit_replaces():
    run = RunState(MetricSet({}, torch.device("cpu")))
    run.loop_state.global_step, run.elapsed_before, run.has_validation = 5, 2.5, True
    state, history = run.loop_state, run.history
    history.add_epoch({"epoch": 1, "loss": 1.0})
    with run.preserved():
        run.start_fresh()
        run.has_validation = False
        assert run.loop_state is not state and run.history is not history and run.elapsed_before == 0.0
    assert run.loop_state is state and run.loop_state.global_step == 5 and run.elapsed_before == 2.5
    assert run.history is history and run.recorder.history is history and run.has_validation


def test_continue_history_copies_the_run_so_far():
    run = RunState(MetricSet({}, torch.device("cpu")), History())
    run.history.add_epoch({"epoch": 1, "loss": 1.0})
    run.pending_rng = {"torch": None}
    before = run.history
    run.continue_history()
    assert run.history is not before and run.history.epochs == before.epochs and run.pending_rng is None
