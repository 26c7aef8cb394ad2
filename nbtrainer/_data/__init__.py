"""The data path: from a loader or arrays to a batch on the device, and predictions back.

====================  ================================================================================
``_arrays``           fit((X, y), batch_size=...): arrays as loaders
``_fetch``            one index_select per batch instead of per-sample collate
``_prefetch``         DataPath: batched fetch or the loader's iterator; CUDA side-stream prefetch
``_item_index``       IndexTrack: the dataset indices of each training batch, for consumers of items (DataMap)
``_cleaned``          DataEdits, CleanedDataset: items dropped / relabeled as a view (still the batched fetch)
``_batch``            the batch protocol: inputs, targets, device moves, containers
``_inputs``           example inputs (profiling, the memory breakdown): batch size, calling the model, a default loss
``_split``            a batch cut into micro-batches (comparisons, memory_budget_gb)
``_step_result``      what a manual training_step / validation_step returns, checked
``_predict_collect``  predict's output collection: padding, concatenation, caches left out
``_validate_batch``   the first batch checked in stages (batch -> model -> criterion)
``_batch_norm``       a BatchNorm the epoch's last batch of one item would break, found at the first batch
====================  ================================================================================
"""
