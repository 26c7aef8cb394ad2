"""check_data: each kind of finding names the items it concerns (dataset indices, through a shuffled loader too) and
comes with advice; a new user's three silent cases (a leaked validation set, inputs x1000, a 95/5 split) get a line
each in the progress output; labels past the model's outputs refuse the fit before its first step; the pass leaves
the run's random generators and the model as they were and keeps no copy of the items; bad input gets a clear error
or a plain statement."""

from __future__ import annotations

import concurrent.futures
import io
import random
import re
import threading
from typing import Any

import numpy as np
import pytest
import torch
from conftest import make_classification, mlp
from torch.utils.data import DataLoader, TensorDataset

from nbtrainer import DataReport, ProgressBar, Trainer
from nbtrainer._know._stats import TargetStats


def _trainer(model: torch.nn.Module | None = None, **kw: Any) -> Trainer:
    model = model if model is not None else mlp()
    return Trainer(model, torch.nn.CrossEntropyLoss(), "sgd", lr=0.1, progress=False, run_store=False, **kw)


def _kinds(report: DataReport) -> list[str]:
    return sorted(p.kind for p in report.problems)


def test_clean_data_has_no_finding():
    x, y = make_classification(n=120)
    report = _trainer().check_data((x[:100], y[:100]), (x[100:], y[100:]))
    assert report.problems == [] and report.ok and set(report.lights().values()) == {"ok"}
    assert report.splits["train"]["items"] == 100 and report.splits["val"]["items"] == 20
    assert report.outputs == 3 and sum(report.splits["train"]["classes"].values()) == 100


def test_duplicates_within_and_across_are_found_by_dataset_index_through_a_shuffled_loader():
    x, y = make_classification(n=60)
    x[17], y[17] = x[4], y[4]  # a copy inside training
    x[30], y[30] = x[8], (y[8] + 1) % 3  # a copy with another label
    # five new items, from their own seed: the global generator may stand at seed 0, where make_classification's
    # own rows come from (a draw from it then repeats training's first rows)
    new = torch.randn(5, 10, generator=torch.Generator().manual_seed(1234))
    val_x, val_y = torch.cat([x[40:45], new]), torch.cat([y[40:45], torch.zeros(5, dtype=torch.long)])
    train = DataLoader(TensorDataset(x, y), batch_size=7, shuffle=True)  # the check reads in dataset order
    report = _trainer().check_data(train, DataLoader(TensorDataset(val_x, val_y), batch_size=4))
    assert _kinds(report) == ["conflicting_labels", "duplicates_across", "duplicates_within"]
    within = report.by_kind("duplicates_within")[0]
    assert within.data["indices"] == [17, 30] and [4, 17] in within.data["groups"] and within.level == "warning"
    assert report.by_kind("conflicting_labels")[0].data["indices"] == [8, 30]
    across = report.by_kind("duplicates_across")[0]
    assert across.data["val_indices"] == [0, 1, 2, 3, 4] and across.data["train_indices"] == [40, 41, 42, 43, 44]
    assert "5 of 10 validation items (50%)" in across.message and across.advice and across.level == "problem"
    assert report.lights()["duplicates"] == "problem" and not report.ok
    # the advice is a call that works: run as written, the copies are gone (it once named no callable API)
    import nbtrainer

    names: dict[str, Any] = {"nbtrainer": nbtrainer, "report": report, "train_set": TensorDataset(x, y)}
    names["val_set"] = TensorDataset(val_x, val_y)
    for problem, target in ((across, "val_set"), (within, "train_set")):
        code = re.search(rf"{target} = (nbtrainer\.CleanedDataset\.of\(.*?\]\))", problem.advice)
        assert code, problem.advice
        names[target] = eval(code.group(1), names)  # the advice's own code, run as a user would
    again = _trainer().check_data(DataLoader(names["train_set"], batch_size=7), DataLoader(names["val_set"]))
    assert len(names["val_set"]) == 5 and len(names["train_set"]) == 58
    assert "duplicates_across" not in _kinds(again) and "duplicates_within" not in _kinds(again)


