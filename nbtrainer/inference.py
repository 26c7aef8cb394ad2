"""Smaller and faster after training: distillation (``DistillationLoss``), post-training quantization
(``quantize_model``) and ``compare_inference`` (size, latency and agreement of the variants)."""

from nbtrainer._inference._compare import compare_inference
from nbtrainer._inference._distill import DistillationLoss
from nbtrainer._inference._inference_table import InferenceComparison
from nbtrainer._inference._quantize_model import quantize_model

__all__ = ["DistillationLoss", "InferenceComparison", "compare_inference", "quantize_model"]
