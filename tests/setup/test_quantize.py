"""Trainer(quantize=...): frozen bitsandbytes layers on any nn.Module, what stays full precision, the compute
dtype, memory, and every refusal before the model changes (issue 22)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from conftest import LazyModule, needs
from setup_models import lm_batches, mlp, mlp_data, tiny_llama
from torch import nn

from nbtrainer import Trainer
from nbtrainer._setup._quantize import quantized_weight_bytes

pytestmark = needs("bitsandbytes")
bnb = LazyModule("bitsandbytes")


@pytest.mark.parametrize(
    ("method", "layer", "ratio"),
    [
        ("nf4", "Linear4bit", 0.16),
        ("nf4-dq", "Linear4bit", 0.25),  # a 1 KiB second-level code book per layer weighs on layers this small
        ("fp4", "Linear4bit", 0.16),
        ("int8", "Linear8bitLt", 0.3),
    ],
)
def test_linears_become_frozen_bnb_layers_but_the_head(method: str, layer: str, ratio: float) -> None:
    model = mlp()
    x, y = mlp_data()
    before = model(x[:8]).detach()
    trainer = Trainer(model, nn.CrossEntropyLoss(), "adamw", lr=1e-2, quantize=method, progress=False, seed=0)
    assert type(model.fc1).__name__ == layer and type(model.fc2).__name__ == layer
    assert type(model.head) is nn.Linear and model.head.weight.requires_grad  # the output head stays
    assert not any(p.requires_grad for p in [*model.fc1.parameters(), *model.fc2.parameters()])
    assert {id(p) for p in _stepped(trainer)} == {id(p) for p in model.head.parameters()}
    stored, full = quantized_weight_bytes(model)
    assert 0 < stored <= ratio * full
    # the quantized model computes what the fp32 one did, up to the rounding of its weights (4-bit: coarse)
    error = (model(x[:8]) - before).norm() / before.norm()
    assert error < (0.03 if method == "int8" else 0.3), error
    history = trainer.fit((x, y), batch_size=32, epochs=4)
    assert history.epochs[-1]["loss"] < history.epochs[0]["loss"]


def _stepped(trainer):
    """What the trainer's optimizer steps."""
    return [p for g in trainer.optimizer.param_groups for p in g["params"]]


def test_compute_dtype_follows_precision() -> None:
    model = mlp()
    Trainer(model, nn.CrossEntropyLoss(), "adamw", quantize="nf4", precision="bf16-mixed", progress=False)
    assert model.fc1.compute_dtype == torch.bfloat16
    model = mlp()
    Trainer(model, nn.CrossEntropyLoss(), "adamw", quantize="nf4", progress=False)
    assert model.fc1.compute_dtype == torch.float32


def test_trainable_layers_stay_full_precision_and_train() -> None:
    model = mlp()
    trainer = Trainer(model, nn.CrossEntropyLoss(), "adamw", quantize="nf4", trainable=["fc2.*"], progress=False)
    assert type(model.fc1).__name__ == "Linear4bit"
    assert type(model.fc2) is nn.Linear and model.fc2.weight.requires_grad
    assert not model.head.weight.requires_grad  # trainable= chose fc2 only
    assert {id(p) for p in _stepped(trainer)} == {id(p) for p in model.fc2.parameters()}


def test_hugging_face_model_quantized_from_a_config() -> None:
    model = tiny_llama()
    trainer = Trainer(model, None, "adamw", lr=1e-2, quantize="nf4", progress=False, seed=0)
    kinds = {type(m).__name__ for m in model.model.layers.modules()}
    assert "Linear4bit" in kinds and "Linear" not in kinds
    assert type(model.lm_head) is nn.Linear  # the output embeddings stay
    history = trainer.fit(lm_batches(), epochs=2)
    assert history.epochs[-1]["loss"] < history.epochs[0]["loss"]


class Conv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x).mean(dim=(2, 3))


