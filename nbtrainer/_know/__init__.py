"""Knowing the data: checked before the first step, seen as the model sees it, and mapped by how training treats
each item.

Above ``_look`` (it reuses its per-item loss, indexed passes and item pictures), below the Trainer, which delegates
its ``check_data`` and ``show_batch`` verbs here; the panel's data section reads what these produce.

=====================  ================================================================================
``_datamap``           DataMap: a callback adding up, per training item on the device, the probability of its
                       label, right or wrong and the margin, from the forward pass the step makes
``_issues``            LabelIssue / LabelIssues, the map's picture (confidence against variability)
=====================  ================================================================================
"""
