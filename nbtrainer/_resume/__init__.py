"""Checkpoints, all of them: the file format, what a checkpoint holds, continuing a run, FSDP2's full and sharded
state.

=====================  ================================================================================
``_checkpoint_state``  what a checkpoint holds and how it is restored
``_continue``          fit_more and schedule checks
``_checkpoint_io``     checkpoint files: saved through nbtrainer._atomic, loaded with weights_only=True
``_full_state``        FSDP2's full state: gathered to rank 0 in the single-process format, loaded back as shards
``_sharded``           sharded checkpoint directories under FSDP2 (each rank's shards, no gather)
``_rollback``          rollback mid-fit: the state restored at a step boundary, the loop rewound
=====================  ================================================================================
"""
