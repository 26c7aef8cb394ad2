"""The panel's two call forms: a model with its criterion and optimizer (the panel builds the Trainer), or a
built Trainer (steered as configured). Both are checked here, before a widget is made."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nbtrainer import Trainer, as_loaders

__all__ = ["USAGE", "PanelArgs", "check_keywords", "parse_panel_args"]

USAGE = (
    "TrainerWidget(model, criterion, optimizer, train_loader, val_loader=None, *, metrics=None, epochs=1, "
    "**trainer_options) or TrainerWidget(trainer, train_loader, val_loader=None, epochs=1); arrays as for "
    "Trainer.fit: TrainerWidget(model, criterion, optimizer, (x, y), (x_val, y_val), batch_size=32)"
)


def check_keywords(options: dict[str, Any], panel: Any) -> None:
    """Refuse a keyword that is neither the panel's nor the Trainer's, naming the closest valid one: a misspelt
    option must not reach ``Trainer(...)`` as a bare ``unexpected keyword argument``.

    Example:
        >>> check_keywords({"grad_accumulation_steps": 2}, lambda self, epochs=1: None)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        TypeError: ... argument 'grad_accumulation_steps'; did you mean 'grad_accum_steps'? ...
    """
    import difflib
    import inspect

    panel_keywords = inspect.signature(panel).parameters  # TrainerWidget.__init__: the panel's own options
    trainer_keywords = inspect.signature(Trainer.__init__).parameters
    valid = sorted({*panel_keywords, *trainer_keywords} - {"self", "model", "args", "trainer_options"})
    for key in options:
        if key not in valid:
            close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else "."
            raise TypeError(
                f"TrainerWidget() got an unexpected keyword argument {key!r}{hint} It takes the panel's own options "
                f"and any Trainer option; valid keywords: {', '.join(valid)}."
            )


@dataclass
class PanelArgs:
    """What a panel is made of, whichever form it was called in.

    Example:
        >>> a = parse_panel_args(model, (criterion, optimizer, loader), epochs=2)  # doctest: +SKIP
        >>> a.trainer, a.model, a.train_loader  # doctest: +SKIP
    """

    trainer: Trainer
    model: Any  # the user's model (a Trainer given over a torch.compile'd model: the model it wraps)
    build: tuple[Any, ...] | None  # model form: (criterion, optimizer, metrics, options) to rebuild from
    train_loader: Any
    val_loader: Any
    #: arrays (or a Dataset) given: the panel's own train loader of them at another batch size (a memory plan row's
    #: micro-batch); None: the train loader was given, and is not the panel's to change
    rebatch: Callable[[int], Any] | None = None


def parse_panel_args(
    model: Any,
    args: tuple[Any, ...],
    *,
    train_loader: Any = None,
    val_loader: Any = None,
    batch_size: int | None = None,
    shuffle: bool | None = None,
    metrics: Any = None,
    epochs: int = 1,
    trainer_options: dict[str, Any] | None = None,
    panel: Any = None,
) -> PanelArgs:
    """Check the arguments of ``TrainerWidget(...)`` and build the Trainer of the model form. Arrays become the
    loaders ``Trainer.fit`` would make of them (``batch_size``, ``shuffle``), once: every part of the panel (the
    data check, the batch preview, the LR finder, each run) then reads the same loaders.

    Raises:
        TypeError: arguments of neither form (with both forms spelled out); a keyword neither the panel nor the
            Trainer takes (with the closest valid one).
        ValueError: ``epochs`` is not a positive int, or the Trainer has no optimizer (with the fix).
    """
    options = dict(trainer_options or {})
    if panel is not None:
        check_keywords(options, panel)
    build: tuple[Any, ...] | None
    if isinstance(model, Trainer):
        if metrics is not None or options:
            raise TypeError(
                "TrainerWidget(trainer, ...) uses the trainer as configured; pass metrics and "
                f"options to Trainer(...). Got {sorted(options) or ['metrics']}. {USAGE}"
            )
        if len(args) > 2:
            raise TypeError(f"Too many positional arguments. {USAGE}")
        trainer, user_model = model, getattr(model.model, "_orig_mod", model.model)  # torch.compile
        build = None  # a built Trainer: the memory savers cannot rebuild it
    else:
        if len(args) < 2 or len(args) > 4:
            raise TypeError(f"Expected criterion, optimizer and train_loader after the model. {USAGE}")
        criterion, optimizer, *loaders = args
        args = tuple(loaders)
        options.setdefault("check_data", True)  # the panel checks the data (its lights show before Start)
        trainer = Trainer(model, criterion, optimizer, metrics=metrics, **options)
        user_model = model
        build = (criterion, optimizer, metrics, options)
    train_loader = args[0] if len(args) > 0 else train_loader
    val_loader = args[1] if len(args) > 1 else val_loader
    if train_loader is None:
        raise TypeError(f"train_loader is required. {USAGE}")
    data = train_loader
    train_loader, val_loader = as_loaders(
        train_loader, val_loader, batch_size=batch_size, shuffle=shuffle, caller="TrainerWidget"
    )

    def rebatch(size: int) -> Any:
        return as_loaders(data, batch_size=size, shuffle=shuffle, caller="TrainerWidget")[0]

    if not isinstance(epochs, int) or isinstance(epochs, bool) or epochs < 1:
        raise ValueError(f"epochs must be an int >= 1, got {epochs!r}.")
    if trainer.optimizer is None:
        raise ValueError(
            "TrainerWidget trains, and this Trainer was built with optimizer=None (evaluate / predict only). "
            "Pass an optimizer, e.g. Trainer(model, criterion, torch.optim.AdamW(model.parameters(), lr=1e-3)); "
            "for evaluation alone call trainer.evaluate(loader) without a panel."
        )
    return PanelArgs(trainer, user_model, build, train_loader, val_loader, None if train_loader is data else rebatch)
