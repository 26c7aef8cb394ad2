"""Precision: aliases, no silent downgrade, CPU bf16/fp16 training tracks fp32, GPU variants when present."""

from __future__ import annotations

import pytest
import torch
from conftest import accuracy, make_classification, make_loader, mlp

from nbtrainer import PrecisionError, Trainer, precision_support
from nbtrainer._setup._precision import normalize_precision

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize(
    "alias,name",
    [
        ("32", "fp32"),
        (32, "fp32"),
        ("16", "fp16-mixed"),
        ("16-mixed", "fp16-mixed"),
        ("bf16", "bf16-mixed"),
        ("BF16-Mixed", "bf16-mixed"),
        ("fp32", "fp32"),
    ],
)
def test_aliases(alias, name):
    assert normalize_precision(alias) == name


def test_unknown_precision_names_options():
    model = mlp()
    with pytest.raises(PrecisionError, match=r"Unknown precision 'fp8'.*fp32, fp16-mixed, bf16-mixed"):
        Trainer(model, torch.nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=0.1), precision="fp8")


def test_support_is_checked_on_cpu():
    support = precision_support("cpu")
    assert support["fp32"] == (True, "")
    # torch 2.13 runs CPU autocast in both half types (the trial forward+backward proves it here).
    assert support["bf16-mixed"][0] and support["fp16-mixed"][0]


def _run(precision, device, epochs=6):
    x, y = make_classification(n=512)
    model = mlp(hidden=32)
    trainer = Trainer(
        model,
        torch.nn.CrossEntropyLoss(),
        torch.optim.Adam(model.parameters(), lr=1e-2),
        precision=precision,
        device=device,
        metrics={"acc": accuracy},
        progress=False,
        seed=0,
    )
    return trainer, trainer.fit(make_loader(x, y, batch_size=64, shuffle=True), epochs=epochs)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("precision", ["bf16-mixed", "fp16-mixed"])
def test_mixed_precision_trains_and_tracks_fp32(device, precision):
    _, ref = _run("fp32", device)
    trainer, hist = _run(precision, device)
    assert trainer.precision == precision  # never silently changed
    assert (trainer.scaler is not None) == (precision == "fp16-mixed")
    assert hist["loss"][-1] < hist["loss"][0] * 0.6  # it trains
    # bf16 has ~3 significant digits: the curves agree to a few percent, not bit for bit.
    for a, b in zip(hist["loss"], ref["loss"], strict=True):
        assert a == pytest.approx(b, rel=0.08, abs=0.02)
    assert hist["acc"][-1] > 0.85


def test_autocast_covers_forward_and_loss():
    seen = {}

    def criterion(out, target):
        seen["dtype_in_loss"] = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None
        seen["out_dtype"] = out.dtype
        return torch.nn.functional.cross_entropy(out, target)

    x, y = make_classification(n=64)
    model = mlp()
    Trainer(model, criterion, torch.optim.SGD(model.parameters(), lr=0.1), precision="bf16", progress=False).fit(
        make_loader(x, y), epochs=1
    )
    assert seen["dtype_in_loss"] == torch.bfloat16 and seen["out_dtype"] == torch.bfloat16


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_bf16_refused_without_native_support():
    if torch.cuda.is_bf16_supported(including_emulation=False):
        pytest.skip("this GPU has native bf16")
    model = mlp()
    with pytest.raises(PrecisionError, match="no native bf16"):
        Trainer(
            model,
            torch.nn.CrossEntropyLoss(),
            torch.optim.SGD(model.parameters(), lr=0.1),
            precision="bf16-mixed",
            device="cuda",
        )


def test_nbtrainer_device_sets_what_auto_means(monkeypatch: pytest.MonkeyPatch) -> None:
    from nbtrainer._setup._precision import resolve_device

    monkeypatch.setenv("NBTRAINER_DEVICE", "meta")
    assert resolve_device("auto") == torch.device("meta") and resolve_device(None) == torch.device("meta")
    assert resolve_device("cpu") == torch.device("cpu"), "an explicit device wins"
    monkeypatch.setenv("NBTRAINER_DEVICE", "auto")
    assert resolve_device("auto").type in ("cpu", "cuda", "mps")
