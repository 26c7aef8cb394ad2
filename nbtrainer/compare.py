"""Strategies side by side: ``compare_strategies`` trains one private copy of the model per strategy (precision,
checkpointing, accumulation, the memory savers) and returns a ``StrategyComparison`` (time, measured peak, quality).
The panel's view of it is ``nbtrainer.widgets.CompareWidget``.
"""

from nbtrainer._compare._presets import PRESETS
from nbtrainer._compare._run import compare_strategies
from nbtrainer._compare._strategy_table import StrategyComparison

__all__ = ["PRESETS", "StrategyComparison", "compare_strategies"]
