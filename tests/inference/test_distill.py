"""DistillationLoss as the Trainer's criterion (issue 24): the formula, the history's loss parts and agreement,
a frozen eval-mode teacher that is never trained, saved or counted, accumulation, resume, precision, Hugging Face
outputs, and the bad-input errors."""

from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from inference_data import batches, digits, mlp, train
from torch import nn

from nbtrainer import DistillationLoss, Trainer
from nbtrainer.plotting import classify_metrics, higher_is_better


@pytest.fixture(scope="module")
def data():
    xt, yt, xv, yv = digits()
    return batches(xt, yt), batches(xv, yv)


@pytest.fixture(scope="module")
def teacher(data):
    return train(mlp(64, seed=0), data[0], epochs=4)


def test_loss_is_the_hinton_formula(teacher) -> None:
    student = mlp(16, seed=1)
    loss = DistillationLoss(teacher, temperature=3.0, kd_weight=0.25).attach(student)
    x, y = torch.rand(20, 64), torch.randint(0, 10, (20,))
    s = student(x)
    with torch.no_grad():
        t = teacher(x)
    expected = 0.25 * 9.0 * F.kl_div(
        F.log_softmax(s / 3, -1), F.softmax(t / 3, -1), reduction="batchmean"
    ) + 0.75 * F.cross_entropy(s, y)
    got = loss(s, y)
    torch.testing.assert_close(got, expected)
    got.backward()  # the gradient reaches the student only
    assert student[0].weight.grad is not None
    assert all(p.grad is None and not p.requires_grad for p in teacher.parameters())


def test_trainer_history_has_parts_and_agreement(data, teacher) -> None:
    student = mlp(16, seed=1)
    before = copy.deepcopy(teacher.state_dict())
    loss = DistillationLoss(teacher, temperature=2.0, kd_weight=0.6)
    trainer = Trainer(student, loss, torch.optim.AdamW(student.parameters(), 1e-2), progress=False, seed=0)
    history = trainer.fit(data[0], data[1], epochs=3)
    for epoch in history.epochs:
        for prefix in ("", "val_"):
            kd, base = epoch[f"{prefix}kd_loss"], epoch[f"{prefix}base_loss"]
            assert math.isclose(epoch[f"{prefix}loss"], 0.6 * kd + 0.4 * base, rel_tol=1e-5)
            assert 0.0 <= epoch[f"{prefix}agreement"] <= 1.0
    # a student that learns from a good teacher comes to agree with it
    assert history.epochs[-1]["val_agreement"] > max(0.8, history.epochs[0]["val_agreement"])
    # the teacher never trained, stayed in eval mode, frozen
    assert not teacher.training
    for key, value in teacher.state_dict().items():
        torch.testing.assert_close(value, before[key])
    # ... and is not one of the trainer's parameters
    assert trainer.param_counts.trainable == sum(p.numel() for p in student.parameters())
    # charts and tables: agreement on the 0-1 axis, higher is better; the loss parts on their own axis
    assert classify_metrics(history.epochs) == (["agreement"], ["kd_loss", "base_loss"])
    assert higher_is_better("val_agreement")


def test_user_metric_with_the_same_name_wins(data, teacher) -> None:
    student = mlp(16, seed=1)
    mine = {"agreement": lambda out, y: torch.zeros(())}
    trainer = Trainer(student, DistillationLoss(teacher), torch.optim.SGD(student.parameters(), 0.1), metrics=mine)
    history = trainer.fit(data[0][:2], epochs=1)
    assert history.epochs[0]["agreement"] == 0.0
    assert "kd_loss" in history.epochs[0]


def test_teacher_is_not_in_checkpoints(tmp_path, data, teacher) -> None:
    student = mlp(16, seed=1)
    trainer = Trainer(student, DistillationLoss(teacher), torch.optim.SGD(student.parameters(), 0.1), progress=False)
    trainer.fit(data[0][:3], epochs=1)
    path = trainer.save_checkpoint(str(tmp_path / "ckpt.pt"))
    ckpt = torch.load(path, weights_only=True)
    assert set(ckpt["model"]) == set(student.state_dict())
    saved = sum(t.numel() for t in ckpt["model"].values())
    assert saved == sum(p.numel() for p in student.parameters())

    def tensors(obj):
        if isinstance(obj, torch.Tensor):
            yield obj
        elif isinstance(obj, dict):
            for v in obj.values():
                yield from tensors(v)
        elif isinstance(obj, (list, tuple)):
            for v in obj:
                yield from tensors(v)

    teacher_shapes = {tuple(p.shape) for p in teacher.parameters()} - {tuple(p.shape) for p in student.parameters()}
    assert not [t for t in tensors(ckpt) if tuple(t.shape) in teacher_shapes]


