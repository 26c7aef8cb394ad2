"""Training health: what goes wrong while it happens, why, and what to do (``nbtrainer.Health``).

==================  ==============================================================================
``_health``         Health: the callback (a consumer of the event stream): its state, hooks, reports and acts
``_readings``       what the refresh delivers, judged: sampled norms and dead units, losses, data wait
``_judge``          what the measured values mean: problems, warnings and the lights' summaries
``_health_report``  HealthReport (one finding, its advised action) and SignalState (a light of the health card)
``_norms``          gradient / weight norms and update ratios per block, on the device, at sampled steps
``_units``          dead ReLU units and the output width, on a sampled step's own forward; the chance level
``_loss_watch``     loss spikes, a rising loss, a run that does not learn, from the losses the refresh has read
``_locate``         diagnostic forwards: where a NaN first appears, a batch's dead units and loss
``_advice``         an LR and a clipping norm computed from the measurements, and what helps a slow loader
``_remedy``         the advice of a problem (LR, clipping, recovery) and a fix's work at the step boundary
``_snapshot``       healthy states in host memory (weights, buffers, optimizer state), bounded
``_fix``            Health.apply_advice's action (the panel's button) and the check that it worked
==================  ==============================================================================
"""

from nbtrainer._health._health import Health
from nbtrainer._health._health_report import HealthReport, SignalState

__all__ = ["Health", "HealthReport", "SignalState"]
