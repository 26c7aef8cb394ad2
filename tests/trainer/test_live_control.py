"""The Trainer's live control (``nbtrainer._loop._control.LiveControl``): requests applied at a step
boundary as ``on_control`` events, and calls deferred until an event has reached every callback."""

from __future__ import annotations

import torch
from conftest import make_classification, make_loader, mlp

from nbtrainer import Trainer


class Events:
    def __init__(self):
        self.seen = []

    def on_control(self, trainer, event):
        self.seen.append((event["kind"], event["old"], event["new"], event["step"]))


def _trainer(*callbacks):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return Trainer(model, torch.nn.CrossEntropyLoss(), opt, callbacks=callbacks, progress=False)


def test_between_fits_a_change_is_applied_at_once_and_told():
    events = Events()
    trainer = _trainer(events)
    trainer.set_lr(0.05)
    trainer.set_grad_accum_steps(2)
    assert trainer.lr == 0.05 and trainer.grad_accum_steps == 2
    assert events.seen == [("lr", 0.1, 0.05, 0), ("grad_accum_steps", 1, 2, 0)]
    ran = []
    trainer.defer(lambda: ran.append(1))
    assert ran == [1]  # nothing to wait for between fits


def test_in_a_fit_a_request_waits_for_the_step_boundary_and_a_deferred_call_for_every_callback():
    x, y = make_classification(n=64)
    order = []

    class Requests:
        def on_optimizer_step(self, trainer, step, skipped):
            if step == 2:
                trainer.set_lr(0.02)  # from inside the run: queued, applied at the next boundary
                assert trainer.lr == 0.1

        def on_epoch_end(self, trainer, epoch, logs):
            trainer.defer(lambda: order.append("deferred"))
            order.append("first")

    class Last:
        def on_epoch_end(self, trainer, epoch, logs):
            order.append("last")

    events = Events()
    trainer = _trainer(Requests(), events, Last())
    trainer.fit(make_loader(x, y, batch_size=16), epochs=1)
    assert trainer.lr == 0.02
    assert [e for e in events.seen if e[0] == "lr"] == [("lr", 0.1, 0.02, 2)]
    assert order == ["first", "last", "deferred"]
