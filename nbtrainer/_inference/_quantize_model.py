"""Post-training quantization for inference with torchao: a quantized copy of a model, the original untouched.

================  ===========================================================================================
``int8-dynamic``  ``Int8DynamicActivationInt8WeightConfig``: int8 weights, activations quantized per batch
``int8-weight``   ``Int8WeightOnlyConfig``: int8 weights (one scale per output row), float activations
``int4-weight``   ``IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32))``: int4 weights, one
                  scale per 32 inputs (torchao keeps each int4 value in a byte: ``UNPACKED_TO_INT8``)
``codebook4``     weight clustering: k-means finds 16 shared values per layer, each group of 32 weights has a
                  scale, every weight is a 4-bit index (torchao's ``prototype.quantization.codebook``)
================  ===========================================================================================

Only ``nn.Linear`` layers are quantized (what these torchao configs handle); the int4 and codebook methods need
``in_features`` divisible by 32 and leave other Linear layers in float.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from nbtrainer._quiet import quiet_imports

__all__ = ["GROUP_SIZE", "QUANT_METHODS", "quantize_model", "quantized_layers"]

QUANT_METHODS = ("int8-dynamic", "int8-weight", "int4-weight", "codebook4")
GROUP_SIZE = 32  # int4 scales and codebook scales: one per 32 input features
_GROUPED = ("int4-weight", "codebook4")


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """torchao's import noise on a CPU build (``quiet_imports``: its kernel-library lines, torch's Enum warnings);
    k-means warns that ``index_reduce`` is beta. None of it is the user's to act on."""
    with quiet_imports(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"index_reduce\(\) is in beta", category=UserWarning)
        warnings.filterwarnings("ignore", message=r"`torch.jit.script` is deprecated", category=DeprecationWarning)
        yield


def _torchao() -> Any:
    try:
        with _quiet():
            return importlib.import_module("torchao.quantization")  # torchao ships no type information
    except ImportError as exc:
        raise ImportError(
            'quantize_model needs torchao (>= 0.18): pip install "nbtrainer[quant]" (or pip install torchao).'
        ) from exc


def _config(method: str) -> Any:
    tq = _torchao()
    if method == "int8-dynamic":
        return tq.Int8DynamicActivationInt8WeightConfig()
    if method == "int8-weight":
        return tq.Int8WeightOnlyConfig()
    if method == "int4-weight":
        granularity = importlib.import_module("torchao.quantization.granularity")
        int4 = torch.int4  # type: ignore[attr-defined]  # a torch dtype the stubs lack
        return tq.IntxWeightOnlyConfig(weight_dtype=int4, granularity=granularity.PerGroup(GROUP_SIZE))
    with _quiet():
        codebook = importlib.import_module("torchao.prototype.quantization.codebook.codebook_quantized_tensor")
    uint4 = torch.uint4  # type: ignore[attr-defined]  # a torch dtype the stubs lack
    # block_size (1, 1): one codebook of 16 scalars per layer; scale_block_size: one scale per group of 32 weights
    return codebook.CodebookWeightOnlyConfig(dtype=uint4, block_size=(1, 1), scale_block_size=GROUP_SIZE)


def _eligible(module: nn.Module, method: str) -> bool:
    if not isinstance(module, nn.Linear):
        return False
    weight = module.weight
    if type(weight) is not nn.Parameter or not weight.is_floating_point():  # already quantized, or not float
        return False
    return method not in _GROUPED or module.in_features % GROUP_SIZE == 0


def quantized_layers(model: nn.Module, method: str) -> list[str]:
    """The names of the layers of ``model`` that ``quantize_model(model, method)`` quantizes."""
    return [name for name, module in model.named_modules() if _eligible(module, method)]


def quantize_model(model: nn.Module, method: str) -> nn.Module:
    """A quantized copy of ``model`` for inference (torchao ``quantize_``); ``model`` itself is not changed.

    Args:
        model: a trained model (any device torchao supports for the method; CPU works for all four).
        method: ``"int8-dynamic"``, ``"int8-weight"``, ``"int4-weight"`` or ``"codebook4"`` (table in the module
            docstring). ``codebook4`` runs k-means per layer: seconds for a few hundred thousand weights.

    Returns:
        A deep copy in ``eval()`` mode whose ``nn.Linear`` weights are torchao quantized tensors; its
        ``quantization`` attribute says the method and which layers were quantized.

    Raises:
        ValueError: unknown method, or no layer the method applies to.
        ImportError: torchao is not installed (``pip install "nbtrainer[quant]"``).

    Example:
        >>> import torch
        >>> from nbtrainer import quantize_model
        >>> model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
        >>> small = quantize_model(model, "int8-weight")
        >>> small.quantization["layers"], type(small[0].weight).__name__, type(model[0].weight).__name__
        (['0', '2'], 'Int8Tensor', 'Parameter')
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"quantize_model takes a torch.nn.Module, got {type(model).__name__}.")
    if method not in QUANT_METHODS:
        raise ValueError(f"Unknown quantization method {method!r}; choose one of {', '.join(QUANT_METHODS)}.")
    config = _config(method)  # first: a missing torchao is reported before any copy is made
    layers = quantized_layers(model, method)
    if not layers:
        kinds = sorted({type(m).__name__ for m in model.modules() if not list(m.children())}) or ["no layers"]
        need = f" with in_features divisible by {GROUP_SIZE}" if method in _GROUPED else ""
        raise ValueError(
            f"{method!r} applies to nn.Linear layers{need}; this model ({type(model).__name__}) has none "
            f"(its layers: {', '.join(kinds[:8])}). Quantize a model with such Linear layers"
            + (", or use 'int8-weight' / 'int8-dynamic', which take any in_features." if need else ".")
        )
    quantize_ = _torchao().quantize_
    quantized = copy.deepcopy(model).eval()
    with torch.no_grad(), _quiet():
        quantize_(quantized, config, filter_fn=lambda module, _fqn: _eligible(module, method))
    skipped = [name for name, m in model.named_modules() if isinstance(m, nn.Linear) and name not in layers]
    setattr(quantized, "quantization", {"method": method, "layers": layers, "skipped": skipped})  # noqa: B010
    return quantized