def test_values_scale_constant_and_targets():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(200, 6, generator=g)
    x[:, 2] = 3.0  # constant
    x[:, 4] *= 1e4  # a feature on another scale
    x[11, 1] = float("nan")
    x[23, 5] = float("inf")
    y = torch.zeros(200, dtype=torch.long)
    y[190:] = 1  # 95/5
    val_y = torch.full((8,), 2)  # a class training lacks
    report = _trainer(mlp(d=6)).check_data((x, y), (torch.randn(8, 6, generator=g), val_y))
    assert _kinds(report) == ["constant", "imbalance", "nonfinite", "scale", "unseen_class"]  # validation: fine
    bad = report.by_kind("nonfinite")[0]
    assert bad.data["indices"] == [11, 23] and bad.data["features"] == [1, 5] and bad.data["items"] == 2
    assert report.by_kind("constant")[0].data["features"] == [2]
    scale = report.by_kind("scale")[0]
    assert "feature 4" in scale.message and "Standardize" in scale.advice
    imbalance = report.by_kind("imbalance")[0]
    assert imbalance.data["counts"] == {0: 190, 1: 10} and imbalance.data["ratio"] == 19
    assert "CrossEntropyLoss(weight=" in imbalance.advice and "WeightedRandomSampler" in imbalance.advice
    unseen = report.by_kind("unseen_class")[0]
    assert unseen.data["classes"] == [2] and unseen.data["indices"] == list(range(8))


def test_nan_regression_targets_are_named_by_their_dataset_index_through_a_shuffled_loader():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(300, 4, generator=g), torch.randn(300, 1, generator=g)
    y[[5, 130, 257]] = float("nan")  # in three different batches of 64
    trainer = Trainer(torch.nn.Linear(4, 1), torch.nn.MSELoss(), "sgd", progress=False, run_store=False)
    report = trainer.check_data(DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True))
    (bad,) = report.by_kind("nonfinite")
    # the items' dataset indices, not their positions in their batches
    assert bad.data["field"] == "targets" and bad.data["indices"] == [5, 130, 257] and bad.data["items"] == 3
    assert "items 5, 130, 257" in bad.message and "target" in bad.advice


def test_labels_past_the_outputs_refuse_the_fit_before_its_first_step():
    x, y = make_classification(n=64, classes=3)
    y[37] = 7
    model = mlp()  # 3 outputs
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = _trainer(model, check_data=True)
    problem = trainer.check_data((x, y)).by_kind("label_range")[0]
    assert problem.data == {"split": "train", "labels": [7], "outputs": 3, "indices": [37]}
    with pytest.raises(ValueError, match=r"labels 7 are outside the model's 3 outputs \(0..2\).*item 37"):
        trainer.fit((x, y), batch_size=8, epochs=1)
    assert trainer.global_step == 0 and all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    # -100 (CrossEntropyLoss's ignore_index) is not a label
    y[37] = -100
    assert trainer.check_data((x, y)).by_kind("label_range") == []


def test_a_new_users_silent_cases_get_one_line_each():
    """Measured on main before: a plain Trainer said nothing of a validation set of copies, inputs x1000 or a 95/5
    split. With check_data=True each is one line of the progress output, and in the History's events."""
    x, _ = make_classification(n=200)
    y = (torch.arange(200) >= 190).long()
    out = io.StringIO()
    trainer = Trainer(mlp(out=2), torch.nn.CrossEntropyLoss(), "sgd", lr=0.01, run_store=False, check_data=True,
                      progress=ProgressBar(mode="lines", file=out))  # fmt: skip
    history = trainer.fit((x * 1000, y), val_data=(x[:100] * 1000, y[:100]), batch_size=32, epochs=1)
    lines = [line for line in out.getvalue().splitlines() if line.startswith("data ")]
    assert len(lines) == 3, lines  # the leak, the inputs' scale (said once, for training), the imbalance
    assert any("validation items (100%) are exact copies" in line for line in lines)
    assert sum("far from normalized" in line for line in lines) == 1 and any("19.0 to 1" in ln for ln in lines)
    kinds = [e["old"] for e in history.events if e["kind"] == "data_check"]
    assert sorted(kinds) == ["duplicates_across", "imbalance", "scale"]
    assert history.status == "finished"


