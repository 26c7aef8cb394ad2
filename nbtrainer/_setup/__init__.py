"""Model setup before the first step: optimizer by name, freezing, activation checkpointing, precision, seeds,
and the switches for training what does not fit (quantized base, LoRA, k-bit optimizers, offloading, attention).

=============================  ================================================================================
``_model_setup``               ModelSetup, build_optimizer, freeze_parameters, ParamCounts
``_activation_checkpointing``  activation checkpointing of repeated blocks (not checkpoint files)
``_optim``                     Adafactor and optimizer helpers
``_precision``                 precision names, support checks, autocast, GradScaler
``_seed``                      seed_everything, deterministic mode, RNG state
``_memory_savers``             MemorySavers (the switches below, checked together), memory_saver_support
``_quantize``                  quantize=: frozen bitsandbytes 4-bit / 8-bit layers on any nn.Module
``_lora``                      lora=: PEFT adapters, checkpoints of what trains, merge_lora
``_kbit_optim``                adamw8bit / paged_adamw8bit (bitsandbytes), adamw4bit (torchao)
``_offload``                   offload_activations (save_on_cpu), offload_optimizer (CPUOffloadOptimizer)
``_offload_optimizer``         the adapter that makes CPUOffloadOptimizer behave like a torch optimizer
``_attention``                 attention=: the SDPA backend around the forward, checked on the device
``_coverage``                  trainable parameters that no optimizer holds: refused (or warned) up front
=============================  ================================================================================
"""
