"""Out of memory in fit / evaluate / predict: memory released, the same error re-raised with advice.

On CPU a model raises ``torch.OutOfMemoryError`` mid-epoch (as CUDA's allocator would). While the test
still holds the exception (as a notebook kernel does, in ``sys.last_traceback``), the batch and the
activations of the failed step must be gone, the gradients released, and the trainer must fit again. On
CUDA (``gpu`` mark) a real allocation failure, and the device memory must be back.
"""

from __future__ import annotations

import gc
import os
import weakref

import pytest
import torch
from conftest import make_classification, make_loader

from nbtrainer import Trainer, profile_model


class Boom(torch.nn.Module):
    """A small net whose forward raises torch.OutOfMemoryError on call number ``at`` (in train or eval)."""

    def __init__(self, at: int, when: str = "train") -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(10, 64), torch.nn.ReLU(), torch.nn.Linear(64, 3))
        self.at, self.when, self.calls = at, when, 0
        self.refs: list[weakref.ref] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.net(x)
        if (self.when == "train") == self.training:
            self.calls += 1
            if self.calls == self.at:
                self.refs = [weakref.ref(x), weakref.ref(h)]  # the batch and an activation of this step
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")
        return h


def _trainer(model, **kw):
    return Trainer(model, torch.nn.CrossEntropyLoss(), torch.optim.Adam(model.parameters()), progress=False, **kw)


def _data(n=128):
    x, y = make_classification(n=n)
    return make_loader(x, y, batch_size=16)


def test_oom_in_fit_releases_the_step_and_advises_from_the_run_settings():
    model = Boom(at=7)  # epoch 1, micro-batch 7: inside the 4th accumulation window
    trainer = _trainer(model, grad_accum_steps=2)
    with pytest.raises(torch.OutOfMemoryError) as info:
        trainer.fit(_data(), epochs=2)
    err = info.value  # held, like the kernel's last traceback
    gc.collect()
    assert [ref() for ref in model.refs] == [None, None], "the failed step's batch / activations are still alive"
    assert all(p.grad is None for p in model.parameters())
    assert trainer.optimizer.state  # the optimizer state is kept
    text = str(err)
    assert text.startswith("CUDA out of memory. Tried to allocate 2.00 GiB.")
    assert "out of memory in fit (cpu fp32, epoch 1, step 4, grad_accum_steps=2, micro-batch size 16)" in text
    assert "batch_size=8) and set grad_accum_steps=4: the same effective batch of 32" in text
    assert "precision='bf16-mixed'" in text  # this CPU runs bf16 (checked by precision_support)
    assert "activation_checkpointing=True" in text
    assert "profile_model(model, example_batch).fits(" in text
    assert trainer.status == "failed" and trainer.history.status == "failed"
    # the trainer fits again
    model.at = -1
    history = trainer.fit(_data(), epochs=1)
    assert history.status == "finished" and len(history.epochs) == 1


def test_oom_advice_skips_what_the_run_already_does():
    model = Boom(at=2)
    trainer = _trainer(model, precision="bf16-mixed")
    with pytest.raises(torch.OutOfMemoryError) as info:
        trainer.fit(_data(), epochs=1)
    text = str(info.value)
    assert "precision=" not in text and "batch_size=8) and set grad_accum_steps=2" in text


def test_oom_advice_quotes_a_known_profile():
    model = Boom(at=-1)
    prof = profile_model(model, next(iter(_data()))[0], include=("memory",), checkpointing=False)
    model.at, model.calls = 3, 0
    trainer = _trainer(model)
    with pytest.raises(torch.OutOfMemoryError) as info:
        trainer.fit(_data(), epochs=1)
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")  # the CPU's budget: the machine's RAM
    expected = prof.fits(ram / 2**30, 16, device="cpu", precision="fp32").suggestion
    text = str(info.value)
    assert f"profile_model(...).fits(budget_gb={ram / 2**30:.0f}, batch_size=16): {expected}" in text
    assert "profile_model(model, example_batch)" not in text  # the known numbers replace the generic hint


@pytest.mark.slow
@pytest.mark.parametrize("verb", ["evaluate", "predict"])
def test_oom_in_evaluate_and_predict(verb):
    model = Boom(at=3, when="eval")
    trainer = _trainer(model)
    with pytest.raises(torch.OutOfMemoryError) as info:
        getattr(trainer, verb)(_data())
    gc.collect()
    assert [ref() for ref in model.refs] == [None, None]
    text = str(info.value)
    assert f"out of memory in {verb} (cpu fp32, batch size 16)" in text
    assert "A smaller batch_size for this loader (now 16)" in text and "grad_accum_steps" not in text
    model.at = -1
    assert getattr(trainer, verb)(_data()) is not None


def test_oom_during_validation_inside_fit_is_advised_once():
    model = Boom(at=2, when="eval")
    trainer = _trainer(model)
    with pytest.raises(torch.OutOfMemoryError) as info:
        trainer.fit(_data(), _data(), epochs=1)
    assert str(info.value).count("nbtrainer: out of memory") == 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_real_cuda_oom_gives_the_memory_back():
    class Greedy(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(4096, 4096)
            self.greedy = False

        def forward(self, x):
            h = self.net(x)  # activations of a real batch, on the GPU
            if self.greedy:
                torch.empty(1 << 50, dtype=torch.uint8, device=x.device)  # 1 PiB: a real allocator failure
            return h

    model = Greedy()
    trainer = Trainer(
        model,
        lambda out, y: out.float().pow(2).mean(),
        torch.optim.Adam(model.parameters()),
        device="cuda",
        progress=False,
    )
    data = [(torch.randn(4096, 4096), torch.zeros(4096)) for _ in range(4)]  # 64 MiB per batch
    trainer.fit(data, epochs=1)
    torch.cuda.synchronize()
    baseline = torch.cuda.memory_allocated()  # weights + Adam state
    model.greedy = True
    with pytest.raises(torch.OutOfMemoryError) as info:
        trainer.fit(data, epochs=1)
    assert "nbtrainer: out of memory in fit (cuda" in str(info.value) and "peak " in str(info.value)
    assert torch.cuda.memory_allocated() <= baseline  # batch, activations and gradients released
    model.greedy = False
    assert trainer.fit(data, epochs=1).status == "finished"


@pytest.mark.parametrize("verb", ["evaluate", "predict"])
def test_oom_in_evaluate_and_predict_of_a_trainer_without_optimizer_is_advised(verb):
    model = Boom(at=2, when="eval")
    trainer = Trainer(model, torch.nn.CrossEntropyLoss(), progress=False)  # evaluates and predicts only
    with pytest.raises(torch.OutOfMemoryError) as info:  # not an AttributeError on the missing optimizer
        getattr(trainer, verb)(_data())
    gc.collect()
    assert [ref() for ref in model.refs] == [None, None]
    assert f"out of memory in {verb}" in str(info.value)
