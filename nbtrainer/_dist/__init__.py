"""Where the model runs: one device, DDP, FSDP2 (and their launchers). Checkpoints, FSDP's too, are ``_resume``'s.

=====================  ================================================================================
``_placement``         Strategy: the seam every placement implements; SingleDevice
``_ddp``               DDP: process group, sampler, reductions
``_fsdp``              FSDP2: fully_shard units, mixed-precision and offload policies, even eval batches
``_launch``            launch(fn, nprocs): a multi-process run from a notebook
``_launch_monitor``    LaunchMonitor (the launching process's view) and the ranks' channel to it
=====================  ================================================================================
"""
