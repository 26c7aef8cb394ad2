"""predict(): the step that makes outputs (compute_loss / predict_step, as functions or overrides), ragged
outputs padded, what is left out by default (loss, caches), float32 under mixed precision, memory bounded,
and Trainer(model, criterion, optimizer=None) for evaluation and prediction only."""

from __future__ import annotations

import dataclasses
import gc
import sys
import weakref

import pytest
import torch
from conftest import accuracy, make_classification, make_loader, mlp
from torch import nn

from nbtrainer import Trainer, precision_support


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


X, Y = make_classification(n=48)


def _feature_batches():
    """Batches the default protocol can't use: the model takes a tensor, the batch is {'feats', 'y'}."""
    return [{"feats": X[i : i + 16], "y": Y[i : i + 16]} for i in range(0, 48, 16)]


def _feature_loss(model, batch):
    out = model(batch["feats"])
    return nn.functional.cross_entropy(out, batch["y"]), out, batch["y"]


# -- which step makes the outputs ---------------------------------------------------------------------------------
def test_predict_uses_compute_loss_outputs_when_given_as_a_function():
    model = mlp()
    trainer = Trainer(model, None, torch.optim.SGD(model.parameters(), 0.1), compute_loss=_feature_loss, progress=False)
    trainer.fit(_feature_batches(), epochs=2)
    preds = trainer.predict(_feature_batches())
    model.eval()
    with torch.no_grad():
        assert torch.equal(preds, model(X))


def test_predict_through_a_compute_loss_that_fails_names_predict_step():
    model = mlp()
    trainer = Trainer(model, None, torch.optim.SGD(model.parameters(), 0.1), compute_loss=_feature_loss, progress=False)
    trainer.fit(_feature_batches(), epochs=1)
    seen = []

    class Count:
        def __iter__(self):
            for i in range(0, 48, 16):
                seen.append(i)
                yield {"feats": X[i : i + 16]}  # new data: no labels, which _feature_loss reads

    with pytest.raises(ValueError, match=r"no predict_step.*KeyError: 'y'.*predict_step=fn\(model, batch\)") as info:
        trainer.predict(Count())
    assert seen == [0]  # stopped at the first batch
    assert isinstance(info.value.__cause__, KeyError)  # the user's own error stays attached
    fixed = Trainer(model, None, None, compute_loss=_feature_loss, predict_step=lambda m, b: m(b["feats"]),
                    progress=False)  # fmt: skip
    assert fixed.predict(Count()).shape == (48, Y.max().item() + 1)


def test_predict_uses_compute_loss_of_a_subclass():
    class FeatureTrainer(Trainer):
        def compute_loss(self, batch):
            return _feature_loss(self.model, batch)

    model = mlp()
    trainer = FeatureTrainer(model, None, torch.optim.SGD(model.parameters(), 0.1), progress=False)
    trainer.fit(_feature_batches())
    with torch.no_grad():
        assert torch.equal(trainer.predict(_feature_batches()), model.eval()(X))


def test_predict_step_function_and_override_win_and_need_no_targets():
    model = mlp()
    test_batches = [{"feats": X[i : i + 16]} for i in range(0, 48, 16)]  # no targets at all
    trainer = Trainer(
        model,
        None,
        torch.optim.SGD(model.parameters(), 0.1),
        compute_loss=_feature_loss,
        predict_step=lambda m, b: m(b["feats"]).softmax(-1),
        progress=False,
    )
    probs = trainer.predict(test_batches)
    assert probs.shape == (48, 3) and torch.allclose(probs.sum(1), torch.ones(48))

    class Probs(Trainer):
        def predict_step(self, batch):
            return self.model(batch["feats"]).softmax(-1)

    assert torch.equal(Probs(model, None, progress=False).predict(test_batches), probs)


def test_compute_loss_returning_only_a_loss_explains_how_to_predict():
    model = mlp()
    trainer = Trainer(model, None, compute_loss=lambda m, b: _feature_loss(m, b)[0], progress=False)
    # the default step calls model(**batch): Sequential takes no keywords, and the error says what to do
    with pytest.raises(TypeError) as excinfo:
        trainer.predict(_feature_batches())
    note = " ".join([str(excinfo.value), *getattr(excinfo.value, "__notes__", [])])  # Python 3.10: in the message
    assert "compute_loss returned only a loss" in note and "predict_step=fn(model, batch)" in note, note


