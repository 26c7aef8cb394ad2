"""Every result a cell returns displays (issue 58): each public result type, in each of its forms, gives a ``repr``, a
``str`` and an HTML view; a widget gives the text/plain and text/html of its fallback. The text forms carry their
units, show no ``nan`` where a value is unknown, and the HTML has no Markdown left in it.

A new public result type joins ``FORMS`` (one entry: a name and a function that builds it from the shared small
models below) in the change that adds it.
"""

from __future__ import annotations

import functools
import html as html_lib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import make_classification, make_loader, mlp
from torch import nn

# -- shared small things (built once per worker, on first use) ----------------------------------------------------


@functools.cache
def _data() -> tuple[Any, Any]:
    x, y = make_classification(n=96, d=10, classes=3)
    return make_loader(x, y, batch_size=32), make_loader(x[:32], y[:32], batch_size=32)


def _trainer(**options: Any) -> Any:
    from nbtrainer import Trainer

    options = {"progress": False, "run_store": False, "seed": 0, "lr": 1e-2, **options}
    return Trainer(mlp(), nn.CrossEntropyLoss(), "adamw", **options)


@functools.cache
def _fitted() -> Any:
    trainer = _trainer()
    train, val = _data()
    trainer.fit(train, val, epochs=2)
    return trainer


@functools.cache
def _measured_profile() -> Any:
    from nbtrainer import profile_model

    return profile_model(mlp(), torch.randn(8, 10), precisions=("fp32", "bf16-mixed"), n_iters=10)


@functools.cache
def _meta_model() -> nn.Module:
    with torch.device("meta"):
        return nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 3))


def _meta_batch() -> Any:
    return torch.zeros(8, 10, device="meta"), torch.zeros(8, dtype=torch.long, device="meta")


def _planned_profile(devices: tuple[str, ...] = ("cpu",)) -> Any:
    from nbtrainer import profile_model

    return profile_model(
        _meta_model(), _meta_batch()[0], targets=_meta_batch()[1], criterion=nn.CrossEntropyLoss(), devices=devices
    )


def _history_interrupted() -> Any:
    from nbtrainer import Trainer

    class CtrlC:  # what Ctrl-C does in a notebook: the History comes back marked interrupted
        def on_train_batch_end(self, trainer: Any, **_: Any) -> None:
            if trainer.global_step == 2:
                raise KeyboardInterrupt

    trainer = Trainer(mlp(), nn.CrossEntropyLoss(), "adamw", progress=False, run_store=False, callbacks=[CtrlC()])
    try:
        return trainer.fit(_data()[0], epochs=2)
    except KeyboardInterrupt:
        return trainer.history


def _history_resumed(tmp: Path) -> Any:
    from nbtrainer import ModelCheckpoint

    first = _trainer(callbacks=[ModelCheckpoint(tmp / "ckpt", save_last=True)])
    first.fit(_data()[0], epochs=1)
    again = _trainer()
    return again.fit(_data()[0], _data()[1], epochs=2, resume_from=str(tmp / "ckpt" / "last.ckpt"))


def _history_two_optimizers() -> Any:
    from nbtrainer import Trainer

    model = mlp()
    opts = {"body": torch.optim.SGD(model[0].parameters(), lr=0.1), "head": torch.optim.AdamW(model[2].parameters())}
    return Trainer(model, nn.CrossEntropyLoss(), opts, progress=False, run_store=False).fit(_data()[0], epochs=2)


def _interpret_multilabel() -> Any:
    x = torch.randn(64, 10)
    y = (x[:, :4] > 0).float()
    from nbtrainer import Trainer

    trainer = Trainer(mlp(out=4), nn.BCEWithLogitsLoss(), "adamw", progress=False, run_store=False)
    return trainer.interpret(make_loader(x, y, batch_size=32))


def _interpret_regression() -> Any:
    x = torch.randn(64, 10)
    from nbtrainer import Trainer

    trainer = Trainer(mlp(out=1), nn.MSELoss(), "adamw", progress=False, run_store=False)
    return trainer.interpret(make_loader(x, x[:, :1] * 2, batch_size=32))


def _interpret_causal_lm() -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    from nbtrainer import Trainer

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1,
    )  # fmt: skip
    ids = torch.randint(0, 32, (8, 12))
    trainer = Trainer(LlamaForCausalLM(config), None, "adamw", progress=False, run_store=False)
    return trainer.interpret([{"input_ids": ids, "labels": ids}])


def _samples() -> Any:
    from nbtrainer import Samples

    def look(model: nn.Module) -> Any:
        return {"text": "a digit", "image": torch.rand(8, 8)}

    trainer = _trainer(callbacks=[Samples(look)])
    return trainer.fit(_data()[0], epochs=1).samples


def _strategies() -> Any:
    from nbtrainer import compare_strategies

    train, val = _data()
    return compare_strategies(
        mlp, torch.optim.AdamW, nn.CrossEntropyLoss(), train, val, strategies=["fp32", "accum2"], steps=2, metric=None
    )


