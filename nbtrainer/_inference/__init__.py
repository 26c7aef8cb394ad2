"""Smaller and faster after training: distillation, post-training quantization, and one table that compares them.

====================  ================================================================================
``_distill``          :class:`DistillationLoss`: a frozen teacher's soft targets as a Trainer criterion
``_quantize_model``   :func:`quantize_model`: torchao int8 / int4 weight-only, int8 dynamic, 4-bit codebooks
``_compare``          :func:`compare_inference`: size, latency, metric and output drift of each variant
``_size_latency``     sizes on disk and in memory (quantized tensors flattened), interleaved latency rounds
``_inference_table``  :class:`InferenceComparison`: the rows as pandas, text and HTML with bars
``_logits``           the logits of a model's outputs (tensor, ``.logits``, dict, tuple)
====================  ================================================================================
"""

from nbtrainer._inference._compare import compare_inference
from nbtrainer._inference._distill import DistillationLoss
from nbtrainer._inference._inference_table import InferenceComparison
from nbtrainer._inference._quantize_model import QUANT_METHODS, quantize_model

__all__ = ["QUANT_METHODS", "DistillationLoss", "InferenceComparison", "compare_inference", "quantize_model"]