def test_without_exception_notes_the_advice_ends_the_message(monkeypatch):
    # Python 3.10 has no BaseException.add_note (requires-python allows it): the same advice, in the message
    monkeypatch.setattr(sys, "version_info", (3, 10, 14, "final", 0))
    trainer = Trainer(mlp(), None, compute_loss=lambda m, b: _feature_loss(m, b)[0], progress=False)
    with pytest.raises(TypeError) as excinfo:
        trainer.predict(_feature_batches())
    message = str(excinfo.value)  # not pytest's match=, which also reads the notes
    assert "compute_loss returned only a loss" in message and "predict_step=fn(model, batch)" in message, message


def test_compute_loss_returning_only_a_loss_predicts_with_the_model_when_the_batch_allows():
    torch.manual_seed(0)
    auto = nn.Sequential(nn.Linear(10, 4), nn.ReLU(), nn.Linear(4, 10))  # an autoencoder: the batch is x
    trainer = Trainer(auto, None, compute_loss=lambda m, b: nn.functional.mse_loss(m(b), b), progress=False)
    x = X[:32]  # 10 features
    out = trainer.predict([x[:16], x[16:]])
    with torch.no_grad():
        assert torch.equal(out, auto.eval()(x))


# -- concatenation --------------------------------------------------------------------------------------------------
class TokenLogits(nn.Module):
    """Per-token logits [B, L, V] for token ids [B, L]: L varies per batch (dynamic padding)."""

    def __init__(self, vocab=11):
        super().__init__()
        self.emb = nn.Embedding(vocab, 8)
        self.head = nn.Linear(8, vocab)

    def forward(self, input_ids):
        return self.head(self.emb(input_ids))


def _ragged_batches():
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, 11, (bs, length), generator=g) for bs, length in [(4, 5), (3, 9), (2, 2)]]


def test_ragged_outputs_are_padded_with_pad_index():
    model = TokenLogits()
    trainer = Trainer(model, None, progress=False)
    batches = _ragged_batches()
    out = trainer.predict(batches)
    assert out.shape == (9, 9, 11)
    row = 0
    with torch.no_grad():
        for ids in batches:
            n, length = ids.shape
            assert torch.equal(out[row : row + n, :length], model(ids))
            assert (out[row : row + n, length:] == -100).all()
            row += n
    assert (trainer.predict(batches, pad_index=0)[:4, 5:] == 0).all()
    per = trainer.predict(batches, per_batch=True)
    assert [tuple(p.shape) for p in per] == [(4, 5, 11), (3, 9, 11), (2, 2, 11)]
    with pytest.raises(ValueError, match=r"pad_index=0.5 cannot be stored.*pad_index=0"):
        Trainer(nn.Identity(), None, progress=False).predict(
            [torch.ones(1, 2, dtype=torch.long), torch.ones(1, 3).long()], pad_index=0.5
        )


@dataclasses.dataclass
class LMOutput:
    """A Hugging Face-like output: logits, a loss, a per-batch cache object and hidden states."""

    logits: torch.Tensor
    loss: torch.Tensor | None = None
    past_key_values: object | None = None
    hidden_states: tuple | None = None


class Cache:
    def __init__(self, k):
        self.k = k


class LM(TokenLogits):
    def forward(self, input_ids, labels=None):
        h = self.emb(input_ids)
        logits = self.head(h)
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten()) if labels is not None else None
        return LMOutput(logits, loss, Cache(h.detach()), (h, h))


def test_loss_and_caches_are_left_out_by_default_and_kept_on_request():
    batches = [{"input_ids": ids, "labels": ids} for ids in _ragged_batches()]
    trainer = Trainer(LM(), None, progress=False)
    out = trainer.predict(batches)
    assert isinstance(out, LMOutput) and out.logits.shape == (9, 9, 11)
    assert out.loss is None and out.past_key_values is None and out.hidden_states is None
    kept = trainer.predict(batches, keep=("loss", "past_key_values", "hidden_states"))
    assert kept.loss.shape == (3,)  # one per batch, stacked
    assert isinstance(kept.past_key_values, list) and all(isinstance(c, Cache) for c in kept.past_key_values)
    assert kept.hidden_states[0].shape == (9, 9, 8)
    dict_out = Trainer(nn.Linear(3, 2), None, predict_step=lambda m, b: {"y": m(b), "loss": m(b).sum()}).predict(
        [torch.randn(2, 3)]
    )
    assert set(dict_out) == {"y"}
    with pytest.raises(ValueError, match=r"keep= got \['los'\].*'loss', 'past_key_values'"):
        trainer.predict(batches, keep=("los",))


