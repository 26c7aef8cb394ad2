"""The Trainer facade: its keywords parsed into option groups, the parts built from them, and the public fit / evaluate
/ predict / control API over those parts.

==================  ================================================================================
``_trainer``        Trainer: the one public class (fit, evaluate, predict, checkpoints, control), over its parts
``_assemble``       Trainer.__init__'s work: every check in order, then the parts; the model changed last
``_fit_run``        Trainer.fit's work: its arguments checked, then begin / run / end of one fit
``_interrupt``      Ctrl-C during fit: stop at the next step, last.ckpt, re-raise in a script
``_validate``       argument and fit checks that run before anything trains
``_memory_budget``  MemoryBudget: memory_budget_gb= (plan at the first fit, check the first steps, step down)
==================  ================================================================================
"""
