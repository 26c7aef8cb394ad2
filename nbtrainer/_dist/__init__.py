"""Where the model runs: one device, DDP (and their launchers).

==============  ================================================================================
``_placement``  Placement: single device or distributed wrap, no_sync
``_ddp``        DDP: process group, sampler, reductions
``_launch``     launch(fn, nprocs): a multi-process run from a notebook
==============  ================================================================================
"""
