"""Knowing the data: checked before the first step, seen as the model sees it, and mapped by how training treats
each item.

Above ``_look`` (it reuses its per-item loss, indexed passes and item pictures), below the Trainer, which delegates
its ``check_data`` and ``show_batch`` verbs here; the panel's data section reads what these produce.

=====================  ================================================================================
``_check``             check_data: one streamed pass per split (dataset order or a seeded sample), the model run
                       once for its outputs; ``check_at_fit`` for ``Trainer(check_data=True)``
``_stats``             the pass's statistics: moments per feature, NaN / Inf, item hashes, class counts
``_findings``          statistics -> DataProblem records (duplicates, leaks, values, scale, shift), and the report's
                       notes and per-split summaries
``_label_findings``    the targets' findings (label range, imbalance, missing and unseen classes) and notes
``_data_report``       DataProblem, DataReport (lights, text, HTML)
``_option``            ``Trainer(check_data=...)`` checked (imports nothing else)
``_show_batch``        show_batch: a batch as the model receives it (pictures, text, a table)
``_datamap``           DataMap: a callback adding up, per training item on the device, the probability of its
                       label, right or wrong and the margin, from the forward pass the step makes
``_batch_rows``        which row of a batch is which item: the map's checks against a collate_fn that reorders or
                       drops items, and whether a fit's data is the last fit's
``_map_rows``          what a map's reduction writes per row: the label's probability, the margin, the strongest
                       other class, and each item's last row (an item drawn twice); what a map follows (map_mode)
``_map_state``         a map in a checkpoint: saved with the run, loaded when it resumes (each step counted once)
``_issues``            LabelIssue / LabelIssues, the map's picture (confidence against variability)
=====================  ================================================================================
"""
