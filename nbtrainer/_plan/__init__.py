"""Plan before you train: which memory switches make a step fit a budget, from shapes (the model may be on meta).

=================  ==================================================================================
``_plan``          :func:`plan_memory`, :class:`MemoryPlan` and :class:`PlanRow`: the search and its result
``_simulate``      one training step on fake tensors: activations, temporaries, logits and gradients at peak
``_arithmetic``    parameters under quantize / LoRA, optimizer state and step temporaries by the libraries' rules
``_cost``          the step-time model behind ``time_factor`` (relative to plain fp32)
=================  ==================================================================================
"""

from nbtrainer._plan._plan import MemoryPlan, PlanRow, plan_memory

__all__ = ["MemoryPlan", "PlanRow", "plan_memory"]
