"""Plan before you train: which memory switches make a step fit a budget, from shapes (the model may be on meta).

=================  ==================================================================================
``_plan``          :func:`plan_memory`: the candidates, the search, the best row
``_result``        :class:`MemoryPlan` and :class:`PlanRow`: the result, its table and its picture
``_steps``         one row: the simulated step of a combination (extrapolated) plus the arithmetic parts
``_simulate``      one training step on fake tensors: activations, temporaries, logits and gradients at peak
``_arithmetic``    parameters under quantize / LoRA, optimizer state and step temporaries by the libraries' rules
``_cost``          the step-time model behind ``time_factor`` (relative to plain fp32)
=================  ==================================================================================
"""

from nbtrainer._plan._plan import MemoryPlan, PlanRow, plan_memory

__all__ = ["MemoryPlan", "PlanRow", "plan_memory"]
