"""The event stream and its consumers: callbacks, progress, history, loggers.

=====================  ================================================================================
``_stream``            EVENTS, Progress, CallbackList: the one stream every consumer reads
``_callbacks``         Callback, EarlyStopping, LRMonitor, HistoryRecorder
``_model_checkpoint``  ModelCheckpoint (checkpoint files of a run)
``_progress``          ProgressBar: notebook bars, console bars, plain lines
``_loggers``           TensorBoardLogger, CSVLogger
``_history``           History: steps, epochs, events
``_sample_list``       SampleList: history.samples, shown as a table of the samples by step
``_frontend``          notebook or console, decided at run time
``_launched``          RankMonitor: a launched rank's progress to the launching process, its stop back
``_trainer_view``      TrainerView: the Protocol of what callbacks, loggers and trackers read of the Trainer
=====================  ================================================================================
"""