def test_tuple_and_namedtuple_outputs_keep_their_type():
    import collections

    Pair = collections.namedtuple("Pair", "a b")
    model = nn.Linear(3, 2)
    out = Trainer(model, None, predict_step=lambda m, b: Pair(m(b), m(b).sum(1))).predict(
        [torch.randn(2, 3), torch.randn(3, 3)]
    )
    assert isinstance(out, Pair) and out.a.shape == (5, 2) and out.b.shape == (5,)


# -- dtype and memory ---------------------------------------------------------------------------------------------
@pytest.mark.skipif(not precision_support("cpu")["bf16-mixed"][0], reason="no bf16 autocast on this CPU")
def test_bf16_mixed_predictions_are_float32_unless_keep_dtype():
    model = mlp()
    trainer = Trainer(model, None, precision="bf16-mixed", device="cpu", progress=False)
    out = trainer.predict(make_loader(X, Y, batch_size=16))
    assert out.dtype == torch.float32
    out.numpy()  # the point of float32: numpy has no bfloat16
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(out, model(X).float())
    assert trainer.predict(make_loader(X, Y, batch_size=16), keep_dtype=True).dtype == torch.bfloat16


@pytest.mark.slow
def test_predict_holds_no_batch_after_its_step():
    """Each batch (and its outputs' graph) is released before the next batch is computed."""
    alive: list[list[weakref.ref]] = []
    model = nn.Linear(10, 3)

    def batches():
        for i in range(0, 48, 16):
            x, y = X[i : i + 16].clone(), Y[i : i + 16].clone()
            alive.append([weakref.ref(x), weakref.ref(y)])
            yield x, y

    seen = []

    def check(module, args):
        gc.collect()
        seen.append(sum(r() is not None for refs in alive[:-1] for r in refs))

    hook = model.register_forward_pre_hook(check)
    try:
        out = Trainer(model, nn.CrossEntropyLoss(), progress=False).predict(batches())
    finally:
        hook.remove()
    assert out.shape == (48, 3)
    assert seen == [0, 0, 0], f"earlier batches still alive at each step: {seen}"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_predict_on_cuda_moves_outputs_to_cpu_as_it_goes():
    """Device memory stays at one batch's worth: outputs go to the CPU batch by batch (to_cpu=True)."""
    model = nn.Linear(256, 4096).cuda()
    loader = [torch.randn(512, 256) for _ in range(16)]  # 16 x 8 MiB of outputs
    trainer = Trainer(model, None, device="cuda", progress=False)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = trainer.predict(loader)
    peak = torch.cuda.max_memory_allocated() - base
    assert out.device.type == "cpu" and out.shape == (8192, 4096)
    assert peak < 4 * 512 * 4096 * 4, f"peak {peak / 2**20:.0f} MiB: outputs were kept on the device"
    on_device = trainer.predict(loader, to_cpu=False)
    assert on_device.device.type == "cuda" and torch.allclose(on_device.cpu(), out)


# -- Trainer(model, criterion, optimizer=None): evaluation and prediction only -------------------------------------
def test_trainer_without_optimizer_evaluates_and_predicts_a_frozen_model():
    model = mlp()
    for p in model.parameters():
        p.requires_grad_(False)
    loader = make_loader(X, Y, batch_size=16)
    trainer = Trainer(model, nn.CrossEntropyLoss(), metrics={"acc": accuracy})
    assert trainer.optimizer is None
    logs = trainer.evaluate(loader)
    with torch.no_grad():
        out = model(X)
    assert logs["val_loss"] == pytest.approx(nn.functional.cross_entropy(out, Y).item(), rel=1e-6)
    assert logs["val_acc"] == pytest.approx((out.argmax(1) == Y).float().mean().item())
    assert torch.equal(trainer.predict(loader), out)


