"""Model setup before the first step: optimizer by name, freezing, activation checkpointing, precision, seeds.

=============================  ================================================================================
``_model_setup``               ModelSetup, build_optimizer, freeze_parameters, ParamCounts
``_activation_checkpointing``  activation checkpointing of repeated blocks (not checkpoint files)
``_optim``                     Adafactor and optimizer helpers
``_precision``                 precision names, support checks, autocast, GradScaler
``_seed``                      seed_everything, deterministic mode, RNG state
=============================  ================================================================================
"""
