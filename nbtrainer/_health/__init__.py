"""Training health: what goes wrong while it happens, why, and what to do (``nbtrainer.Health``).

==================  ==============================================================================
``_health``         Health: the callback (a consumer of the event stream), its reports and actions
``_judge``          what the measured values mean: problems, warnings and the lights' summaries
``_health_report``  HealthReport (one finding) and SignalState (a light of the panel's health card)
``_norms``          gradient / weight norms and update ratios per block, on the device, at sampled steps
``_loss_watch``     loss spikes and a rising loss, from the losses the refresh has read
``_locate``         diagnostic forwards: where a NaN first appears, dead ReLU units
``_advice``         a concrete LR, and what helps a slow loader
==================  ==============================================================================
"""

from nbtrainer._health._health import Health
from nbtrainer._health._health_report import HealthReport, SignalState

__all__ = ["Health", "HealthReport", "SignalState"]
