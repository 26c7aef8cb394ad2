"""Checkpoint files and exact resume.

=====================  ================================================================================
``_checkpoint_state``  what a checkpoint holds and how it is restored
``_continue``          fit_more and schedule checks
``_checkpoint_io``     atomic writes, weights_only loads, CheckpointError
=====================  ================================================================================
"""
