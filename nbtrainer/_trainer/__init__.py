"""The Trainer facade: configuration, argument checks, and the public fit / evaluate / predict / control API.

==================  ================================================================================
``_trainer``        Trainer: the public class, its options and their checks
``_base``           the typed state the Trainer's parts share
``_fit``            fit, fit_more: set up a run, hand it to the loop
``_eval``           evaluate, predict (the public verbs over BatchSteps)
``_batch_steps``    BatchSteps: a batch's loss / outputs (compute_loss= / predict_step=), evaluation, val metrics
``_control``        thread-safe control (stop, pause, LR, accumulation), setters between fits, lr_find
``_live_control``   LiveControl: requests applied at a step boundary as on_control events, deferred calls
``_host``           TrainerHost: the Trainer as the fit loop's LoopHost
``_interrupt``      Ctrl-C during fit: stop at the next step, last.ckpt, re-raise in a script
``_checkpoints``    save / load of the Trainer's state
``_validate``       argument and fit checks that run before anything trains
==================  ================================================================================
"""