@pytest.mark.parametrize("call", ["fit", "lr_find", "set_lr", "save_checkpoint"])
def test_trainer_without_optimizer_refuses_to_train_naming_the_optimizer(call, tmp_path):
    model = mlp()
    before = [p.detach().clone() for p in model.parameters()]
    trainer = Trainer(model, nn.CrossEntropyLoss(), progress=False)
    loader = make_loader(X, Y, batch_size=16)
    run = {
        "fit": lambda: trainer.fit(loader),
        "lr_find": lambda: trainer.lr_find(loader, steps=5),
        "set_lr": lambda: trainer.set_lr(0.1),
        "save_checkpoint": lambda: trainer.save_checkpoint(str(tmp_path / "x.ckpt")),
    }[call]
    with pytest.raises(ValueError, match=rf"{call} needs an optimizer.*optimizer=None.*torch.optim.AdamW"):
        run()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert trainer.status == "idle" and not list(tmp_path.iterdir())


def test_frozen_model_with_a_named_optimizer_points_to_optimizer_none():
    model = mlp()
    for p in model.parameters():
        p.requires_grad_(False)
    with pytest.raises(ValueError, match=r"optimizer='adamw' has nothing to train.*optimizer=None"):
        Trainer(model, nn.CrossEntropyLoss(), "adamw")
    with pytest.raises(ValueError, match=r"scheduler was given without an optimizer"):
        Trainer(
            model,
            nn.CrossEntropyLoss(),
            scheduler=torch.optim.lr_scheduler.StepLR(torch.optim.SGD(mlp().parameters(), 0.1), 1),
        )