def _runs(tmp: Path) -> Any:
    from nbtrainer import Runs

    for lr in (1e-2, 1e-3):
        _trainer(lr=lr, run_store=str(tmp / "runs.db")).fit(_data()[0], _data()[1], epochs=1)
    return Runs(str(tmp / "runs.db"))


def _panel() -> Any:
    from nbtrainer import TrainerWidget

    return TrainerWidget(mlp(), nn.CrossEntropyLoss(), "adamw", *_data(), epochs=1, run_store=False)


#: name -> a function of a temporary folder that builds one form of a public result type
FORMS: dict[str, Callable[[Path], Any]] = {
    "ModelProfile measured": lambda tmp: _measured_profile(),
    "ModelProfile planned from a meta model": lambda tmp: _planned_profile(),
    "ModelProfile planned, devices=('meta',)": lambda tmp: _planned_profile(("meta",)),
    # on a machine without CUDA its rows are the unsupported ones, each with its reason
    "ModelProfile several devices and precisions, unsupported rows": lambda tmp: __import__("nbtrainer").profile_model(
        mlp(), torch.randn(8, 10), devices=("cpu", "cuda"), precisions=("fp32", "bf16-mixed"), n_iters=10
    ),
    "FitResult fits": lambda tmp: _measured_profile().fits(budget_gb=1, batch_size=64),
    "FitResult does not fit": lambda tmp: _measured_profile().fits(budget_gb=1e-6, batch_size=64),
    "FitResult planned": lambda tmp: _planned_profile().fits(budget_gb=1, batch_size=8),
    "MemoryPlan with a budget": lambda tmp: __import__("nbtrainer").plan_memory(
        mlp(), (torch.randn(8, 10), torch.randint(0, 3, (8,))), budget_gb=1, device="cpu"
    ),
    "MemoryPlan nothing fits": lambda tmp: __import__("nbtrainer").plan_memory(
        mlp(), (torch.randn(8, 10), torch.randint(0, 3, (8,))), budget_gb=1e-7, device="cpu"
    ),
    "MemoryPlan per rank": lambda tmp: __import__("nbtrainer").plan_memory(
        _meta_model(), _meta_batch(), budget_gb=16, device="cuda", world_size=4, strategy="ddp"
    ),
    "PlanRow": lambda tmp: (
        __import__("nbtrainer")
        .plan_memory(mlp(), (torch.randn(8, 10), torch.randint(0, 3, (8,))), budget_gb=1, device="cpu")
        .best
    ),
    "History empty": lambda tmp: __import__("nbtrainer").History(),
    "History finished": lambda tmp: _fitted().history,
    "History interrupted": lambda tmp: _history_interrupted(),
    "History resumed": _history_resumed,
    "History several optimizers": lambda tmp: _history_two_optimizers(),
    "Interpretation classification": lambda tmp: _fitted().interpret(_data()[1]),
    "Interpretation multi-label": lambda tmp: _interpret_multilabel(),
    "Interpretation regression": lambda tmp: _interpret_regression(),
    "Interpretation causal LM": lambda tmp: _interpret_causal_lm(),
    "HealthReport": lambda tmp: __import__("nbtrainer").HealthReport(
        "loss_spike", 812, 2, "loss spiked to 9.1 at step 812", "lower the LR to 1e-4", {"lr": 1e-4, "batch": 17}
    ),
    "samples": lambda tmp: _samples(),
    "StrategyComparison": lambda tmp: _strategies(),
    "Runs": _runs,
    "RunTable": lambda tmp: _runs(tmp).table(),
    "LRFinderResult": lambda tmp: _trainer().lr_find(_data()[0], steps=20),
    "ParamCounts": lambda tmp: _fitted().param_counts,
    "DoctorReport": lambda tmp: __import__("nbtrainer._shell._doctor", fromlist=["x"]).doctor_report(["cpu"]),
    "TrainerWidget": lambda tmp: _panel(),
    "ProfileCard": lambda tmp: __import__("nbtrainer").widgets.ProfileCard(_measured_profile()),
    "CompareWidget": lambda tmp: __import__("nbtrainer").widgets.CompareWidget(_strategies()),
    "RunsWidget": lambda tmp: __import__("nbtrainer").widgets.RunsWidget(_runs(tmp)),
}

_MARKDOWN = [
    (re.compile(r"\*\*[^*\s][^*]*\*\*"), "**bold**"),
    (re.compile(r"`[^`\s][^`]*`"), "`code`"),
    (re.compile(r"\[[^\]]+\]\((?:https?:|[\w./-]+)[^)]*\)"), "[link](target)"),
    (re.compile(r"(?m)^#{1,6} "), "# heading"),
]
_NAN = re.compile(r"\bnan\b", flags=re.I)