def test_bad_input_is_refused_before_the_model_changes() -> None:
    with pytest.raises(ValueError, match=r"nothing to quantize in Conv: it has no nn.Linear"):
        Trainer(Conv(), nn.CrossEntropyLoss(), "adamw", quantize="nf4", progress=False)
    model = mlp()
    with pytest.raises(ValueError, match=r"quantize='nf8' is not a quantization: use one of"):
        Trainer(model, nn.CrossEntropyLoss(), "adamw", quantize="nf8", progress=False)
    with pytest.raises(ValueError, match=r"Give it by name"):
        Trainer(model, nn.CrossEntropyLoss(), torch.optim.AdamW(model.parameters()), quantize="nf4", progress=False)
    with pytest.raises(ValueError, match=r"nothing else trains: add adapters"):
        Trainer(model, nn.CrossEntropyLoss(), "adamw", quantize="nf4", freeze=["head"], progress=False)
    # a later check failing (precision) leaves the model untouched too
    with pytest.raises(ValueError, match="precision"):
        Trainer(model, nn.CrossEntropyLoss(), "adamw", quantize="nf4", precision="fp8", progress=False)
    assert type(model.fc1) is nn.Linear and model.fc1.weight.requires_grad


def test_missing_bitsandbytes_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # what an absent package looks like to import
    with pytest.raises(ImportError, match=r'pip install "nbtrainer\[quant\]"'):
        Trainer(mlp(), nn.CrossEntropyLoss(), "adamw", quantize="nf4", progress=False)
    with pytest.raises(ImportError, match=r"optimizer=.adamw8bit. needs bitsandbytes.*nbtrainer\[quant\]"):
        Trainer(mlp(), nn.CrossEntropyLoss(), "adamw8bit", progress=False)


@pytest.mark.slow
def test_import_nbtrainer_imports_no_quantization_library() -> None:
    code = (
        "import sys, nbtrainer; from nbtrainer import Trainer, compare_strategies; "
        "print([m for m in ('bitsandbytes', 'peft', 'torchao') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_memory_saver_support_says_what_runs_here_and_why_not() -> None:
    from nbtrainer import memory_saver_support

    support = memory_saver_support("cpu")
    assert support["quantize:nf4"] == (True, "") and support["optimizer:adamw8bit"] == (True, "")
    assert support["lora"] == (True, "") and support["offload_activations"] == (True, "")
    ok, reason = support["offload_optimizer"]
    assert not ok and "nothing to offload to" in reason
    assert support["attention:math"] == (True, "") and not support["attention:efficient"][0]
    # every switch the panel offers has a row
    assert {"quantize:int8", "optimizer:paged_adamw8bit", "optimizer:adamw4bit", "attention:flash"} <= set(support)


def test_memory_saver_support_names_the_extra_when_a_library_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from nbtrainer import memory_saver_support

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "peft" else real(name, *a))
    assert memory_saver_support("cpu")["lora"] == (False, 'needs peft: pip install "nbtrainer[quant]"')


@pytest.mark.slow
def test_building_a_trainer_shows_no_advice_to_fetch_kernels_from_the_hub() -> None:
    """On a CPU with AVX512-BF16, importing bitsandbytes logs "Failed to load CPU gemm_4bit_forward from
    kernels-community ... pip install kernels" (a package that downloads kernels at run time, which nbtrainer
    never does). A user saw it as red text in every notebook that built a Trainer; nbtrainer drops it."""
    probe = "import bitsandbytes.functional as F; print(bool(F.has_avx512bf16()))"
    has = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    if has.stdout.strip() != "True":
        pytest.skip("bitsandbytes only tries the Hub kernel on CPUs with AVX512-BF16")
    assert "kernels-community" in has.stderr, "bitsandbytes alone still logs the notice (else this test is moot)"
    code = (
        "import torch; from nbtrainer import Trainer\n"
        "m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))\n"
        "Trainer(m, torch.nn.CrossEntropyLoss(), 'adamw', quantize='nf4', progress=False)\n"
        "import bitsandbytes, peft\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "kernels-community" not in run.stderr, run.stderr
