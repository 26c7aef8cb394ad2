"""Looking at what the model does: samples during training and error analysis after it.

Consumers of the event stream and of the Trainer's public parts, below the Trainer (which only delegates its
``interpret`` verb here), knowing no screen: the panel's samples and errors sections read what they produce.

=====================  ================================================================================
``_samples``           Samples: ``fn(model)`` between optimizer steps, kept in ``history.samples``
``_side``              side_pass: eval, no_grad, the run's autocast; training flags and RNG put back
``_images``            PNG bytes from tensors, arrays and PIL images (zlib, no imaging library)
``_per_item``          each item's loss: the criterion with ``reduction="none"``, a causal LM's token mean
``_interpret``         interpret(): one streamed pass keeping loss, prediction, target and dataset index
``_interpretation``    Interpretation: top losses, confusion matrices, per-class figures, the gallery
``_gallery``           the HTML of a gallery item (picture, text, tabular row) and of a matrix as a heatmap
=====================  ================================================================================
"""