def test_a_leak_of_all_but_one_item_does_not_read_100_percent():
    """199 copies among 200 validation items read "(100%)" (99.5% rounded): a user looks for the one item that is
    not a copy and is told there is none."""
    x, y = make_classification(n=300)
    val_x = x[:200].clone()
    val_x[7] += 1.0  # no longer a copy
    problem = _trainer().check_data((x, y), (val_x, y[:200])).by_kind("duplicates_across")[0]
    assert "199 of 200 validation items (99.5%)" in problem.message, problem.message
    assert "100%" in _trainer().check_data((x, y), (x[:200], y[:200])).by_kind("duplicates_across")[0].message


def test_a_sampled_check_at_fit_says_its_sample_in_the_progress_even_when_it_finds_nothing():
    """Trainer(check_data=N) reads a seeded sample of N items: its progress lines said so for the duplicates only,
    and nothing at all when the sample found nothing, so a clean sample read like clean data."""
    x, y = make_classification(n=400)
    out = io.StringIO()
    trainer = Trainer(mlp(), torch.nn.CrossEntropyLoss(), "sgd", lr=0.01, run_store=False, check_data=100,
                      progress=ProgressBar(mode="lines", file=out))  # fmt: skip
    history = trainer.fit((x, y), batch_size=50, epochs=1)
    lines = [line for line in out.getvalue().splitlines() if line.startswith("data ")]
    assert lines == ["data check: train 100 sampled of 400 items · no problem (check_data=True reads them all)"]
    assert [e["old"] for e in history.events if e["kind"] == "data_check"] == ["sample"]
    out.truncate(0)
    Trainer(mlp(), torch.nn.CrossEntropyLoss(), "sgd", lr=0.01, run_store=False, check_data=True,
            progress=ProgressBar(mode="lines", file=out)).fit((x, y), batch_size=50, epochs=1)  # fmt: skip
    assert not [line for line in out.getvalue().splitlines() if line.startswith("data ")]  # clean, all read: quiet


def test_the_pass_leaves_the_rng_and_model_as_they_were_and_the_report_is_reused():
    x, y = make_classification(n=100)
    loader = DataLoader(TensorDataset(x, y), batch_size=10, shuffle=True)

    class Augment(torch.utils.data.Dataset):  # draws from the global generators, as random augmentation does
        def __len__(self) -> int:
            return 100

        def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
            return x[i] + 0.01 * torch.randn(10) + random.random() + np.random.rand(), y[i]

    trainer = _trainer()
    model = trainer.model
    model.train()
    numpy_state: Any = np.random.get_state()
    states = (torch.get_rng_state(), random.getstate(), numpy_state[1].copy())
    trainer.check_data(loader, DataLoader(Augment(), batch_size=16))
    assert torch.equal(states[0], torch.get_rng_state()) and states[1] == random.getstate()
    numpy_after: Any = np.random.get_state()
    assert np.array_equal(states[2], numpy_after[1]) and model.training
    # a fit with check_data=True on the same loaders reuses that report (the panel checks before Start)
    report = trainer.data_report
    assert report is not None
    trainer2 = _trainer(check_data=True)
    trainer2.data_report = report
    report.sources = (loader, None)
    trainer2.fit(loader, epochs=1)
    assert trainer2.data_report is report


def test_max_items_takes_a_seeded_sample_and_says_so():
    x, y = make_classification(n=500)
    report = _trainer().check_data((x, y), max_items=120)
    assert report.splits["train"]["items"] == 120 and report.splits["train"]["sampled"]
    assert any("seeded sample of 120 of 500" in n for n in report.notes)
    again = _trainer().check_data((x, y), max_items=120)
    assert again.splits["train"]["fields"] == report.splits["train"]["fields"]
    with pytest.raises(ValueError, match="max_items must be an int >= 1"):
        _trainer().check_data((x, y), max_items=0)


