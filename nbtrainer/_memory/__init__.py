"""Memory, measured in one place: every number nbtrainer reports about memory comes from here.

==============  ================================================================================
``_peak``       track_peak / PeakTracker: the peak of live tensor storage over a block, on any device, split by
                category (the comparisons, the planner's simulated step and its checks, benches and tests)
``_breakdown``  measure_training_memory: one optimizer step on a private copy, part by part (the profile card)
``_window``     MemoryProbe: the peak per refresh window from host-side counters, no device sync (the progress
                stream); host_capacity (the OOM advice)
==============  ================================================================================
"""
