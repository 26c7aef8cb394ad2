"""What the watching consumers cost per optimizer step, counted (issue 54): Python calls into their code, whatever the
length of the run. Timings are the benchmarks' business (bench/health_overhead.py, bench/widget_overhead.py); these
tests hold the cause: no consumer is called per step, except at the steps it asked for (scheduled deliveries,
``nbtrainer._events._stream``)."""

from __future__ import annotations

import math
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import make_classification, make_loader, mlp

import nbtrainer
from nbtrainer import Health, Samples, Trainer

ROOT = Path(nbtrainer.__file__).resolve().parent
WATCHERS = {  # a consumer's code: the files its calls land in
    "health": (str(ROOT / "_health"),),
    "samples": (str(ROOT / "_look" / "_samples.py"),),
    "feed": (str(ROOT / "widgets" / "_runner.py"), str(ROOT.parent / "widgets" / "_runner.py")),
    "kept": (str(ROOT / "_loop" / "_kept.py"),),
}


@pytest.fixture(autouse=True)
def _available_memory_read_once() -> Any:
    """Health reads the system's available memory at a fit's start at most every 30 wall seconds (one call into its
    files when it does). These tests count calls per step, not per 30 seconds: on a loaded machine a long fit began
    past the window and made one call more than its short twin (293 against 294, a loaded trial). The value read now
    is kept for the module's tests."""
    from nbtrainer._health import _snapshot

    saved = _snapshot._AVAILABLE
    _snapshot._AVAILABLE = (math.inf, _snapshot.available_bytes())  # never older than 30 s while these tests run
    try:
        yield
    finally:
        _snapshot._AVAILABLE = saved


def _calls(callbacks: list, n_batches: int, **trainer_kw) -> Counter:
    """Python calls into each watcher's files during one fit of ``n_batches`` steps."""
    counts: Counter = Counter()

    def profile(frame, event, arg):
        if event == "call":
            filename = frame.f_code.co_filename
            for name, prefixes in WATCHERS.items():
                if filename.startswith(prefixes):
                    counts[name] += 1

    x, y = make_classification(n=16 * n_batches)
    trainer = Trainer(
        mlp(),
        torch.nn.CrossEntropyLoss(),
        "sgd",
        lr=0.05,
        callbacks=callbacks,
        progress=False,
        refresh_interval=3600.0,  # refreshes: after the first batch and at the epoch's end, in both fits
        **trainer_kw,
    )
    loader = make_loader(x, y, batch_size=16)
    sys.setprofile(profile)
    try:
        trainer.fit(loader, epochs=1)
    finally:
        sys.setprofile(None)
    return counts


def test_health_makes_no_call_per_step_between_its_samples():
    """Samples at the first step only (every_n_steps beyond the run): 100 and 400 steps cost Health the same calls.
    The loop's step-time samples past the 21st micro-batch are moved beyond the run too: Health reads each one (a
    few calls every ``timing_every`` steps, counted in the next test)."""
    quiet = {"timing_every": 10**6}
    _calls([Health(every_n_steps=10**6)], 10, **quiet)  # once-a-process work
    short = _calls([Health(every_n_steps=10**6)], 100, **quiet)
    long = _calls([Health(every_n_steps=10**6)], 400, **quiet)
    assert short["health"] > 0 and long["health"] == short["health"], (short, long)
    assert long["kept"] == short["kept"] <= 1  # built once: the loop keeps its batches with inline appends


def test_health_at_its_sampled_steps_only():
    """Every 50 steps: the extra calls of 300 more steps are those of its 6 more samples (the scheduled deliveries
    at each sample and the step before it), not one per step."""
    _calls([Health(every_n_steps=50)], 10)
    few = _calls([Health(every_n_steps=50)], 100)  # samples at steps 1, 50, 100
    many = _calls([Health(every_n_steps=50)], 400)  # 1, 50, ..., 400: 6 more
    per_sample = (many["health"] - few["health"]) / 6
    assert 0 < per_sample < 120, (few, many)  # measure, read and judge one sample: about 80 calls
    assert (many["health"] - few["health"]) / 300 < 2.5  # per step, the samples amortized


@pytest.mark.parametrize("every_n_steps", [None, 25])
def test_samples_is_called_at_its_steps_only(every_n_steps):
    short = _calls([Samples(lambda m: "x", every_n_steps=every_n_steps, every_n_epochs=1)], 100)
    long = _calls([Samples(lambda m: "x", every_n_steps=every_n_steps, every_n_epochs=1)], 400)
    taken = 0 if every_n_steps is None else (400 - 100) // every_n_steps
    per_take = (long["samples"] - short["samples"]) / max(taken, 1)
    assert (long["samples"] == short["samples"]) if taken == 0 else per_take < 20, (short, long)


def test_the_panels_feed_is_called_per_refresh_not_per_step():
    pytest.importorskip("ipywidgets")
    from nbtrainer.widgets._runner import Feed

    counts = []
    for n in (100, 400):
        feed = Feed()
        counts.append(_calls([feed], n)["feed"])
    assert counts[0] == counts[1] > 0


def test_the_data_map_makes_one_call_a_step():
    """``DataMap`` keeps a step's outputs, targets and indices with one call (its hook), and picks out the logits and
    labels at the reduction, for a window's rows at once: the calls of 300 more steps are those 300 hooks (the
    reductions are at the first refresh and the epoch's end in both fits). Its hook did four calls a step (itself, the
    labels of a tuple, the logits of structured outputs, a reduction check), each with the caches a step left cold."""
    from nbtrainer import DataMap

    know = (str(ROOT / "_know"), str(ROOT / "_loop" / "_metrics.py"))
    WATCHERS["map"] = know
    try:
        _calls([DataMap()], 10)
        short, long = _calls([DataMap()], 100), _calls([DataMap()], 400)
    finally:
        del WATCHERS["map"]
    assert short["map"] > 0 and (long["map"] - short["map"]) / 300 <= 1.0, (short, long)
