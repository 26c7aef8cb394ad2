"""The training loop: one batch at a time, through one training step, with the device-side sums it keeps.

==================  ================================================================================
``_host``           LoopHost: the Trainer as the loop and the tools around a run see it (the seam)
``_fit_loop``       FitLoop: epochs, accumulation windows, validation, refresh (the sync budget is at its top)
``_epoch_end``      an epoch's end in a fit: its History row, validation, the epoch scheduler, deferred saves
``_kept``           KeptBatches: the open window's batches kept for a consumer that looks at them again (Health)
``_step``           TrainStep: one window's backward and optimizer step (fit and the LR finder)
``_in_backward``    optimizer_in_backward: each parameter updated inside backward, its gradient freed
``_run_state``      RunState: a run's progress across fits (position, metric sums, History), owned by the Trainer;
                    RunningLoop: what others read of a running fit's loop
``_batch_steps``    BatchSteps: a batch's loss / outputs (compute_loss= / predict_step=), first batch, evaluate, predict
``_manual``         training_step=: the user's steps by name through a handle
``_closure``        a closure optimizer (LBFGS): forward and backward inside the step
``_metrics``        device-side running sums of losses and metrics
``_nonfinite``      the NaN/inf gate, without a per-step sync
``_control``        all control: requests from other threads, the Trainer's LiveControl that applies them at a
                    step boundary as on_control events, deferred calls, the LR arithmetic of a change
``_oom``            out-of-memory: free, re-raise with advice
``_lr_find``        the LR range test
``_put_back``       ModelPutBack: what training steps write on a model, put back after a measuring tool trained
==================  ================================================================================
"""
