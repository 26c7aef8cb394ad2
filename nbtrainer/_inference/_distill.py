"""Knowledge distillation as a criterion: a frozen teacher's softened outputs teach the student (Hinton et al.).

``DistillationLoss`` is an ordinary ``criterion(outputs, targets)``. The teacher needs the student's *inputs*,
which a criterion never sees: a forward hook on the student keeps a reference to the last call's inputs and
outputs, and the criterion runs the teacher on those inputs when it is handed those outputs (lazily, so
``predict`` never runs the teacher). The ``Trainer`` calls :meth:`DistillationLoss.bind_trainer` once its model is
set up (it places the teacher on the trainer's device and adds the loss parts and the agreement as metrics);
outside a Trainer, :meth:`DistillationLoss.attach` the student yourself. The teacher runs inside the trainer's
autocast (its precision), under ``no_grad``, in ``eval()``; it is not a submodule of the loss, so nothing saves
it, moves it or counts it with the student.
"""

from __future__ import annotations

import math
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from nbtrainer._inference._logits import logits_of

__all__ = ["DistillationLoss"]

_STOCHASTIC = (nn.modules.dropout._DropoutNd, nn.modules.batchnorm._BatchNorm)


def _forget(module: nn.Module, args: tuple, kwargs: dict[str, Any], output: Any) -> None:
    """What a pickled student's hook becomes: nothing (a saved student does not drag its teacher along)."""


class _Remember:
    """The forward hook on the student: the last call's inputs and outputs, for the teacher.

    It holds the loss weakly and is not copied with the student (``quantize_model``'s deep copy would otherwise
    copy the loss and its teacher too), nor pickled with it."""

    def __init__(self, loss: DistillationLoss) -> None:
        self.loss = weakref.ref(loss)

    def __call__(self, module: nn.Module, args: tuple, kwargs: dict[str, Any], output: Any) -> None:
        loss = self.loss()
        if loss is not None:
            loss._seen = [output, args, kwargs, None, None]

    def __deepcopy__(self, memo: dict[int, Any]) -> _Remember:
        return self

    def __reduce__(self) -> Any:
        return (_forget_hook, ())


def _forget_hook() -> Callable[..., None]:
    return _forget


