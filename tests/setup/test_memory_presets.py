"""compare_strategies rows for the memory switches (qlora, adamw8bit, offload, flash, in_backward, all): they run,
and the measured peak shows each saving where it acts (issue 22)."""

from __future__ import annotations

import pytest
from conftest import needs
from setup_models import lm_batches, tiny_llama

from nbtrainer import compare_strategies

pytestmark = needs("bitsandbytes", "peft")


@pytest.mark.slow  # six strategies, each measured over a step: about a minute on a shared 2-core machine
def test_memory_rows_run_and_show_their_savings() -> None:
    data = lm_batches(n=4)
    table = compare_strategies(
        tiny_llama,
        None,
        None,
        data,
        strategies=["fp32", "qlora", "adamw8bit", "offload", "flash", "in_backward", "all"],
        steps=3,
        warmup=1,
        metric=None,
        device="cpu",
    )
    rows = {r["name"]: r for r in table.rows}
    assert all(r["status"] == "ok" for r in rows.values()), [(r["name"], r["reason"]) for r in rows.values()]
    split = {name: r["memory_detail"] for name, r in rows.items()}
    # QLoRA: only the adapters train, so the optimizer state is a small fraction of full fine-tuning's
    assert split["qlora"]["optimizer_state"] < 0.2 * split["fp32"]["optimizer_state"]
    assert split["qlora"]["parameters"] < split["fp32"]["parameters"]
    # 8-bit AdamW: the state of the large matrices in one byte per moment instead of four
    assert split["adamw8bit"]["optimizer_state"] < 0.5 * split["fp32"]["optimizer_state"]
    assert rows["all"]["peak_memory_bytes"] < rows["fp32"]["peak_memory_bytes"]
    # this model's peak is its activations, before any gradient exists: the step in backward keeps it, no more
    assert rows["in_backward"]["peak_memory_bytes"] <= rows["fp32"]["peak_memory_bytes"]
    assert rows["qlora"]["setup"]["quantize"] == "nf4" and rows["flash"]["setup"]["attention"] == "flash"
