"""quantize_model with real torchao on CPU (issue 24): a quantized copy (the original untouched), outputs close to
fp32, the accuracy of a trained digits MLP kept, and clear errors (unknown method, no supported layer, no
torchao)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any, cast

import pytest
import torch
from conftest import needs
from inference_data import accuracy, batches, digits, mlp, train
from torch import nn

from nbtrainer import quantize_model

pytestmark = needs("torchao")

# largest |output - fp32 output| on the trained model's validation logits (logits span about +-20)
TOLERANCE = {"int8-dynamic": 0.3, "int8-weight": 0.15, "int4-weight": 1.0, "codebook4": 1.5}


@pytest.fixture(scope="module")
def trained():
    xt, yt, xv, yv = digits()
    return train(mlp(64, seed=0), batches(xt, yt), epochs=6), xv, yv


@pytest.mark.parametrize("method", list(TOLERANCE))
def test_quantized_copy_is_close_and_the_original_untouched(trained, method) -> None:
    model, xv, yv = trained
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        reference = model(xv)
    quantized = cast(nn.Sequential, quantize_model(model, method))
    assert quantized is not model and not quantized.training
    assert quantized.__dict__["quantization"] == {"method": method, "layers": ["0", "2", "4"], "skipped": []}
    assert all(type(quantized[i].weight) is not nn.Parameter for i in (0, 2, 4))  # torchao tensors now
    for key, value in model.state_dict().items():  # the original: same values, plain parameters
        assert type(value) is torch.Tensor
        torch.testing.assert_close(value, before[key], rtol=0, atol=0)
    with torch.no_grad():
        out = quantized(xv)
    diff = (out - reference).abs().max().item()
    assert 0 < diff < TOLERANCE[method], diff  # changed (really quantized), but not by much
    assert abs(accuracy(quantized, xv, yv) - accuracy(model, xv, yv)) <= 0.03


def test_codebook_has_16_shared_values_per_group(trained) -> None:
    model, _, _ = trained
    weight = cast(Any, quantize_model(model, "codebook4"))[2].weight
    dense = weight.dequantize()
    assert weight.codebook.numel() == 16
    groups = dense.reshape(64, 2, 32)  # one scale per 32 weights of a row
    assert max(len(torch.unique(g)) for g in groups.reshape(-1, 32)) <= 16


def test_layers_that_do_not_fit_the_groups_stay_float() -> None:
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10), nn.ReLU(), nn.Linear(10, 3))
    quantized = cast(nn.Sequential, quantize_model(model, "int4-weight"))
    assert quantized.__dict__["quantization"]["layers"] == ["0", "2"]
    assert quantized.__dict__["quantization"]["skipped"] == ["4"]
    assert type(quantized[4].weight) is nn.Parameter


def test_unknown_method() -> None:
    with pytest.raises(ValueError, match=r"Unknown quantization method 'int3'.*int8-dynamic, int8-weight"):
        quantize_model(nn.Linear(64, 10), "int3")


def test_model_without_supported_layers() -> None:
    convs = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten())
    with pytest.raises(ValueError, match=r"'int8-weight' applies to nn.Linear layers; this model \(Sequential\)"):
        quantize_model(convs, "int8-weight")
    with pytest.raises(ValueError, match=r"in_features divisible by 32.*use 'int8-weight'"):
        quantize_model(nn.Linear(10, 3), "codebook4")


@pytest.mark.slow  # starts an interpreter (README: such tests are slow; the inner loop leaves them out)
def test_missing_torchao_says_how_to_install() -> None:
    code = (
        "import sys, torch; sys.modules['torchao'] = None; sys.modules['torchao.quantization'] = None\n"
        "from nbtrainer import quantize_model\n"
        "try:\n"
        "    quantize_model(torch.nn.Linear(64, 10), 'int8-weight')\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert 'pip install "nbtrainer[quant]"' in out.stdout, out.stderr
