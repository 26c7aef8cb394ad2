"""The Trainer facade: configuration, argument checks, and the public fit / evaluate / predict / control API.

==================  ================================================================================
``_trainer``        Trainer: the one public class (fit, evaluate, predict, checkpoints, control), over its parts
``_batch_steps``    BatchSteps: a batch's loss / outputs (compute_loss= / predict_step=), evaluation, val metrics
``_loop_host``      TrainerHost: the Trainer as the fit loop's LoopHost
``_interrupt``      Ctrl-C during fit: stop at the next step, last.ckpt, re-raise in a script
``_validate``       argument and fit checks that run before anything trains
``_memory_budget``  MemoryBudget: memory_budget_gb= (plan at the first fit, check the first steps, step down)
==================  ================================================================================
"""
