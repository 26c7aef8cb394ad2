"""The Trainer's flat interface over its option groups: the keywords of ``Trainer(...)`` as one typed list
(:class:`TrainerKeywords`), the ``TypeError`` for an unknown keyword that names the closest valid one
(:func:`unknown_keyword`, :func:`checked_keywords` for a method's), and the attributes that read one field of a group
(:class:`Option`: ``trainer.grad_accum_steps`` is ``trainer.options.step.grad_accum_steps``).

Each keyword is a field of one option group of ``nbtrainer._options`` (which documents it) or one of the objects the
Trainer holds (``TrainerParts``); ``tests/trainer/test_public_api.py`` holds the list.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypedDict, TypeVar, overload

if TYPE_CHECKING:
    import os

    import torch
    from torchmetrics import MetricCollection

__all__ = ["KEYWORDS", "Option", "TrainerKeywords", "checked_keywords", "unknown_keyword"]


class TrainerKeywords(TypedDict, total=False):
    """The keyword arguments of ``Trainer(...)`` after ``model, criterion, optimizer`` (each is a field of one group
    of :class:`TrainerOptions`, or one of :class:`TrainerParts`; the groups say what each does)."""

    scheduler: Any
    scheduler_interval: str
    scheduler_monitor: str | None
    metrics: Mapping[str, Any] | MetricCollection | None
    callbacks: Iterable[Any]
    precision: str | None
    grad_accum_steps: int
    max_grad_norm: float | None
    device: str | torch.device
    seed: int | None
    deterministic: bool
    progress: Any
    num_inputs: int | None
    target_keys: Sequence[str] | str | None
    compute_loss: Callable[..., Any] | None
    predict_step: Callable[..., Any] | None
    refresh_interval: float
    timing_every: int
    val_every_n_epochs: int
    non_blocking: bool
    lr: float | None
    activation_checkpointing: Any
    trainable: str | Sequence[str] | None
    freeze: str | Sequence[str] | None
    compile: bool | str | dict[str, Any]
    channels_last: bool
    on_nonfinite: str
    strategy: Any
    fast_fetch: bool
    data_on_device: float
    quantize: str | None
    lora: Any
    save_base: bool
    offload_activations: bool
    offload_optimizer: bool
    optimizer_in_backward: bool
    chunked_loss: bool | int
    attention: str
    run_store: str | os.PathLike[str] | bool | None
    memory_budget_gb: float | None
    training_step: Callable[..., Any] | None
    validation_step: Callable[..., Any] | None
    check_data: bool | int


#: Every keyword ``Trainer(...)`` takes, the three positional ones first (``Trainer.KEYWORDS``).
KEYWORDS: tuple[str, ...] = ("model", "criterion", "optimizer", *TrainerKeywords.__annotations__)


def unknown_keyword(call: str, name: str, valid: Iterable[str]) -> TypeError:
    """The ``TypeError`` for an unknown keyword, naming the closest valid one.

    Example:
        >>> str(unknown_keyword("Trainer", "precison", KEYWORDS))
        "Trainer() got an unexpected keyword argument 'precison'. Did you mean 'precision'?"
    """
    valid = list(valid)
    close = difflib.get_close_matches(name, valid, n=1, cutoff=0.6)
    if not close:  # a prefix or a part of a name (``callback`` -> ``callbacks``, ``accum`` -> ``grad_accum_steps``)
        close = [v for v in valid if name in v or v in name][:1]
    hint = f" Did you mean {close[0]!r}?" if close else f" The keywords are: {', '.join(sorted(valid))}."
    return TypeError(f"{call}() got an unexpected keyword argument {name!r}.{hint}")


P = ParamSpec("P")
R = TypeVar("R")


def checked_keywords(fn: Callable[P, R]) -> Callable[P, R]:
    """A method whose unknown keyword raises the ``TypeError`` of :func:`unknown_keyword` (naming the closest valid
    one) instead of Python's, which names none (``fit(epoch=3)``)."""
    names = [n for n in inspect.signature(fn).parameters if n != "self"]
    valid, call = frozenset(names), fn.__name__

    @functools.wraps(fn)
    def checked(*args: P.args, **kwargs: P.kwargs) -> R:
        for name in kwargs:
            if name not in valid:
                raise unknown_keyword(call, name, names)
        return fn(*args, **kwargs)

    return checked


T = TypeVar("T")


class Option(Generic[T]):
    """A Trainer attribute that is one field of one option group (``trainer.grad_accum_steps`` is
    ``trainer.options.step.grad_accum_steps``): read from the group; assigned, the group is replaced, so the group
    stays the only copy. An option with a setter (``via``: the owner's method name, or a function of the owner and
    the value) is assigned through it, so that ``trainer.precision = "fp16-mixed"`` takes ``set_precision``'s checks
    and makes its GradScaler instead of only replacing the group.

    Example:
        >>> from nbtrainer._options import TrainerOptions
        >>> class Holder:
        ...     grad_accum_steps: Option[int] = Option("step")
        ...     def __init__(self):
        ...         self.options = TrainerOptions()
        >>> h = Holder(); h.grad_accum_steps = 2
        >>> h.options.step.grad_accum_steps
        2
    """

    __slots__ = ("_get", "group", "name", "via")

    def __init__(self, group: str, via: str | Callable[[Any, Any], Any] | None = None) -> None:
        self.group = group
        self.via = via
        self.name = ""
        self._get: Callable[[Any], Any] = operator.attrgetter("options")

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name
        self._get = operator.attrgetter(f"options.{self.group}.{name}")  # one C call: as fast as a plain property

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Option[T]: ...
    @overload
    def __get__(self, obj: object, owner: type | None = None) -> T: ...
    def __get__(self, obj: object, owner: type | None = None) -> Option[T] | T:
        if obj is None:
            return self
        value: T = self._get(obj)
        return value

    def __set__(self, obj: Any, value: T) -> None:
        via = self.via
        if via is None:
            obj.options = obj.options.replace(self.group, **{self.name: value})
        elif isinstance(via, str):
            getattr(obj, via)(value)
        else:
            via(obj, value)
