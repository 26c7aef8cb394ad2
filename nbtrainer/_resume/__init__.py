"""Checkpoint files and exact resume.

=====================  ================================================================================
``_checkpoint_state``  what a checkpoint holds and how it is restored
``_continue``          fit_more and schedule checks
``_checkpoint_io``     checkpoint files: saved through nbtrainer._atomic, loaded with weights_only=True
``_sharded``           sharded checkpoint directories under FSDP2 (each rank's shards, no gather)
``_resume_host``       ResumableTrainer: the Protocol of what checkpoints and fit_more need
=====================  ================================================================================
"""