def views(obj: Any) -> dict[str, str]:
    """What a notebook and a terminal show: repr, str, and the HTML (a widget's fallback bundle)."""
    out = {"repr": repr(obj), "str": str(obj)}
    bundle = getattr(obj, "_repr_mimebundle_", None)
    if bundle is not None:
        data = bundle()
        data = data[0] if isinstance(data, tuple) else data
        out["text/plain"], out["html"] = data["text/plain"], data["text/html"]
    else:
        out["html"] = obj._repr_html_()
    return out


def _text_of(html: str) -> str:
    no_code = re.sub(r"<(script|style|svg)\b.*?</\1>", " ", html, flags=re.S | re.I)
    return html_lib.unescape(re.sub(r"<[^>]+>", " ", no_code))


@pytest.mark.slow
@pytest.mark.parametrize("form", list(FORMS))
def test_every_result_displays(form: str, tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    obj = FORMS[form](tmp_path)
    shown = views(obj)
    for kind, text in shown.items():
        assert isinstance(text, str) and text.strip(), f"{form}: empty {kind}"
        assert "object at 0x" not in text, f"{form}: the default {kind} ({text[:80]})"
        plain = _text_of(text) if kind == "html" else text
        assert not _NAN.search(plain), f"{form}: 'nan' in its {kind} where a value is unknown:\n{plain[:2000]}"
    visible = _text_of(shown["html"])
    for pattern, what in _MARKDOWN:
        found = pattern.search(visible)
        assert not found, f"{form}: Markdown ({what}) left in its HTML: {found.group(0)!r}"
    for kind in [k for k in shown if k != "html"]:
        bare = unitless_figures(shown[kind])
        assert not bare, f"{form}: figures without a unit in its {kind}: {bare[:8]}\n{shown[kind][:2000]}"
    bare = unitless_cells(shown["html"])
    assert not bare, f"{form}: table cells without a unit in its HTML: {bare[:8]}"
    # the prose around the tables too
    prose = _text_of(re.sub(r"<table\b.*?</table>", " ", shown["html"], flags=re.S | re.I))
    bare = unitless_figures(prose)
    assert not bare, f"{form}: figures without a unit in its HTML: {bare[:8]}\n{prose[:2000]}"


_UNIT = (
    r"(?:B|KiB|MiB|GiB|TiB|KB|MB|GB|bytes|s|ms|µs|us|ns|min|h|%|x|×|samples/s|steps/s|it/s|MACs|FLOPs|GFLOPs|"
    r"params|parameters|trainable|epochs?|steps?|batch(?:es)?|items?|samples?|runs?|rows?|layers?|blocks?|GPUs?|"
    r"ranks?|classes|labels?|tokens?|characters|points|values)"
)
# a figure stated as a size, a time or a rate: the phrase from one of those words to the next ", ", ";" or line end
_SIZE_WORDS = re.compile(
    r"\b(memory|size|peak|reserved|budget|needed|time|latency|throughput|elapsed)\b(?:[^,;|\n]|,(?=\d))*", re.I
)
_FIGURE = re.compile(r"(?<![\w.])(\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?)(?![\d.])(?!\s*" + _UNIT + r"(?!\w))")


def unitless_figures(text: str) -> list[str]:
    """Figures stated as a size, a time or a rate (after one of those words, in the same phrase) that carry no unit:
    ``peak 5242880`` or ``step time 0.0123``. Counts, ratios and table cells under a header naming the unit pass."""
    bare = []
    for phrase in _SIZE_WORDS.finditer(text):
        for fig in _FIGURE.finditer(phrase.group(0)):
            value = fig.group(1)
            if "." in value or "," in value or int(value) >= 1024:
                bare.append(f"{phrase.group(1)} ... {value}")
    return bare


_SIZE_HEADER = re.compile(r"\b(memory|size|peak|reserved|budget|needed|time|latency|duration|elapsed)\b", re.I)
_UNIT_IN_HEADER = re.compile(r"(/s\b|\((?:ms|s|µs|B|KiB|MiB|GiB|bytes|%)\)|_s\b|_bytes\b)")


def unitless_cells(html: str) -> list[str]:
    """Cells of an HTML table under a header that names a size or a time (and no unit), holding a bare figure."""
    bare = []
    for table in re.findall(r"<table\b.*?</table>", html, flags=re.S | re.I):
        rows = re.findall(r"<tr\b.*?</tr>", table, flags=re.S | re.I)
        if not rows:
            continue
        heads = [_text_of(h).strip() for h in re.findall(r"<t[hd]\b.*?</t[hd]>", rows[0], flags=re.S | re.I)]
        sized = [i for i, h in enumerate(heads) if _SIZE_HEADER.search(h) and not _UNIT_IN_HEADER.search(h)]
        for row in rows[1:]:
            cells = [_text_of(c).strip() for c in re.findall(r"<td\b.*?</td>", row, flags=re.S | re.I)]
            for i in sized:
                if i < len(cells) and re.fullmatch(r"[\d,]+(\.\d+)?", cells[i]):
                    bare.append(f"{heads[i]}: {cells[i]}")
    return bare
