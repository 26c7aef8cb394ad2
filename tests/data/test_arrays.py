"""Arrays like Keras (issue 14): ``fit((X, y), val_data=(Xv, yv), batch_size=..., shuffle=True)``.

The arrays form must train exactly as the DataLoader a user would write (same seed, same shuffle, same
weights with ``torch.equal``), for tensors, NumPy arrays and dicts, through the batched fetch and through
the per-sample path; and every misuse gets an error naming the fix, before anything trains.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import make_classification
from torch.utils.data import DataLoader, TensorDataset

from nbtrainer import ModelCheckpoint, Trainer

_CLOCK = ("time", "samples_per_s")


def model_fn(d=10, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(d, 16), torch.nn.Dropout(0.2), torch.nn.ReLU(), torch.nn.Linear(16, 3))


def trainer_for(model, **kw):
    return Trainer(
        model,
        kw.pop("criterion", torch.nn.CrossEntropyLoss()),
        torch.optim.Adam(model.parameters(), 1e-2),
        seed=0,
        progress=False,
        device="cpu",
        **kw,
    )


def rows(history):
    return [{k: v for k, v in r.items() if k not in _CLOCK} for r in history.epochs]


def same_weights(a, b):
    return all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))


@pytest.mark.parametrize("fast", [True, False])
def test_arrays_train_exactly_like_the_dataloader_a_user_writes(fast):
    x, y = make_classification(n=150)
    xv, yv = make_classification(n=40, seed=1)
    ref_model = model_fn()
    ref = trainer_for(ref_model, fast_fetch=False)
    h_ref = ref.fit(
        DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True),
        DataLoader(TensorDataset(xv, yv), batch_size=16),
        epochs=3,
    )
    model = model_fn()
    h = trainer_for(model, fast_fetch=fast).fit((x, y), val_data=(xv, yv), batch_size=16, epochs=3)
    assert same_weights(ref_model, model)
    assert rows(h) == rows(h_ref) and h.steps == h_ref.steps
    # and the order really is shuffled by default (another shuffle would give other weights)
    other = model_fn()
    trainer_for(other).fit((x, y), val_data=(xv, yv), batch_size=16, epochs=3, shuffle=False)
    assert not same_weights(other, model)


def test_numpy_arrays_float64_become_float32_and_match_tensors():
    x, y = make_classification(n=96)
    a = model_fn()
    trainer_for(a).fit((x, y), batch_size=16, epochs=2)
    b = model_fn()
    seen = []

    class Grab:
        def on_train_batch_start(self, trainer, batch, batch_idx):
            seen.append((batch[0].dtype, batch[1].dtype))

    trainer_for(b, callbacks=[Grab()]).fit((x.double().numpy(), y.numpy()), batch_size=16, epochs=2)
    assert same_weights(a, b)
    assert set(seen) == {(torch.float32, torch.int64)}


class TwoInputs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = torch.nn.Linear(10, 3), torch.nn.Linear(4, 3)

    def forward(self, a, b):
        return self.a(a) + self.b(b)


def test_dict_of_arrays_and_tuple_of_several_inputs():
    x, y = make_classification(n=64)
    extra = torch.randn(64, 4, generator=torch.Generator().manual_seed(3))
    m1 = TwoInputs()
    h1 = trainer_for(m1).fit({"a": x, "b": extra.numpy(), "labels": y}, batch_size=8, epochs=2)
    m2 = TwoInputs()
    h2 = trainer_for(m2).fit((x, extra, y), batch_size=8, epochs=2)
    assert same_weights(m1, m2) and rows(h1) == rows(h2)


def test_one_array_trains_with_compute_loss_and_predicts():
    x, _ = make_classification(n=64)
    torch.manual_seed(0)
    auto = torch.nn.Sequential(torch.nn.Linear(10, 4), torch.nn.ReLU(), torch.nn.Linear(4, 10))
    trainer = Trainer(
        auto,
        None,
        torch.optim.Adam(auto.parameters(), 1e-2),
        compute_loss=lambda model, batch: torch.nn.functional.mse_loss(model(batch), batch),
        progress=False,
        seed=0,
    )
    history = trainer.fit(x, batch_size=16, epochs=3)
    assert history.epochs[-1]["loss"] < history.epochs[0]["loss"]
    out = trainer.predict(x)  # inputs only, in order, default batch size
    with torch.no_grad():
        assert torch.equal(out, auto.eval()(x))
    torch.testing.assert_close(trainer.predict(x.numpy(), batch_size=7), out)  # other batches: other rounding


def test_evaluate_and_predict_accept_arrays():
    x, y = make_classification(n=100)
    model = model_fn()
    trainer = trainer_for(model)
    trainer.fit((x, y), batch_size=16)
    by_arrays = trainer.evaluate((x, y), batch_size=32)
    by_loader = trainer.evaluate(DataLoader(TensorDataset(x, y), batch_size=32))
    assert by_arrays == by_loader
    assert torch.equal(trainer.predict((x, y)), trainer.predict(DataLoader(TensorDataset(x, y), batch_size=50)))


def test_evaluating_inputs_alone_says_the_targets_are_missing():
    # evaluate(x) once died in its reduction: "zip() argument 2 is longer than argument 1"
    x, y = make_classification(n=64)
    trainer = trainer_for(model_fn())
    with pytest.raises(ValueError, match=r"evaluation batch gave no loss.*evaluate\(\(x, y\)\).*predict\(x\)"):
        trainer.evaluate(x)
    assert set(trainer.evaluate((x, y))) >= {"val_loss"}  # with its targets it evaluates


def test_validation_arrays_are_never_shuffled():
    x, y = make_classification(n=64)
    xv, yv = make_classification(n=40, seed=1)
    model = model_fn()
    seen: dict[bool, list[torch.Tensor]] = {True: [], False: []}  # inputs the model saw, by training mode
    model.register_forward_hook(lambda module, args, out: seen[module.training].append(args[0].clone()))
    trainer_for(model).fit((x, y), val_data=(xv, yv), batch_size=16, epochs=2)
    val_inputs = seen[False][1:]  # [0]: fit()'s peek at the first validation batch
    assert torch.equal(torch.cat(val_inputs), torch.cat([xv, xv]))  # both validations, in order
    assert not torch.equal(torch.cat(seen[True])[:64], x)  # while training is shuffled


def test_total_steps_of_arrays():
    x, y = make_classification(n=100)
    trainer = trainer_for(model_fn(), grad_accum_steps=2)
    assert trainer.total_steps((x, y), 3, batch_size=16) == 4 * 3  # 7 batches -> 4 optimizer steps


def test_arrays_resume_mid_epoch_exactly(tmp_path):
    x, y = make_classification(n=150)

    class StopAt:
        def on_optimizer_step(self, trainer, step, skipped):
            if step == 13:  # mid-epoch 2 (10 batches per epoch)
                trainer.save_checkpoint(str(tmp_path / "mid.ckpt"))
                trainer.request_stop("test")

    ref = model_fn()
    h_ref = trainer_for(ref).fit((x, y), batch_size=16, epochs=3)
    stopped = trainer_for(model_fn(), callbacks=[StopAt()])
    assert stopped.fit((x, y), batch_size=16, epochs=3).status == "stopped"
    resumed_model = model_fn(seed=5)
    resumed = trainer_for(resumed_model, callbacks=[ModelCheckpoint(tmp_path / "c")])
    h = resumed.fit((x, y), batch_size=16, epochs=3, resume_from=str(tmp_path / "mid.ckpt"))
    assert same_weights(ref, resumed_model)
    assert rows(h) == rows(h_ref)


# -- misuse: a clear error, before anything trains --------------------------------------------------------
X, Y = make_classification(n=32)


@pytest.mark.parametrize(
    ("call", "exc", "pattern"),
    [
        (lambda t: t.fit((X, Y)), TypeError, r"tuple of 2 arrays but no batch_size.*batch_size=32"),
        (lambda t: t.fit(X), TypeError, r"train_loader is a tensor.*batch_size=.*DataLoader\(TensorDataset"),
        (lambda t: t.fit(X.numpy()), TypeError, r"train_loader is a ndarray.*batch_size="),
        (
            lambda t: t.fit((X, Y[:31]), batch_size=8),
            ValueError,
            r"different numbers of rows \(array 0 .*: 32, .*: 31\)",
        ),
        (lambda t: t.fit({"x": X, "labels": Y[:3]}, batch_size=8), ValueError, r"array 'labels': 3"),
        (lambda t: t.fit((X, Y), batch_size=0), ValueError, r"batch_size must be an int >= 1, got 0"),
        (lambda t: t.fit((X, Y), batch_size=8, shuffle="yes"), TypeError, r"shuffle must be True, False or None"),
        (
            lambda t: t.fit(DataLoader(TensorDataset(X, Y), batch_size=8), batch_size=8),
            TypeError,
            r"batch_size=8 applies to array data.*fit\(\) got a DataLoader, which batches itself.*Drop batch_size=",
        ),
        (
            lambda t: t.fit([(X, Y)], batch_size=8),
            TypeError,
            r"got a list of batches, which batches itself",
        ),
        # arrays as Python lists: said so, with the fix (not "got loaders (tuple)")
        (
            lambda t: t.fit((X.tolist(), Y.tolist()), batch_size=8),
            TypeError,
            r"training data is a tuple of 2 whose element\(s\) \[0, 1\] are Python lists of numbers.*"
            r"\(torch\.tensor\(x\), torch\.tensor\(y\)\).*or a DataLoader",
        ),
        (lambda t: t.fit((X, Y.tolist())), TypeError, r"element\(s\) \[1\] are Python lists.*batch_size="),
        (
            lambda t: t.fit((X, Y), val_data={"x": X, "labels": Y.tolist()}, batch_size=8),
            TypeError,
            r"val_data is a dict whose entries \['labels'\] are Python lists.*torch\.tensor\(values\)",
        ),
        (lambda t: t.predict(X.tolist()), TypeError, r"predict\(\) loader is a Python list of numbers.*torch\.tensor"),
        (
            lambda t: t.fit(DataLoader(TensorDataset(X, Y), batch_size=8), shuffle=True),
            TypeError,
            r"shuffle=True applies to training arrays.*DataLoader\(\.\.\., shuffle=True\)",
        ),
        (
            lambda t: t.fit((X, Y), [(X, Y)], val_data=(X, Y), batch_size=8),
            TypeError,
            r"both val_loader and val_data",
        ),
        (
            lambda t: t.fit(DataLoader(TensorDataset(X, Y), batch_size=8), val_data=(X, Y)),
            TypeError,
            r"val_data is a tuple of 2 arrays but no batch_size",
        ),
        (
            lambda t: t.fit((np.array(["a"] * 32, dtype=object), Y), batch_size=8),
            TypeError,
            r"dtype object.*np.asarray",
        ),
        (lambda t: t.fit((torch.tensor(1.0), Y), batch_size=8), ValueError, r"0-dimensional"),
        (lambda t: t.fit((X[:0], Y[:0]), batch_size=8), ValueError, r"empty \(0 rows\)"),
        (
            lambda t: t.evaluate(DataLoader(TensorDataset(X, Y), batch_size=8), batch_size=8),
            TypeError,
            r"batch_size=8 applies to array data",
        ),
    ],
)
def test_misuse_is_refused_with_the_fix(call, exc, pattern):
    model = model_fn()
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(exc, match=pattern):
        call(trainer_for(model))
    assert all(torch.equal(p, q) for p, q in zip(before, model.parameters(), strict=True))


def test_train_loader_keyword_still_works():
    """``fit(train_loader=...)`` (the former name of ``data``; the panel passes it so) trains the same."""
    a, b = model_fn(), model_fn()
    ha = trainer_for(a).fit(train_loader=DataLoader(TensorDataset(X, Y), batch_size=8), epochs=2)
    hb = trainer_for(b).fit(DataLoader(TensorDataset(X, Y), batch_size=8), epochs=2)
    assert same_weights(a, b) and rows(ha) == rows(hb)
    with pytest.raises(TypeError, match="training data twice"):
        trainer_for(model_fn()).fit([(X, Y)], train_loader=[(X, Y)])
    with pytest.raises(TypeError, match="needs training data"):
        trainer_for(model_fn()).fit()


def test_a_list_of_batches_is_still_a_loader():
    """Only tuples and dicts of arrays are arrays: a list stays a sequence of ready batches."""
    model = model_fn()
    history = trainer_for(model).fit([(X[:16], Y[:16]), (X[16:], Y[16:])], epochs=1)
    assert history.epochs[0]["steps"] == 2