def test_resume_continues_exactly(tmp_path, data, teacher) -> None:
    def run(epochs, resume_from=None):
        student = mlp(16, seed=1)
        trainer = Trainer(
            student,
            DistillationLoss(teacher, kd_weight=0.7),
            torch.optim.AdamW(student.parameters(), 3e-3),
            progress=False,
            seed=0,
        )
        history = trainer.fit(data[0][:6], data[1][:2], epochs=epochs, resume_from=resume_from)
        return trainer, history

    _, full = run(2)
    first, _ = run(1)
    path = first.save_checkpoint(str(tmp_path / "one.pt"))
    _, resumed = run(2, resume_from=path)
    for key in ("loss", "kd_loss", "base_loss", "agreement", "val_kd_loss"):
        assert resumed.epochs[-1][key] == pytest.approx(full.epochs[-1][key], rel=1e-6), key


def test_accumulation_matches_one_big_batch(teacher) -> None:
    x, y = torch.rand(32, 64), torch.randint(0, 10, (32,))

    def one_step(accum, data):
        student = mlp(16, seed=3)
        loss = DistillationLoss(teacher, temperature=2.0, kd_weight=0.5)
        trainer = Trainer(
            student, loss, torch.optim.SGD(student.parameters(), lr=0.5), grad_accum_steps=accum, progress=False
        )
        trainer.fit(data, epochs=1)
        return student

    big = one_step(1, [(x, y)])
    small = one_step(2, [(x[:16], y[:16]), (x[16:], y[16:])])
    for a, b in zip(big.parameters(), small.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_teacher_runs_under_the_trainers_precision(data, teacher) -> None:
    seen = []
    handle = teacher.register_forward_hook(lambda m, a, o: seen.append((torch.is_autocast_enabled("cpu"), o.dtype)))
    try:
        student = mlp(16, seed=1)
        trainer = Trainer(
            student,
            DistillationLoss(teacher),
            torch.optim.SGD(student.parameters(), 0.1),
            precision="bf16-mixed",
            progress=False,
        )
        history = trainer.fit(data[0][:2], epochs=1)
    finally:
        handle.remove()
    assert seen and all(enabled and dtype == torch.bfloat16 for enabled, dtype in seen)
    assert math.isfinite(history.epochs[0]["kd_loss"])
    assert all(p.dtype == torch.float32 for p in teacher.parameters())  # autocast, not a cast of the weights


def test_predict_does_not_run_the_teacher(data, teacher) -> None:
    calls = []
    handle = teacher.register_forward_pre_hook(lambda m, a: calls.append(1))
    try:
        student = mlp(16, seed=1)
        trainer = Trainer(student, DistillationLoss(teacher), torch.optim.SGD(student.parameters(), 0.1))
        trainer.predict(data[1][:2])
    finally:
        handle.remove()
    assert calls == []


def test_hugging_face_outputs() -> None:
    transformers = pytest.importorskip("transformers")
    config = {"vocab_size": 50, "num_hidden_layers": 1, "num_attention_heads": 2, "max_position_embeddings": 16}
    torch.manual_seed(0)
    teacher = transformers.BertForSequenceClassification(
        transformers.BertConfig(hidden_size=32, intermediate_size=64, num_labels=3, **config)
    ).eval()
    student = transformers.BertForSequenceClassification(
        transformers.BertConfig(hidden_size=16, intermediate_size=32, num_labels=3, **config)
    )
    data = [{"input_ids": torch.randint(0, 50, (8, 10)), "labels": torch.randint(0, 3, (8,))} for _ in range(3)]
    trainer = Trainer(student, DistillationLoss(teacher, kd_weight=1.0), torch.optim.AdamW(student.parameters(), 1e-3))
    history = trainer.fit(data, data[:1], epochs=1)
    epoch = history.epochs[0]
    assert math.isclose(epoch["loss"], epoch["kd_loss"], rel_tol=1e-5)
    assert {"agreement", "val_agreement", "val_kd_loss"} <= set(epoch)


def test_trainer_widget_takes_it_as_criterion(data, teacher) -> None:
    from nbtrainer import TrainerWidget

    student = mlp(16, seed=1)
    widget = TrainerWidget(
        student,
        DistillationLoss(teacher),
        torch.optim.AdamW(student.parameters(), 3e-3),
        data[0][:4],
        data[1][:2],
        epochs=1,
    )
    history = widget.fit()
    assert {"kd_loss", "base_loss", "agreement", "val_agreement"} <= set(history.epochs[0])


# -- feature distillation --------------------------------------------------------------------------


def _shallow(seed: int) -> nn.Sequential:
    """The teacher's width (64) with one hidden layer fewer."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))


def test_feature_distillation_adds_the_mse_of_named_layers(teacher) -> None:
    student = _shallow(2)
    loss = DistillationLoss(teacher, kd_weight=0.5, features={"1": "3"}, feature_weight=0.3).attach(student)
    x, y = torch.rand(12, 64), torch.randint(0, 10, (12,))
    s = student(x)
    hidden = torch.relu(student[0](x))
    with torch.no_grad():
        t = teacher(x)
        t_hidden = teacher[:4](x)  # the output of the teacher's layer "3" (the second ReLU)
    expected_kd = 0.5 * 4.0 * F.kl_div(F.log_softmax(s / 2, -1), F.softmax(t / 2, -1), reduction="batchmean")
    expected = expected_kd + 0.5 * F.cross_entropy(s, y) + 0.3 * F.mse_loss(hidden, t_hidden)
    torch.testing.assert_close(loss(s, y), expected)


def test_feature_loss_is_logged_and_trains(data, teacher) -> None:
    student = _shallow(2)
    loss = DistillationLoss(teacher, features={"1": "3"})
    trainer = Trainer(student, loss, torch.optim.AdamW(student.parameters(), 3e-3), progress=False, seed=0)
    history = trainer.fit(data[0], data[1][:2], epochs=2)
    first, last = history.epochs
    assert last["feature_loss"] < first["feature_loss"] and "val_feature_loss" in last
    assert math.isclose(
        last["loss"], 0.5 * last["kd_loss"] + 0.5 * last["base_loss"] + last["feature_loss"], rel_tol=1e-5
    )


def test_feature_layers_must_exist_and_match(data, teacher) -> None:
    with pytest.raises(ValueError, match=r"the teacher has no layer 'encoder'. Its layers.*'0', '1'"):
        DistillationLoss(teacher, features={"1": "encoder"})
    with pytest.raises(ValueError, match="the student has no layer '7'"):
        DistillationLoss(teacher, features={"7": "3"}).attach(_shallow(2))
    with pytest.raises(TypeError, match="features must map student layer names"):
        DistillationLoss(teacher, features=["1"])  # type: ignore[arg-type]
    narrow = mlp(16, seed=1)  # 16 wide where the teacher is 64
    trainer = Trainer(narrow, DistillationLoss(teacher, features={"1": "1"}), torch.optim.SGD(narrow.parameters(), 0.1))
    with pytest.raises(
        ValueError, match=r"student's '1' \(output \(64, 16\)\) with the teacher's '1' \(output \(64, 64\)\)"
    ):
        trainer.fit(data[0][:1], epochs=1)


# -- bad input -------------------------------------------------------------------------------------


@pytest.mark.parametrize("temperature", [0, -1.0, float("inf"), "2"])
def test_bad_temperature(teacher, temperature) -> None:
    with pytest.raises((ValueError, TypeError), match="temperature"):
        DistillationLoss(teacher, temperature=temperature)


@pytest.mark.parametrize("kd_weight", [-0.1, 1.5, True])
def test_bad_kd_weight(teacher, kd_weight) -> None:
    with pytest.raises(ValueError, match=r"kd_weight must be a number in \[0, 1\]"):
        DistillationLoss(teacher, kd_weight=kd_weight)


def test_teacher_with_other_outputs_fails_before_the_first_step(data) -> None:
    teacher = nn.Sequential(nn.Linear(64, 20)).eval()  # 20 classes, the student has 10
    student = mlp(16, seed=1)
    before = copy.deepcopy(student.state_dict())
    trainer = Trainer(student, DistillationLoss(teacher), torch.optim.SGD(student.parameters(), 0.1), progress=False)
    with pytest.raises(ValueError, match=r"teacher's outputs have shape \(64, 20\), the student's \(64, 10\)"):
        trainer.fit(data[0][:2], epochs=1)
    for key, value in student.state_dict().items():
        torch.testing.assert_close(value, before[key])


def test_teacher_in_training_mode_with_dropout_is_switched_once(data) -> None:
    teacher = mlp(32, seed=0, dropout=0.5)
    assert teacher.training
    with pytest.warns(UserWarning, match="training mode with Dropout.*switched it to eval"):
        loss = DistillationLoss(teacher)
    assert not teacher.training
    teacher.train()  # switched back by someone: eval again when it runs, without a second message
    student = mlp(16, seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Trainer(student, loss, torch.optim.SGD(student.parameters(), 0.1), progress=False).fit(data[0][:2], epochs=1)
    assert not teacher.training


def test_teacher_without_dropout_is_switched_silently() -> None:
    teacher = nn.Linear(64, 10)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        DistillationLoss(teacher)
    assert not teacher.training


def test_student_sharing_the_teachers_weights_is_refused(teacher) -> None:
    student = nn.Sequential(teacher[0], nn.ReLU(), nn.Linear(64, 10))
    with pytest.raises(ValueError, match="share 2 parameter tensors"):
        Trainer(student, DistillationLoss(teacher), torch.optim.SGD(student.parameters(), 0.1))


def test_outputs_it_did_not_see_are_refused(teacher) -> None:
    loss = DistillationLoss(teacher)  # never attached: it cannot know the inputs
    with pytest.raises(RuntimeError, match=r"loss.attach\(student\)"):
        loss(torch.randn(4, 10), torch.zeros(4, dtype=torch.long))


def test_a_copied_student_does_not_copy_the_teacher(teacher) -> None:
    student = mlp(16, seed=1)
    loss = DistillationLoss(teacher).attach(student)
    clone = copy.deepcopy(student)
    (hook,) = clone._forward_hooks.values()
    # the same loss, weakly: no second teacher in memory
    assert hook.loss() is loss  # type: ignore[attr-defined]  # our hook object, typed as a plain callable


def test_hooks_of_a_discarded_loss_remove_themselves(teacher) -> None:
    import gc

    student = mlp(16, seed=1)
    DistillationLoss(teacher, features={"1": "1"}).attach(_shallow(3))  # built and dropped, as a re-run cell does
    loss = DistillationLoss(teacher).attach(student)
    del loss
    gc.collect()
    with torch.no_grad():
        student(torch.rand(2, 64))
        teacher(torch.rand(2, 64))
    assert not student._forward_hooks and not teacher[1]._forward_hooks


class _Tagger(nn.Module):
    """A per-token classifier: (batch, length) token ids -> (batch, length, 5) logits."""

    def __init__(self, width: int, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.embed, self.out = nn.Embedding(20, width), nn.Linear(width, 5)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(self.embed(ids))


def _token_ce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, 5), labels.reshape(-1), ignore_index=-100)


def test_padded_positions_are_left_out_of_the_kd_term_and_agreement() -> None:
    # Found by distilling a padded token classifier: the KD term averaged over the pad positions too (labels -100,
    # skipped by the base loss), so the same sentences padded longer gave another loss and agreement.
    teacher, student = _Tagger(32, seed=0).eval(), _Tagger(8, seed=1)
    loss = DistillationLoss(teacher, temperature=2.0, kd_weight=0.5, base=_token_ce).attach(student)
    ids = torch.randint(1, 20, (4, 6))
    labels = torch.randint(0, 5, (4, 6))
    ids[:, 3:], labels[:, 3:] = 0, -100  # three real tokens, three of padding
    labels[0, 2] = -100  # and one ignored inside a sentence
    s = student(ids)
    with torch.no_grad():
        t = teacher(ids)
    keep = labels != -100
    kl = F.kl_div(F.log_softmax(s[keep] / 2, -1), F.softmax(t[keep] / 2, -1), reduction="batchmean")
    torch.testing.assert_close(loss(s, labels), 0.5 * 4.0 * kl + 0.5 * _token_ce(s, labels))
    torch.testing.assert_close(loss._kd_metric(s, labels), 4.0 * kl)
    agreement = (s.argmax(-1) == t.argmax(-1))[keep].float().mean()
    torch.testing.assert_close(loss._agreement(s, labels), agreement)


def test_leaving_out_padded_positions_needs_no_host_sync() -> None:
    """The padded positions are left out by a mask, not by indexing with a boolean tensor: that needs the count of
    kept positions on the host, a sync every step on a GPU. On the meta device nothing can be counted, so a
    data-dependent shape raises there (torch.nonzero has no meta kernel)."""
    teacher, student = _Tagger(32, seed=0).eval().to("meta"), _Tagger(8, seed=1).to("meta")
    loss = DistillationLoss(teacher, temperature=2.0, kd_weight=0.5, base=_token_ce).attach(student)
    ids, labels = torch.randint(1, 20, (4, 6)).to("meta"), torch.randint(0, 5, (4, 6)).to("meta")
    s = student(ids)
    assert loss(s, labels).shape == () and loss._agreement(s, labels).shape == ()


def test_a_batch_of_padding_only_adds_no_kd_loss() -> None:
    teacher, student = _Tagger(32, seed=0).eval(), _Tagger(8, seed=1)
    loss = DistillationLoss(teacher, kd_weight=1.0, base=_token_ce).attach(student)
    ids = torch.randint(1, 20, (2, 4))
    assert loss(student(ids), torch.full((2, 4), -100)).item() == 0.0


def test_per_sample_labels_of_minus_100_still_learn_from_the_teacher(teacher) -> None:
    # An unlabeled sample (-100) is what a teacher can still teach: only per-position labels mark padding. With
    # every label ignored the base loss is nan, and 0 * nan used to make the kd_weight=1 loss nan as well.
    student = mlp(16, seed=1)
    loss = DistillationLoss(teacher, kd_weight=1.0).attach(student)
    x = torch.rand(6, 64)
    s = student(x)
    with torch.no_grad():
        t = teacher(x)
    expected = 4.0 * F.kl_div(F.log_softmax(s / 2, -1), F.softmax(t / 2, -1), reduction="batchmean")
    torch.testing.assert_close(loss(s, torch.full((6,), -100)), expected)


def test_a_bf16_teacher_teaches_an_fp32_student_in_its_own_dtype(data, teacher) -> None:
    # Found by keeping the teacher in bf16 to halve its memory: the fp32 step failed on the first batch with
    # "mat1 and mat2 must have the same dtype" (and a hint to convert the targets to float).
    half = copy.deepcopy(teacher).to(torch.bfloat16)
    student = mlp(16, seed=1)
    loss = DistillationLoss(half, kd_weight=1.0)
    trainer = Trainer(student, loss, "adamw", lr=1e-3, progress=False)
    before = [p.clone() for p in student.parameters()]
    history = trainer.fit(data[0][:2], epochs=1)
    assert math.isfinite(history.epochs[0]["kd_loss"])
    assert all(p.dtype == torch.bfloat16 for p in half.parameters())  # not cast up behind the user's back
    assert any(not torch.equal(a, b) for a, b in zip(before, student.parameters(), strict=True))
    x = data[0][0][0][:8]
    s = student(x)
    with torch.no_grad():
        t = half(x.to(torch.bfloat16)).float()
    expected = 4.0 * F.kl_div(F.log_softmax(s / 2, -1), F.softmax(t / 2, -1), reduction="batchmean")
    torch.testing.assert_close(loss(s, None), expected)


def _causal_lm(kind: str, width: int, seed: int) -> nn.Module:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(seed)
    if kind == "llama":
        config = transformers.LlamaConfig(vocab_size=40, hidden_size=width, intermediate_size=2 * width,
                                          num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                                          max_position_embeddings=16)  # fmt: skip
        return transformers.LlamaForCausalLM(config)
    config = transformers.GPT2Config(vocab_size=40, n_embd=width, n_layer=1, n_head=2, n_positions=16, resid_pdrop=0.0,
                                     embd_pdrop=0.0, attn_pdrop=0.0)  # fmt: skip
    return transformers.GPT2LMHeadModel(config)


def _padded_tokens() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two sequences of 7 token ids: the second ends in 3 pad tokens and starts with a 2-token prompt (ignored)."""
    ids = torch.randint(1, 40, (2, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    ids[1, 4:], mask[1, 4:] = 0, 0
    labels = ids.masked_fill(mask == 0, -100)
    labels[1, :2] = -100
    return ids, mask, labels


def _causal_ce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """A user's causal-LM base loss, shifting as the model's own loss does."""
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100)


@pytest.mark.parametrize("base", ["default", "shifting"])
@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_a_causal_lm_distills_over_the_positions_its_shifted_labels_keep(kind, base) -> None:
    """A causal LM's logits at position t predict token t + 1: its labels are the input ids, shifted inside the
    model's own loss. The KD term, the agreement and the default base loss count position t where label t + 1 is
    kept, as Hugging Face's causal-LM loss does: the last position of each sequence (nothing to predict) and the
    position before a pad or prompt token are left out. With the unshifted labels one extra position per sequence
    was counted, and the teacher taught over positions a shifting base loss skips (the default base failed)."""
    teacher, student = _causal_lm(kind, 32, seed=0).eval(), _causal_lm(kind, 16, seed=1)
    loss = DistillationLoss(teacher, temperature=2.0, kd_weight=0.5, base=_causal_ce if base == "shifting" else None)
    loss.attach(student)
    ids, mask, labels = _padded_tokens()
    s = student(input_ids=ids, attention_mask=mask)
    with torch.no_grad():
        t = teacher(input_ids=ids, attention_mask=mask).logits
    keep = torch.zeros_like(labels, dtype=torch.bool)
    keep[:, :-1] = labels[:, 1:] != -100
    assert keep.sum().item() == 6 + 2  # the first's six; of the second positions 1 and 2 (its tokens 2 and 3)
    kl = F.kl_div(F.log_softmax(s.logits[keep] / 2, -1), F.softmax(t[keep] / 2, -1), reduction="batchmean")
    total, kd, base = loss(s, labels), loss._kd_metric(s, labels), loss._base_metric(s, labels)
    agreed = loss._agreement(s, labels)
    own = student(input_ids=ids, attention_mask=mask, labels=labels).loss  # the model's own causal-LM loss
    torch.testing.assert_close(kd, 4.0 * kl)
    torch.testing.assert_close(base, own)
    torch.testing.assert_close(total, 0.5 * 4.0 * kl + 0.5 * own)
    torch.testing.assert_close(agreed, (s.logits.argmax(-1) == t.argmax(-1))[keep].float().mean())


def test_a_causal_lm_is_distilled_by_the_trainer_on_its_dict_batches() -> None:
    """The Trainer's way in: dict batches whose labels go to the criterion; the evaluated base loss is the model's
    own loss, and the run trains."""
    teacher, student = _causal_lm("llama", 32, seed=0).eval(), _causal_lm("llama", 16, seed=1)
    ids, mask, labels = _padded_tokens()
    batch = {"input_ids": ids, "attention_mask": mask, "labels": labels}
    trainer = Trainer(student, DistillationLoss(teacher), "adamw", lr=1e-3, progress=False, run_store=False)
    history = trainer.fit([batch] * 3, epochs=1)
    assert math.isfinite(history.epochs[0]["kd_loss"])
    with torch.no_grad():
        own = student(**batch).loss.item()
    assert trainer.evaluate([batch])["val_base_loss"] == pytest.approx(own, rel=1e-5)


def test_labels_already_aligned_with_the_logits_are_not_shifted_again() -> None:
    """``shift_labels=False`` for a causal LM whose batches carry the next tokens as labels (already shifted); and
    ``shift_labels=True`` for a model of one's own that follows Hugging Face's convention, here on the meta device
    (the shifted mask needs no host sync either)."""
    teacher, student = _causal_lm("gpt2", 32, seed=0).eval(), _causal_lm("gpt2", 16, seed=1)
    loss = DistillationLoss(teacher, kd_weight=1.0, shift_labels=False).attach(student)
    ids, mask, labels = _padded_tokens()
    s = student(input_ids=ids, attention_mask=mask)
    with torch.no_grad():
        t = teacher(input_ids=ids, attention_mask=mask).logits
    keep = labels != -100
    kl = F.kl_div(F.log_softmax(s.logits[keep] / 2, -1), F.softmax(t[keep] / 2, -1), reduction="batchmean")
    torch.testing.assert_close(loss(s, labels), 4.0 * kl)
    teacher, student = _Tagger(32, seed=0).eval().to("meta"), _Tagger(8, seed=1).to("meta")
    loss = DistillationLoss(teacher, base=_token_ce, shift_labels=True).attach(student)
    ids, labels = torch.randint(1, 20, (4, 6)).to("meta"), torch.randint(0, 5, (4, 6)).to("meta")
    s = student(ids)
    assert loss(s, labels).shape == () and loss._agreement(s, labels).shape == ()