class DistillationLoss(nn.Module):
    """``kd_weight * T² * KL(softmax(t/T) ‖ softmax(s/T)) + (1 - kd_weight) * base(s, y)``, usable as a Trainer's
    ``criterion``.

    ``s`` are the student's logits, ``t`` the teacher's on the same inputs, ``T`` the temperature; the KL term is
    ``F.kl_div(log_softmax(s/T), softmax(t/T), reduction="batchmean")`` over the last dimension (sequence outputs
    are averaged per position), and ``T²`` keeps its gradient scale independent of ``T``. The history shows the
    parts, ``kd_loss`` (``T² * KL``) and ``base_loss``, so that ``loss = kd_weight * kd_loss + (1 - kd_weight) *
    base_loss``, and ``agreement``: the fraction of samples where student and teacher pick the same class.

    Args:
        teacher: the trained model; switched to ``eval()`` (said once if it has dropout or batch norm) and frozen
            (``requires_grad_(False)``). It runs on the student's inputs, under the trainer's precision, and is
            moved once to the trainer's device. Hugging Face outputs (``.logits``) work for both models.
        temperature: ``T > 0``; higher softens both distributions (2 to 5 is usual).
        kd_weight: weight of the distillation term in ``[0, 1]``; ``1`` ignores the labels.
        base: the loss on the labels, called as ``base(student_logits, targets)``.

    Example:
        >>> import torch
        >>> from nbtrainer import DistillationLoss, Trainer
        >>> teacher, student = torch.nn.Linear(8, 3), torch.nn.Linear(8, 3)
        >>> loss = DistillationLoss(teacher, temperature=2.0, kd_weight=0.7)
        >>> trainer = Trainer(student, loss, torch.optim.SGD(student.parameters(), lr=0.1), progress=False)
        >>> history = trainer.fit([(torch.randn(16, 8), torch.randint(0, 3, (16,)))], epochs=1)
        >>> sorted(k for k in history.epochs[0] if k in ("kd_loss", "base_loss", "agreement"))
        ['agreement', 'base_loss', 'kd_loss']
    """

    def __init__(
        self,
        teacher: nn.Module,
        *,
        temperature: float = 2.0,
        kd_weight: float = 0.5,
        base: Callable[..., torch.Tensor] = nn.CrossEntropyLoss(),  # noqa: B008 - stateless, the issue's signature
    ) -> None:
        super().__init__()
        if not isinstance(teacher, nn.Module):
            raise TypeError(f"teacher must be a torch.nn.Module (the trained model), got {type(teacher).__name__}.")
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature > 0:
            raise ValueError(
                f"temperature must be a number > 0, got {temperature!r}. 1 keeps the teacher's probabilities as "
                "they are; 2 to 5 softens them (the usual choice)."
            )
        if not math.isfinite(temperature):
            raise ValueError(f"temperature must be finite, got {temperature!r}.")
        if isinstance(kd_weight, bool) or not isinstance(kd_weight, (int, float)) or not 0 <= kd_weight <= 1:
            raise ValueError(
                f"kd_weight must be a number in [0, 1], got {kd_weight!r}: the weight of the distillation term "
                "(1 - kd_weight goes to the base loss on the labels), e.g. 0.5."
            )
        if not callable(base):
            raise TypeError(f"base must be a loss function base(logits, targets), got {type(base).__name__}.")
        self.temperature = float(temperature)
        self.kd_weight = float(kd_weight)
        self.base = base
        # Not a submodule: criterion.to()/.train()/.state_dict() and anything that walks modules leave it alone.
        self.__dict__["teacher"] = teacher
        self._said_eval = False
        self._freeze_teacher()
        self._hooked: weakref.WeakSet[nn.Module] = weakref.WeakSet()
        # (student outputs, args, kwargs, teacher logits | None, parts | None) of the student's last forward
        self._seen: list[Any] | None = None

    teacher: nn.Module

    # -- the teacher ---------------------------------------------------------------------------------
    def _freeze_teacher(self) -> None:
        teacher = self.teacher
        if teacher.training:
            stochastic = sorted({type(m).__name__ for m in teacher.modules() if isinstance(m, _STOCHASTIC)})
            teacher.eval()
            if stochastic and not self._said_eval:
                self._said_eval = True
                warnings.warn(
                    f"The teacher was in training mode with {', '.join(stochastic)}: DistillationLoss switched it "
                    "to eval() (a teacher must give the same outputs for the same inputs). Call teacher.eval() "
                    "before building the loss to silence this.",
                    UserWarning,
                    stacklevel=3,
                )
        teacher.requires_grad_(False)

    def attach(self, student: nn.Module) -> DistillationLoss:
        """Watch ``student``'s forward calls (the Trainer does this for its model); returns ``self``.

        Example:
            >>> import torch
            >>> from nbtrainer import DistillationLoss
            >>> teacher, student = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
            >>> loss = DistillationLoss(teacher).attach(student)
            >>> x, y = torch.randn(5, 4), torch.randint(0, 3, (5,))
            >>> loss(student(x), y).ndim
            0
        """
        if not isinstance(student, nn.Module):
            raise TypeError(f"attach() takes the student model, got {type(student).__name__}.")
        if student is self.teacher:
            raise ValueError("The student and the teacher are the same model: distill into a new, smaller model.")
        shared = {id(p) for p in self.teacher.parameters()} & {id(p) for p in student.parameters()}
        if shared:
            raise ValueError(
                f"The student and the teacher share {len(shared)} parameter tensors: DistillationLoss freezes the "
                "teacher, which would freeze them in the student too. Distill into a separate model "
                "(copy.deepcopy the teacher to start from its weights)."
            )
        if student not in self._hooked:
            student.register_forward_hook(_Remember(self), with_kwargs=True)
            self._hooked.add(student)
        return self

    def bind_trainer(self, trainer: Any) -> dict[str, Callable[[Any, Any], torch.Tensor]]:
        """Called by the ``Trainer`` once its model is set up: watch the model, move the teacher to the trainer's
        device (once) and return the metrics to log (``kd_loss``, ``base_loss``, ``agreement``)."""
        self.attach(trainer.model)
        device = trainer.device
        if any(p.device != device for p in self.teacher.parameters()):
            self.teacher.to(device)
        self.to(device)  # the base loss's buffers (class weights), if any
        return {"kd_loss": self._kd_metric, "base_loss": self._base_metric, "agreement": self._agreement}

    def _teacher_logits(self, outputs: Any, student: torch.Tensor) -> torch.Tensor:
        seen = self._seen
        if seen is None or not (seen[0] is outputs or logits_of(seen[0]) is student):
            raise RuntimeError(
                "DistillationLoss did not see the student produce these outputs, so it cannot run the teacher on "
                "the same inputs. Pass it as the Trainer's criterion (which attaches it), or call "
                "loss.attach(student) once and compute the loss right after student(inputs)."
            )
        if seen[3] is None:
            if self.teacher.training:  # switched back to train() since: outputs must not vary between calls
                self._freeze_teacher()
            with torch.no_grad():
                teacher = logits_of(self.teacher(*seen[1], **seen[2]), who="The teacher")
            if teacher.shape != student.shape:
                raise ValueError(
                    f"The teacher's outputs have shape {tuple(teacher.shape)}, the student's "
                    f"{tuple(student.shape)}: distillation compares them class by class. Give the student the "
                    "teacher's output layer size (the same classes, in the same order)."
                )
            seen[3] = teacher.detach()
        return seen[3]

    # -- the loss ------------------------------------------------------------------------------------
    def _parts(self, outputs: Any, targets: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        student = logits_of(outputs, who="The student")
        teacher = self._teacher_logits(outputs, student)
        t = self.temperature
        classes = student.shape[-1]
        # float32 for the soft targets whatever the autocast dtype: bf16 softmax at T > 1 loses the small tails
        log_p = F.log_softmax(student.float().reshape(-1, classes) / t, dim=-1)
        q = F.softmax(teacher.float().reshape(-1, classes) / t, dim=-1)
        kd = F.kl_div(log_p, q, reduction="batchmean") * (t * t)
        if targets is None:
            if self.kd_weight < 1:
                raise ValueError(
                    "The batch has no targets for the base loss. Yield (inputs, targets), or use "
                    "kd_weight=1.0 to learn from the teacher alone."
                )
            return kd, None
        return kd, self.base(student, targets)

    def forward(self, outputs: Any, targets: Any = None) -> torch.Tensor:
        kd, base = self._parts(outputs, targets)
        seen = self._seen
        if seen is not None:
            seen[4] = (kd.detach(), None if base is None else base.detach())
        if base is None:
            return kd
        return self.kd_weight * kd + (1.0 - self.kd_weight) * base

    def extra_repr(self) -> str:
        return f"teacher={type(self.teacher).__name__}, temperature={self.temperature:g}, kd_weight={self.kd_weight:g}"

    # -- metrics (called after the loss on the same outputs: they read what it computed) ---------------
    def _cached_parts(self, outputs: Any, targets: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        seen = self._seen
        if seen is not None and seen[4] is not None and seen[0] is outputs:
            return seen[4]
        with torch.no_grad():
            kd, base = self._parts(outputs, targets)
        return kd, base

    def _kd_metric(self, outputs: Any, targets: Any) -> torch.Tensor:
        return self._cached_parts(outputs, targets)[0]

    def _base_metric(self, outputs: Any, targets: Any) -> torch.Tensor:
        base = self._cached_parts(outputs, targets)[1]
        return base if base is not None else torch.full((), float("nan"))

    def _agreement(self, outputs: Any, targets: Any) -> torch.Tensor:
        student = logits_of(outputs, who="The student")
        teacher = self._teacher_logits(outputs, student)
        return (student.argmax(-1) == teacher.argmax(-1)).float().mean()