# -- recurrent state: per batch, never concatenated along its layer dimension -------------------------------------
class LSTMLanguageModel(nn.Module):
    """``forward(ids) -> (logits, (h, c))`` as ``nn.LSTM`` returns its state: (layers, batch, hidden) each."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(11, 8)
        self.lstm = nn.LSTM(8, 32, num_layers=2, batch_first=True)
        self.head = nn.Linear(32, 11)

    def forward(self, ids):
        out, (h, c) = self.lstm(self.emb(ids))
        return self.head(out), (h, c)


@pytest.mark.parametrize("sizes", [(10, 10, 10), (10, 10, 4)])
def test_rnn_state_comes_back_per_batch_and_the_outputs_concatenated(sizes):
    model = LSTMLanguageModel()
    trainer = Trainer(model, None, progress=False)
    batches = [torch.randint(0, 11, (n, 7)) for n in sizes]
    logits, (h, c) = trainer.predict(batches)
    assert logits.shape == (sum(sizes), 7, 11)  # batch-first: one row per sample
    assert isinstance(h, list) and [tuple(t.shape) for t in h] == [(2, n, 32) for n in sizes]  # not (6, 10, 32)
    assert isinstance(c, list) and len(c) == len(sizes)
    row = 0
    with torch.no_grad():
        for ids, hb, cb in zip(batches, h, c, strict=True):
            out, (h0, c0) = model(ids)
            assert torch.equal(logits[row : row + len(ids)], out) and torch.equal(hb, h0) and torch.equal(cb, c0)
            row += len(ids)
    per = trainer.predict(batches, per_batch=True)
    assert [tuple(p[1][0].shape) for p in per] == [(2, n, 32) for n in sizes]


class _Named(nn.Module):
    """Outputs a tensor and a plain Python list with one name per item (a tokenizer's words, file names)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> dict[str, object]:
        return {"logits": self.lin(x), "names": [f"item{int(v)}" for v in x[:, 0]]}


@pytest.mark.parametrize("sizes", [(4, 2), (4, 4)])
def test_a_list_of_one_value_per_item_comes_back_as_one_list(sizes: tuple[int, ...]) -> None:
    batches, start = [], 0
    for n in sizes:
        x = torch.zeros(n, 4)
        x[:, 0] = torch.arange(start, start + n)
        batches.append(x)
        start += n
    out = Trainer(_Named(), None, progress=False).predict(batches)
    assert out["names"] == [f"item{i}" for i in range(sum(sizes))]
    assert out["logits"].shape == (sum(sizes), 3)


class _TwoInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.lin(a + b)


def test_predict_on_batches_of_inputs_alone_names_num_inputs() -> None:
    batches = [(torch.randn(8, 4), torch.randn(8, 4))]
    with pytest.raises(TypeError, match="missing 1 required positional argument") as caught:
        Trainer(_TwoInputs(), None, progress=False).predict(batches)
    assert "num_inputs=2" in "".join(getattr(caught.value, "__notes__", [])) + str(caught.value)
    out = Trainer(_TwoInputs(), None, progress=False, num_inputs=2).predict(batches)
    assert out.shape == (8, 3)


def test_predict_leaves_a_submodule_frozen_in_eval_mode_in_eval_mode() -> None:
    model = nn.Sequential(nn.Linear(10, 8), nn.BatchNorm1d(8), nn.Linear(8, 3))
    model.train()
    model[1].eval()  # a frozen BatchNorm: its running statistics must not move in the next fit
    Trainer(model, None, progress=False).predict([X[:16]])
    assert [m.training for m in model.modules()] == [True, True, False, True]


def test_predict_refuses_batch_options_that_do_not_apply_to_its_batches() -> None:
    tuples = Trainer(mlp(), None, progress=False, target_keys="label")
    with pytest.raises(ValueError, match=r"target_keys='label' names entries of dict .*first predict\(\) loader batch"):
        tuples.predict([(X[:16], Y[:16])])

    class Named(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(10, 3)

        def forward(self, feats: torch.Tensor) -> torch.Tensor:
            return self.layer(feats)

    with pytest.raises(ValueError, match=r"num_inputs=1 counts the leading elements .* Drop num_inputs="):
        Trainer(Named(), None, progress=False, num_inputs=1).predict(_feature_batches())


@pytest.mark.parametrize("empty", ["list", "DataLoader", "generator"])
def test_predict_refuses_a_loader_that_yields_no_batches(empty: str) -> None:
    nothing: list[torch.Tensor] = []
    loaders = {
        "list": nothing,
        "DataLoader": make_loader(X[:3], Y[:3], batch_size=4, drop_last=True),
        "generator": (b for b in nothing),
    }
    with pytest.raises(ValueError, match=r"predict\(\) loader yielded no batches.*drop_last=True"):
        Trainer(mlp(), None, progress=False).predict(loaders[empty])


# -- the order of the outputs -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "make_sampler",
    [
        lambda ds: torch.utils.data.RandomSampler(ds),
        lambda ds: torch.utils.data.SubsetRandomSampler(range(len(ds))),
        lambda ds: torch.utils.data.WeightedRandomSampler([1.0] * len(ds), len(ds)),
        lambda ds: torch.utils.data.DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True),
    ],
    ids=["shuffle", "subset", "weighted", "distributed"],
)
@pytest.mark.parametrize("as_batch_sampler", [False, True])
def test_predict_refuses_a_loader_that_shuffles(make_sampler, as_batch_sampler):
    """Outputs in a random order match no row of the dataset: refused with the fix, before the model runs."""
    dataset = torch.utils.data.TensorDataset(X, Y)
    sampler = make_sampler(dataset)
    if as_batch_sampler:
        loader = torch.utils.data.DataLoader(dataset, batch_sampler=torch.utils.data.BatchSampler(sampler, 8, False))
    else:
        loader = torch.utils.data.DataLoader(dataset, batch_size=8, sampler=sampler)
    model = mlp()
    calls = []
    model.register_forward_hook(lambda *_: calls.append(1))
    trainer = Trainer(model, nn.CrossEntropyLoss(), "adamw", progress=False)
    with pytest.raises(ValueError, match=r"predict\(\) loader.*Sampler.*shuffle=False") as info:
        trainer.predict(loader)
    assert type(sampler).__name__ in str(info.value)
    assert calls == []


def test_predict_keeps_the_dataset_order_of_a_loader_in_order():
    dataset = torch.utils.data.TensorDataset(X, Y)
    model = mlp()
    trainer = Trainer(model, nn.CrossEntropyLoss(), "adamw", progress=False)
    in_order = torch.utils.data.DataLoader(dataset, batch_size=5, sampler=torch.utils.data.SequentialSampler(dataset))
    with torch.no_grad():
        expected = model(X)
    torch.testing.assert_close(trainer.predict(in_order), expected)
    torch.testing.assert_close(trainer.predict(torch.utils.data.DataLoader(dataset, batch_size=5)), expected)
    # the loader fit trains on is refused, the same data in order is not
    torch.testing.assert_close(trainer.predict(dataset, batch_size=7), expected)
