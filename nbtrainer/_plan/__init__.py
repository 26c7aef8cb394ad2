"""Plan before you train: which memory switches make a step fit a budget, from shapes (the model may be on meta).

=================  ==================================================================================
``_plan``          :func:`plan_memory`: the candidates, the search, the best row
``_result``        :class:`MemoryPlan` and :class:`PlanRow`: the result, its table and its picture
``_steps``         one row: its simulated step plus the arithmetic parts, its reserved bytes on CUDA
``_context``       what is simulated, and a row's step as a weighted sum of simulations (depth, size, share)
``_simulate``      one training step on fake tensors: activations, temporaries, logits and gradients, in order
``_timeline``      a simulation's allocation trace: its peak, another size, accumulation, a deeper stack
``_allocator``     the CUDA caching allocator's rules (segments, blocks, rounding), cuBLAS's workspace
``_reserved``      a row's steps replayed through the allocator: ``PlanRow.reserved_bytes``
``_distributed``   one rank of DDP or FSDP2
``_arithmetic``    parameters under quantize / LoRA, optimizer state and step temporaries by the libraries' rules
``_cost``          the step-time model behind ``time_factor`` (relative to plain fp32)
``_budget``        ``Trainer(memory_budget_gb=...)``'s example batch, choice, step down and measured check
=================  ==================================================================================
"""

from nbtrainer._plan._plan import MemoryPlan, PlanRow, plan_memory

__all__ = ["MemoryPlan", "PlanRow", "plan_memory"]
