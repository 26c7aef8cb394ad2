"""docs/look.md: every python block runs as written (a fresh namespace each, from the repository's folder), and
gives what the text says it gives."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from conftest import needs

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "look.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)


def _run(index: int, monkeypatch: Any) -> dict[str, Any]:
    import torch

    monkeypatch.chdir(REPO)
    monkeypatch.setattr("sys.path", list(__import__("sys").path))  # the DCGAN block adds examples/ to it
    torch.manual_seed(0)
    namespace: dict[str, Any] = {"__name__": f"look_{index}"}
    exec(compile(BLOCKS[index], f"{DOC.name}[{index}]", "exec"), namespace)
    return namespace


def test_the_page_has_its_snippets() -> None:
    assert len(BLOCKS) == 4  # GPT-2 prompts, DCGAN grid, classifier on 8 images, interpret


@needs("transformers")
@pytest.mark.slow
def test_a_gpt2_style_model_generates_from_fixed_prompts(monkeypatch: Any) -> None:
    ns = _run(0, monkeypatch)
    samples = ns["history"].samples
    assert [s["step"] for s in samples if s["name"] == "the cat"] == [0, 8, 16, 24]
    assert all(s["kind"] == "text" and s["value"].startswith(s["name"]) for s in samples)
    assert samples[-1]["value"] != samples[1]["value"]  # what it generates changed as it trained


@pytest.mark.slow
def test_the_dcgan_panel_draws_a_grid_per_epoch(monkeypatch: Any) -> None:
    ns = _run(1, monkeypatch)
    assert [s["kind"] for s in ns["history"].samples] == ["image", "image"]  # the baseline and epoch 1


@pytest.mark.slow
def test_a_classifier_shows_its_predictions_on_8_fixed_images(monkeypatch: Any) -> None:
    ns = _run(2, monkeypatch)
    samples, interp = ns["history"].samples, ns["interp"]
    assert {s["name"] for s in samples} == {"images", "predicted", "true"} and len(samples) == 3 * 4
    assert all(len(s["value"].split()) == 8 for s in samples if s["name"] == "predicted")
    assert int(interp.confusion_matrix().sum()) == 397 and len(interp.show(k=9).indices) == 9
    assert ns["history"].epochs[-1]["val_loss"] < ns["history"].epochs[0]["val_loss"]


def test_interpret_on_arrays_with_names(monkeypatch: Any) -> None:
    ns = _run(3, monkeypatch)
    assert [r["class"] for r in ns["interp"].per_class()] == ["low", "mid", "high"]
    assert "sensor 5" in ns["interp"].show(k=3).html
