"""``Samples``: what the model produces, taken at optimizer-step boundaries and kept in the History.

A consumer of the event stream like the History and the progress bar: it calls the user's ``fn(model)`` at the
fit's start (the step-0 baseline), after every ``every_n_steps``-th optimizer step and at the end of every
``every_n_epochs``-th epoch, inside :func:`~nbtrainer._look._side.side_pass` (eval mode, ``no_grad``, the run's
autocast; training flags and every random generator restored), so the run trains exactly as it would without it.
Values become ``history.samples`` entries ``{"step", "epoch", "name", "kind", "value"}``: ``kind`` ``"text"`` (a
``str``) or ``"image"`` (PNG bytes, ``_images``). The seconds spent are the epoch row's ``sample_time``.

A ``fn`` that raises during the run is reported (a ``sample_error`` event: the History, the progress lines, the
panel) and the run goes on. What can be told before the first step is refused then: ``fn`` not callable, no
schedule, and a value of a type that cannot be shown (``fn`` is called once at the fit's start for that, also with
``at_start=False``, which then keeps nothing of that call).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from nbtrainer._dist._placement import unwrap_model
from nbtrainer._look._images import IMAGE_TYPES, is_pil, to_png
from nbtrainer._look._side import side_pass

if TYPE_CHECKING:
    from nbtrainer._loop._host import LoopHost

__all__ = ["SampleTypeError", "Samples", "sample_entries"]

log = logging.getLogger(__name__)


class SampleTypeError(TypeError):
    """A sample function returned something that is neither text nor an image."""


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)} ({value.dtype})"
    shape = getattr(value, "shape", None)
    if shape is not None:
        return f"a {type(value).__name__} of shape {tuple(shape)}"
    return f"a {type(value).__name__}"


def sample_entries(value: Any, name: str | None = None) -> list[tuple[str, str, Any]]:
    """``(name, kind, value)`` per sample in what ``fn`` returned: a ``str`` (kind ``"text"``), an image (kind
    ``"image"``, PNG bytes), or a dict (named by its keys) / list (``name[i]``) of those.

    Example:
        >>> [(n, k) for n, k, _ in sample_entries({"prompt 1": "once upon", "noise": torch.rand(8, 8)})]
        [('prompt 1', 'text'), ('noise', 'image')]
    """
    base = name or "sample"
    if isinstance(value, dict):
        items = [(f"{name}/{key}" if name else str(key), v) for key, v in value.items()]
    elif isinstance(value, (list, tuple)):
        items = [(f"{base}[{i}]", v) for i, v in enumerate(value)]
    else:
        items = [(base, value)]
    out: list[tuple[str, str, Any]] = []
    for item_name, item in items:
        if isinstance(item, str):
            out.append((item_name, "text", item))
            continue
        png = to_png(item) if isinstance(item, torch.Tensor) or is_pil(item) or hasattr(item, "__array__") else None
        if png is None:
            raise SampleTypeError(
                f"Samples: the sample {item_name!r} is {_describe(item)}, which cannot be shown. A sample is a str, "
                f"{IMAGE_TYPES}; fn may return a dict of named samples or a list of them."
            )
        out.append((item_name, "image", png))
    return out


def _positive(name: str, value: Any) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"Samples({name}=...) takes an int >= 1 or None, got {value!r}.")
    return value


class Samples:
    """Look at what the model produces while it trains: text, images, or named sets of them.

    Args:
        fn: ``fn(model) -> value``: a ``str``; an image (a tensor ``(C, H, W)`` or ``(H, W)``, float in [0, 1] or
            uint8; a NumPy array; a PIL image); or a dict of named values of those kinds, or a list of them. Called
            between optimizer steps, the model in eval mode under ``torch.no_grad()`` and the run's autocast;
            its training mode and the random generators are restored afterwards (the run's weights and data order
            equal a run without ``Samples``, bit for bit).
        every_n_steps: also sample after every n-th optimizer step.
        every_n_epochs: sample at the end of every n-th epoch (default 1).
        at_start: take a step-0 baseline before the first optimizer step.
        name: the sample's name (a dict's keys are prefixed with ``name/``); default ``"sample"``.

    Samples land in ``history.samples`` as ``{"step", "epoch", "name", "kind": "text" | "image", "value"}`` (images
    as PNG bytes; the baseline has step 0 and epoch 0). They are saved in checkpoints, kept by the run store and
    shown in the panel's samples section and in the History's HTML report; the seconds spent are the epoch row's
    ``sample_time``. A ``fn`` that raises is reported (``history.events``, kind ``sample_error``) and training goes
    on.

    Example:
        >>> import torch
        >>> from nbtrainer import Samples, Trainer
        >>> model = torch.nn.Linear(4, 2)
        >>> probe = torch.randn(1, 4)
        >>> samples = Samples(lambda m: f"logits {m(probe).tolist()}", every_n_epochs=1)
        >>> trainer = Trainer(model, torch.nn.CrossEntropyLoss(), "sgd", callbacks=[samples], progress=False)
        >>> history = trainer.fit([(torch.randn(8, 4), torch.randint(0, 2, (8,)))] * 2, epochs=2)
        >>> [(s["step"], s["kind"]) for s in history.samples]
        [(0, 'text'), (2, 'text'), (4, 'text')]
    """

    def __init__(
        self,
        fn: Callable[[torch.nn.Module], Any],
        *,
        every_n_steps: int | None = None,
        every_n_epochs: int | None = 1,
        at_start: bool = True,
        name: str | None = None,
    ) -> None:
        if not callable(fn):
            raise TypeError(
                f"Samples(fn) takes a function fn(model) -> a str, an image, or a dict / list of them; got "
                f"{type(fn).__name__}."
            )
        self.every_n_steps = _positive("every_n_steps", every_n_steps)
        self.every_n_epochs = _positive("every_n_epochs", every_n_epochs)
        if self.every_n_steps is None and self.every_n_epochs is None:
            raise ValueError(
                "Samples(every_n_steps=None, every_n_epochs=None) would never sample: give every_n_epochs=N "
                "(at the end of every N-th epoch) or every_n_steps=N (after every N-th optimizer step)."
            )
        if not isinstance(at_start, bool):
            raise TypeError(f"Samples(at_start=...) takes True or False, got {at_start!r}.")
        if name is not None and not isinstance(name, str):
            raise TypeError(f"Samples(name=...) takes a str or None, got {type(name).__name__}.")
        self.fn, self.at_start, self.name = fn, at_start, name
        self.seconds = 0.0  # spent sampling since the last epoch row (its sample_time)
        self._last_step: int | None = None
        # scheduled: on_optimizer_step only at the sampled steps, not a call per step (nbtrainer._events._stream)
        self.next_optimizer_step: int | None = self.every_n_steps

    # -- the event stream -------------------------------------------------------------------------
    def on_fit_start(self, trainer: LoopHost) -> None:
        self.seconds, self._last_step = 0.0, None
        self._schedule(trainer.global_step)
        if trainer.global_step == 0:  # a fresh run (a resumed one has its baseline in the History)
            self._take(trainer, epoch=0, keep=self.at_start, strict=True)

    def on_optimizer_step(self, trainer: LoopHost, step: int, skipped: bool) -> None:
        n = self.every_n_steps
        if n is not None and step % n == 0:
            self._take(trainer, epoch=trainer.current_epoch)
        self._schedule(step)

    def _schedule(self, step: int) -> None:
        n = self.every_n_steps
        self.next_optimizer_step = (step // n + 1) * n if n is not None else None

    def on_epoch_end(self, trainer: LoopHost, epoch: int, logs: dict[str, Any]) -> None:
        n = self.every_n_epochs
        if n is not None and epoch % n == 0 and self._last_step != trainer.global_step:
            self._take(trainer, epoch=epoch)
        logs["sample_time"] = logs.get("sample_time", 0.0) + self.seconds  # several Samples: their sum
        self.seconds = 0.0

    # -- taking one --------------------------------------------------------------------------------
    def _take(self, trainer: LoopHost, *, epoch: int, keep: bool = True, strict: bool = False) -> None:
        # Under FSDP every rank must run the forward (it gathers the shards); elsewhere rank 0 alone does.
        sharded = trainer.strategy.shards_parameters
        if not trainer.is_global_zero and not sharded:
            return
        step = trainer.global_step
        self._last_step = step
        model = unwrap_model(trainer.model)
        start = time.perf_counter()
        try:
            with side_pass(model, trainer.batch_steps.autocast()):
                entries = sample_entries(self.fn(model), self.name)  # images encoded here: no autograd, no autocast
        except SampleTypeError as exc:
            if strict:  # before the first step: a clear error, the run does not start
                raise SampleTypeError(str(exc)) from None
            self._report(trainer, step, epoch, exc)
            return
        except Exception as exc:
            log.debug("a sample failed: reported as an on_control event, the run goes on", exc_info=True)
            self._report(trainer, step, epoch, exc)
            return
        finally:
            self.seconds += time.perf_counter() - start
        if keep and trainer.is_global_zero:
            add = trainer.history.add_sample
            for name, kind, value in entries:
                add(step=step, epoch=epoch, name=name, kind=kind, value=value)

    def _report(self, trainer: LoopHost, step: int, epoch: int, exc: Exception) -> None:
        what = self.name or getattr(self.fn, "__name__", "sample")
        error = f"{type(exc).__name__}: {exc}"
        event = {"step": step, "epoch": epoch, "kind": "sample_error", "old": what, "new": error}
        trainer.callbacks.call("on_control", trainer=trainer, event=event)  # History, progress lines, panel, stores