def test_a_cancelled_check_reads_no_further_batch_and_keeps_the_last_report():
    """``cancel=``: the panel's check ends at the next batch when the panel closes or the interpreter exits. Here the
    dataset sets the event as it hands out item 100, in the middle of a batch of 32 (the panel's thread is another
    thread; where it is set from does not change where the pass looks)."""
    x, y = make_classification(n=1000)
    cancel, read = threading.Event(), []

    class Watched(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(x)

        def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
            read.append(i)
            if len(read) == 100:
                cancel.set()
            return x[i], y[i]

    trainer = _trainer()
    before = trainer.check_data((x[:50], y[:50]))
    with pytest.raises(concurrent.futures.CancelledError, match="cancelled while reading train"):
        trainer.check_data(DataLoader(Watched(), batch_size=32), cancel=cancel)
    assert len(read) == 128  # the batch under way (items 96-127) is read whole, then nothing more
    assert trainer.data_report is before  # a cancelled pass replaces no report
    cancel.clear()
    assert trainer.check_data((x, y), cancel=cancel).splits["train"]["items"] == 1000  # not set: the whole pass
    with pytest.raises(TypeError, match=r"check_data\(cancel=...\) takes a threading.Event, got bool"):
        trainer.check_data((x, y), cancel=True)  # type: ignore[arg-type]


def test_bad_input_gets_a_clear_error_or_a_plain_statement():
    x, y = make_classification(n=40)

    class Stream(torch.utils.data.IterableDataset):  # no len()
        def __iter__(self):
            for i in range(40):
                yield x[i], y[i]

    report = _trainer().check_data(DataLoader(Stream(), batch_size=8))
    assert report.splits["train"]["items"] == 40 and report.splits["train"]["of"] is None

    class Dicts(torch.utils.data.Dataset):  # items as dicts: the batch protocol's target keys
        def __len__(self) -> int:
            return 40

        def __getitem__(self, i: int) -> dict[str, Any]:
            return {"x": x[i], "labels": y[i], "text": f"item {i % 20}"}

    class DictModel(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = mlp()

        def forward(self, x: torch.Tensor, text: Any = None) -> torch.Tensor:
            return self.net(x)

    report = _trainer(DictModel()).check_data(DataLoader(Dicts(), batch_size=8))
    assert "x" in report.splits["train"]["fields"] and report.outputs == 3
    assert any("text: list, not a tensor" in n for n in report.notes)
    with pytest.raises(TypeError, match="one-shot iterator"):
        _trainer().check_data(iter([(x, y)]))
    with pytest.raises(TypeError, match="check_data must be True, False or an int"):
        _trainer(check_data="yes")

    class Broken(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 4

        def __getitem__(self, i: int) -> Any:
            return object(), 1

    with pytest.raises(TypeError, match="check_data could not read train"):
        _trainer().check_data(DataLoader(Broken(), batch_size=2))
    regression = Trainer(mlp(out=1), torch.nn.MSELoss(), "sgd", lr=0.1, progress=False, run_store=False)
    report = regression.check_data((x, y[:, None].float()))
    assert report.splits["train"]["targets"] == "values" and report.by_kind("imbalance") == []


def test_display():
    x, y = make_classification(n=40)
    report = _trainer().check_data((x, y), (x[:5], y[:5]))
    assert repr(report) == "DataReport(train 40 items · val 5 items · 1 finding)"
    assert str(report).splitlines()[1].startswith("  data problem: 5 of 5 validation items")
    page = report._repr_html_()
    assert "nbt-data-report" in page and "data-kind='duplicates_across'" in page and "nbt-data-problem" in page
    problem = report.problems[0]
    assert str(problem).startswith("data problem: ") and problem.to_dict()["kind"] == "duplicates_across"


def test_validation_prepared_differently_from_training_is_said():
    g = torch.Generator().manual_seed(0)
    raw = torch.rand(300, 1, 8, 8, generator=g) * 255
    x = (raw[:200] - raw[:200].mean()) / raw[:200].std()
    y, val_y = torch.randint(0, 3, (200,), generator=g), torch.randint(0, 3, (100,), generator=g)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 3))
    shifted = _trainer(model).check_data((x, y), (raw[200:] / 255, val_y))  # a pipeline bug: [0, 1] for val
    (problem,) = shifted.by_kind("shift")
    assert "validation inputs are on another scale than training's (mean 0.5" in problem.message
    same = (raw[200:] - raw[:200].mean()) / raw[:200].std()
    assert _trainer(model).check_data((x, y), (same, val_y)).by_kind("shift") == []
    # a subset of digits, whose border pixels are nearly always 0: no feature judged on a few rare values
    from sklearn.datasets import load_digits

    dx, dy = (torch.tensor(a) for a in load_digits(return_X_y=True))
    digits = _trainer(mlp(d=64, out=10)).check_data((dx.float(), dy), (dx[:200].float(), dy[:200]))
    assert digits.by_kind("shift") == []


def test_outputs_no_training_item_has_as_its_label_are_said():
    x, y = make_classification(n=60)
    y = y % 2  # classes 0 and 1 of the model's 3
    (problem,) = _trainer(mlp(out=3)).check_data((x, y)).by_kind("missing_class")
    assert problem.data == {"classes": [2], "outputs": 3} and "never predict it" in problem.message
    assert _trainer(mlp(out=2)).check_data((x, y)).by_kind("missing_class") == []


class _TokenClassifier(torch.nn.Module):
    """Token ids and an attention mask in, two classes out: a mean of the real positions' embeddings."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.head = torch.nn.Embedding(16, 8), torch.nn.Linear(8, 2)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        m = attention_mask.unsqueeze(-1).float()
        return self.head((self.embed(input_ids) * m).sum(1) / m.sum(1).clamp(min=1))


def _pad_per_batch(items: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """What transformers' DataCollatorWithPadding does: each batch padded to its own longest item."""
    longest = max(len(i["input_ids"]) for i in items)
    pads = [longest - len(i["input_ids"]) for i in items]
    return {
        "input_ids": torch.tensor([i["input_ids"] + [0] * p for i, p in zip(items, pads, strict=True)]),
        "attention_mask": torch.tensor([[1] * len(i["input_ids"]) + [0] * p for i, p in zip(items, pads, strict=True)]),
        "labels": torch.tensor([i["labels"] for i in items]),
    }


def test_copies_in_batches_padded_to_different_lengths_are_found():
    """Before: an item's hash covered its batch's padding, so a validation copy of a training item, or two training
    copies, in batches padded to different lengths went unreported (the fixed-length case was found)."""
    seqs = [[5, 6, 7], [8, 9, 10, 11, 12, 13], [3, 4], [9, 9, 9, 9], [5, 6, 7], [1, 1]]
    train = [{"input_ids": s, "labels": i % 2} for i, s in enumerate(seqs)]
    train[4]["labels"] = train[0]["labels"]  # item 4 copies item 0, in a batch padded to 3, not to 6
    val = [dict(train[0]), {"input_ids": [1, 2, 3, 4, 5, 6, 7, 8], "labels": 1}]  # val 0 copies train 0: padded to 8
    trainer = Trainer(_TokenClassifier(), torch.nn.CrossEntropyLoss(), "adamw", progress=False, run_store=False)
    loaders: list[DataLoader[Any]] = [
        DataLoader(items, batch_size=2, collate_fn=_pad_per_batch)  # type: ignore[arg-type]  # a list: torch allows
        for items in (train, val)
    ]
    report = trainer.check_data(*loaders)
    assert report.by_kind("duplicates_within")[0].data["indices"] == [4]
    across = report.by_kind("duplicates_across")[0]
    assert across.data["val_indices"] == [0] and across.data["train_indices"] == [0]


def test_float_targets_that_turn_soft_after_hard_batches_keep_every_items_statistics():
    """Hard 0/1 targets first (a binary classifier's, it seems), then soft ones (label smoothing on the later items):
    the targets are values, and their moments count every item, the hard ones read before too."""
    g = torch.Generator().manual_seed(0)
    hard = torch.randint(0, 2, (128, 1), generator=g).float()
    soft = torch.rand(64, 1, generator=g)
    stats = TargetStats()
    for batch in (hard[:64], hard[64:], soft):
        stats.add(batch)
    assert stats.kind == "values" and stats.counts == {}  # not class counts: 0.37 is no class
    everything = torch.cat([hard, soft]).double()
    mean, std = stats.values.moments()
    assert int(stats.values.count.sum()) == 192
    torch.testing.assert_close(mean, everything.mean(0))
    torch.testing.assert_close(std, everything.std(0, correction=0))


def test_a_nan_target_is_still_named_after_soft_multilabel_targets_and_a_hard_batch():
    """Soft multi-label targets with a NaN in the first batch, then a batch that happens to be all 0/1, then soft
    ones again: the NaN stays found (the statistics of the first batch are not dropped when the kind flips)."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(192, 4, generator=g), torch.rand(192, 3, generator=g)
    y[64:128] = y[64:128].round()  # the second batch: 0/1 only
    y[5, 1] = float("nan")
    trainer = Trainer(torch.nn.Linear(4, 3), torch.nn.BCEWithLogitsLoss(), "sgd", progress=False, run_store=False)
    report = trainer.check_data(DataLoader(TensorDataset(x, y), batch_size=64))
    assert report.splits["train"]["targets"] == "values"
    (bad,) = report.by_kind("nonfinite")
    assert bad.data["field"] == "targets" and bad.data["indices"] == [5] and bad.data["items"] == 1


def test_one_hot_and_soft_targets_of_a_cross_entropy_are_classes_and_multi_label_stays_multi_label():
    """CrossEntropyLoss with float rows (one-hot, or label-smoothed soft rows) trains on class probabilities: the
    check counts each item's largest class (an imbalance, copies with different labels are found as for int labels)
    and says so; under BCEWithLogitsLoss the same rows, and rows with
    several 1s, stay multi-label; a NaN in a row is still named."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(240, 4, generator=g)
    y = torch.randint(0, 3, (240,), generator=g)
    y[:200] = 0  # 200 of class 0 against about 20 each
    x[201], y[200], y[201] = x[200], 1, 2  # copies with different labels
    hot = torch.nn.functional.one_hot(y, 3).float()
    for rows in (hot, hot * 0.9 + 0.1 / 3):
        trainer = Trainer(torch.nn.Linear(4, 3), torch.nn.CrossEntropyLoss(), "sgd", progress=False, run_store=False)
        val = torch.nn.functional.one_hot(torch.tensor([2, 2]), 3).float()
        report = trainer.check_data((x[:230], rows[:230]), (x[230:232], val))
        train = report.splits["train"]
        counts = torch.bincount(y[:230], minlength=3).tolist()
        assert train["targets"] == "labels" and train["classes"] == dict(enumerate(counts)), train
        assert report.by_kind("imbalance")[0].data["counts"] == dict(enumerate(counts))
        assert report.by_kind("conflicting_labels")[0].data["indices"] == [200, 201]
        assert report.outputs == 3 and any("class probabilities" in n for n in report.notes)
    # the same rows under BCEWithLogitsLoss, and rows with several 1s: multi-label
    several = (torch.rand(240, 3, generator=g) > 0.5).float()
    for rows in (hot, several):
        trainer = Trainer(torch.nn.Linear(4, 3), torch.nn.BCEWithLogitsLoss(), "sgd", progress=False, run_store=False)
        report = trainer.check_data((x, rows))
        assert report.splits["train"]["targets"] == "multilabel" and not report.by_kind("imbalance")
    bad = hot.clone()
    bad[7, 1] = float("nan")
    trainer = Trainer(torch.nn.Linear(4, 3), torch.nn.CrossEntropyLoss(), "sgd", progress=False, run_store=False)
    (nonfinite,) = trainer.check_data((x, bad)).by_kind("nonfinite")
    assert nonfinite.data["field"] == "targets" and nonfinite.data["indices"] == [7]
