"""Where the model runs: one device, DDP, FSDP2 (and their launchers). Checkpoints, FSDP's too, are ``_resume``'s.

=====================  ================================================================================
``_placement``         Placement: single device or distributed wrap, no_sync
``_ddp``               DDP: process group, sampler, reductions
``_fsdp``              FSDP2: fully_shard units, mixed-precision and offload policies, even eval batches
``_launch``            launch(fn, nprocs): a multi-process run from a notebook
``_dist_host``         DistTrainer: the Protocol of what the placement needs of the Trainer
=====================  ================================================================================
"""
