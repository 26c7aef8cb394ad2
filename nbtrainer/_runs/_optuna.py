"""Hyperparameter search with Optuna: ``OptunaPruning`` (a callback) and ``tune`` (a study whose trials are fits).

Each trial is a fit, and so a run in the store, tagged ``optuna.study``, ``optuna.trial``, ``optuna.state`` and
``optuna.param.<name>``: ``nbtrainer.Runs().plot("val_loss")`` overlays the trials, ``RunsWidget`` shows them
live. A pruned trial's fit ends as ``stopped`` (its reason says it was pruned), and Optuna records it as PRUNED.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from nbtrainer._events._callbacks import Callback, check_monitor
from nbtrainer._events._stream import CallbackList
from nbtrainer._optional import import_optional
from nbtrainer._report._format import format_number
from nbtrainer._runs._recorder import RunRecorder
from nbtrainer._runs._store import dumps

if TYPE_CHECKING:
    from nbtrainer._loop._host import LoopHost

__all__ = ["OptunaPruning", "tune"]

_INSTALL = 'pip install "nbtrainer[optuna]"  (or: pip install optuna)'
#: what fails one trial of ``tune`` and not the search: errors of training (a diverging LR, out of memory)
TRIAL_ERRORS: tuple[type[Exception], ...] = (RuntimeError, ArithmeticError)


def _optuna() -> Any:
    return import_optional("optuna", "Hyperparameter search (OptunaPruning, tune)", _INSTALL)


class OptunaPruning(Callback):
    """Report ``monitor`` to an Optuna trial at each epoch end; end the fit with ``optuna.TrialPruned`` when the
    pruner says so.

    The decision is taken on rank 0 and agreed across ranks under DDP (one all-reduce per epoch, the one
    ``stop`` uses), so every rank leaves the fit at the same epoch. The fit's status is ``stopped``, with
    ``stop_reason`` saying which epoch pruned it; ``optuna.TrialPruned`` propagates to ``study.optimize``.

    Args:
        trial: the ``optuna.Trial`` of this fit.
        monitor: an epoch value (``"val_loss"``, ``"val_acc"``...).

    Example:
        >>> # def objective(trial):
        >>> #     trainer = Trainer(..., callbacks=[OptunaPruning(trial, monitor="val_loss")])
        >>> #     return trainer.fit(train, val, epochs=10).best("val_loss")["val_loss"]
    """

    def __init__(self, trial: Any, monitor: str = "val_loss") -> None:
        optuna = _optuna()
        if not isinstance(trial, optuna.trial.BaseTrial):
            raise TypeError(f"OptunaPruning needs the optuna Trial of the objective, got {type(trial).__name__}.")
        self.trial = trial
        self.monitor = monitor
        self.pruned_epoch: int | None = None

    def on_fit_start(self, trainer: LoopHost) -> None:
        check_monitor("OptunaPruning", self.monitor, trainer)
        self.pruned_epoch = None

    def on_epoch_end(self, trainer: LoopHost, epoch: int, logs: dict[str, Any]) -> None:
        prune = False
        if trainer.is_global_zero and self.monitor in logs:
            self.trial.report(float(logs[self.monitor]), step=epoch)
            prune = bool(self.trial.should_prune())
        if trainer.strategy.any_rank(prune):
            self.pruned_epoch = epoch
            value = format_number(logs.get(self.monitor))
            raise _optuna().TrialPruned(f"trial {self.trial.number} pruned at epoch {epoch} ({self.monitor}={value})")

    def on_exception(self, trainer: LoopHost, exception: BaseException) -> None:
        if self.pruned_epoch is not None and isinstance(exception, _optuna().TrialPruned):
            trainer.status = "stopped"  # a planned end of the fit, not a failure of the model
            trainer.history.stop_reason = f"Optuna: {exception}"


def _check_built(built: Any, trial_number: int) -> tuple[Any, Any, Any]:
    hint = "build(trial) must return (trainer, train_loader, val_loader), e.g. `return trainer, train, val`"
    if not isinstance(built, (tuple, list)) or len(built) != 3:
        what = f"a {type(built).__name__}" + (f" of {len(built)}" if isinstance(built, (tuple, list)) else "")
        raise TypeError(f"{hint}; trial {trial_number} got {what}.")
    trainer = built[0]
    try:
        trains = callable(trainer.fit) and isinstance(trainer.callbacks, CallbackList)
    except AttributeError:
        trains = False
    if not trains:
        raise TypeError(f"{hint}; the first item of trial {trial_number} is a {type(trainer).__name__}, not a Trainer.")
    if built[1] is None:
        raise TypeError(f"{hint}; the train_loader of trial {trial_number} is None.")
    return trainer, built[1], built[2]


def tune(
    build: Callable[[Any], tuple[Any, Any, Any]],
    *,
    n_trials: int,
    monitor: str = "val_loss",
    direction: str = "minimize",
    epochs: int,
    sampler: Any = None,
    pruner: Any = None,
    storage: Any = None,
    study_name: str | None = None,
    callbacks: Iterable[Any] = (),
    study_callbacks: Iterable[Callable[[Any, Any], None]] = (),
    catch: type[BaseException] | tuple[type[BaseException], ...] = TRIAL_ERRORS,
) -> Any:
    """Search hyperparameters: ``build(trial)`` makes a trainer and its data, each trial fits it with pruning.

    Each trial's value is the best ``monitor`` of its epochs (by ``direction``); a trial stopped before it logged one
    (``request_stop``, the interpreter exiting) is pruned. Every trial is a run in the trainer's run store, tagged
    with the study, trial number, state and parameters.

    Args:
        build: ``build(trial) -> (trainer, train_loader, val_loader)``; suggest values with ``trial.suggest_*``.
        n_trials: how many trials.
        monitor: the epoch value to optimize and prune on.
        direction: ``"minimize"`` or ``"maximize"``.
        epochs: epochs per trial.
        sampler, pruner, storage, study_name: as for ``optuna.create_study`` (default pruner: ``MedianPruner``;
            a study of that name in ``storage`` is continued).
        callbacks: trainer callbacks attached to every trial's trainer (a live view's, a logger).
        study_callbacks: ``fn(study, frozen_trial)`` called after each trial (``study.stop()`` ends the search).
        catch: the exceptions that fail one trial (Optuna records it as FAILED, the reason in its user attribute
            ``nbtrainer_error`` and in its run's ``stop_reason``) while the search goes on, raised by ``build(trial)``
            or by the fit. Default: the errors training meets (``RuntimeError``, out of memory included, and
            ``ArithmeticError``, as ``NonFiniteLossError`` from a diverging learning rate). Anything else (a
            ``TypeError`` or ``ValueError`` of the code, ``KeyboardInterrupt``) ends the search and is raised;
            ``catch=()`` ends it at the first failure, ``catch=(Exception,)`` goes on through any.

    Returns:
        The ``optuna.Study``.

    Example:
        >>> # def build(trial):
        >>> #     model = make_model(hidden=trial.suggest_int("hidden", 16, 128))
        >>> #     lr = trial.suggest_float("lr", 1e-4, 1e-1, log=True)
        >>> #     return Trainer(model, loss, "adamw", lr=lr, progress=False), train_loader, val_loader
        >>> # study = nbtrainer.tune(build, n_trials=20, epochs=5); study.best_params
    """
    optuna = _optuna()
    if not callable(build):
        raise TypeError(f"build must be a function build(trial) -> (trainer, train_loader, val_loader), got {build!r}.")
    if not isinstance(n_trials, int) or isinstance(n_trials, bool) or n_trials < 1:
        raise ValueError(f"n_trials must be an int >= 1, got {n_trials!r}.")
    if not isinstance(epochs, int) or isinstance(epochs, bool) or epochs < 1:
        raise ValueError(f"epochs must be an int >= 1, got {epochs!r}.")
    if direction not in ("minimize", "maximize"):
        raise ValueError(f"direction must be 'minimize' or 'maximize', got {direction!r}.")
    caught = _check_catch(catch)
    extra = list(callbacks)
    study = optuna.create_study(
        direction=direction,
        sampler=sampler,
        pruner=pruner if pruner is not None else optuna.pruners.MedianPruner(),
        storage=storage,
        study_name=study_name,
        load_if_exists=study_name is not None,
    )

    def objective(trial: Any) -> float:
        try:
            built = build(trial)
        except caught as exc:
            trial.set_user_attr("nbtrainer_error", f"build(trial): {type(exc).__name__}: {exc}")
            raise
        trainer, train_loader, val_loader = _check_built(built, trial.number)
        pruning = OptunaPruning(trial, monitor)
        recorder = next((cb for cb in trainer.callbacks.callbacks if isinstance(cb, RunRecorder)), None)
        tags = {"optuna.study": study.study_name, "optuna.trial": trial.number, "optuna.state": "running"}
        tags.update({f"optuna.param.{k}": v for k, v in trial.params.items()})
        if recorder is not None:
            recorder.tags = {**recorder.tags, **tags}
        for cb in [*extra, pruning]:  # pruning last: the others see the epoch that ends the trial
            trainer.callbacks.append(cb)
        state = "failed"
        try:
            history = trainer.fit(train_loader, val_loader, epochs=epochs)
            logged = monitor in history.keys()  # not when stopped before its first validation
            best = history.best(monitor, "min" if direction == "minimize" else "max") if logged else None
            if best is None and history.status == "stopped":
                # stopped on request before its first value (the interpreter exiting, a Stop): no result, and
                # nothing the user built wrong either
                raise optuna.TrialPruned(f"trial {trial.number} was stopped before it logged {monitor!r}")
            if best is None:
                # every value NaN or inf (on_nonfinite="stop"/"skip"): a trial that failed, the search goes on;
                # an interrupted one (Ctrl-C in a notebook) ends it
                error = ValueError if history.status == "interrupted" else FloatingPointError
                raise error(
                    f"Trial {trial.number} never logged a finite {monitor!r} (status {history.status}); "
                    f"logged keys: {history.keys()}."
                )
            state = "complete"
            return float(best[monitor])
        except optuna.TrialPruned:
            state = "pruned"
            raise
        except caught as exc:
            trial.set_user_attr("nbtrainer_error", f"{type(exc).__name__}: {exc}")
            raise
        finally:
            for cb in [*extra, pruning]:
                trainer.callbacks.remove(cb)
            run_id = trainer.run_id
            if run_id is not None:
                trial.set_user_attr("nbtrainer_run_id", run_id)
            if recorder is not None and recorder.store is not None and run_id is not None:
                _set_tag(recorder, run_id, "optuna.state", state)

    study.optimize(objective, n_trials=n_trials, callbacks=list(study_callbacks), catch=caught)
    return study


def _check_catch(catch: Any) -> tuple[type[BaseException], ...]:
    classes = catch if isinstance(catch, tuple) else (catch,)
    if not all(isinstance(c, type) and issubclass(c, BaseException) for c in classes):
        raise TypeError(
            "catch must be an exception class or a tuple of them, e.g. catch=(RuntimeError, ValueError), "
            f"got {catch!r}."
        )
    return classes


def _set_tag(recorder: RunRecorder, run_id: str, key: str, value: Any) -> None:
    store = recorder.store
    assert store is not None
    store.flush()
    rows = store.query("SELECT tags FROM runs WHERE id=?", (run_id,))
    if not rows:
        return
    import json

    tags = json.loads(rows[0][0] or "{}")
    tags[key] = value
    text = dumps(tags)
    store.write([lambda conn: conn.execute("UPDATE runs SET tags=? WHERE id=?", (text, run_id))])
