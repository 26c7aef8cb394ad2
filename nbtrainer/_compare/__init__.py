"""Strategy comparison: train once per strategy from the same weights and data order, and tabulate.

===================  ================================================================================
``_run``             :func:`compare_strategies`: the loop over strategies (and repeats), ratios to the baseline
``_presets``         :data:`PRESETS` and :func:`resolve_strategies`: which Trainer options each strategy sets
``_data``            the same data order for every strategy; batches split into micro-batches for accumulation
``_run_measure``     step times, training memory off CUDA, final loss, failure reasons
``_strategy_table``  :class:`StrategyComparison`: the rows as pandas, text, Markdown and HTML
===================  ================================================================================
"""

from nbtrainer._compare._data import split_batch
from nbtrainer._compare._presets import PRESETS, resolve_strategies
from nbtrainer._compare._run import compare_strategies
from nbtrainer._compare._strategy_table import StrategyComparison

__all__ = ["PRESETS", "StrategyComparison", "compare_strategies", "resolve_strategies", "split_batch"]
