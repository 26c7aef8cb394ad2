"""Knowledge distillation as a criterion: a frozen teacher's softened outputs teach the student (Hinton et al.).

``DistillationLoss`` is an ordinary ``criterion(outputs, targets)``. The teacher needs the student's *inputs*,
which a criterion never sees: a forward hook on the student keeps a reference to the last call's inputs and
outputs, and the criterion runs the teacher on those inputs when it is handed those outputs (lazily, so
``predict`` never runs the teacher). The ``Trainer`` calls :meth:`DistillationLoss.bind_trainer` once its model is
set up (it places the teacher on the trainer's device and adds the loss parts and the agreement as metrics);
outside a Trainer, :meth:`DistillationLoss.attach` the student yourself. The teacher runs inside the trainer's
autocast (its precision), under ``no_grad``, in ``eval()``; it is not a submodule of the loss, so nothing saves
it, moves it or counts it with the student.

Feature distillation (``features={"student layer": "teacher layer"}``) adds the MSE between the outputs of named
layers of the same shape (DistilBERT's setting: the teacher's width, fewer layers). A learned projection between
different widths is left out on purpose: its weights would belong to neither model, so no optimizer built from
the student and no checkpoint of it would hold them.
"""

from __future__ import annotations

import math
import warnings
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._pytree import tree_map_only

from nbtrainer._dist._placement import unwrap_model
from nbtrainer._inference._logits import logits_of
from nbtrainer._look._per_item import is_causal_lm

if TYPE_CHECKING:
    from nbtrainer._trainer._trainer import Trainer

__all__ = ["DistillationLoss"]

_STOCHASTIC = (nn.modules.dropout._DropoutNd, nn.modules.batchnorm._BatchNorm)


def _forget(module: nn.Module, args: tuple, kwargs: dict[str, Any], output: Any) -> None:
    """What a pickled student's hook becomes: nothing (a saved student does not drag its teacher along)."""


def _first_tensor(output: Any) -> torch.Tensor | None:
    if isinstance(output, torch.Tensor):
        return output
    values = output.values() if isinstance(output, Mapping) else output if isinstance(output, (tuple, list)) else ()
    return next((v for v in values if isinstance(v, torch.Tensor)), None)


def _detached(value: torch.Tensor | None) -> torch.Tensor | None:
    return None if value is None else value.detach()


@dataclass
class _Seen:
    """The student's last forward call, and what the loss computed from it."""

    outputs: Any
    args: tuple
    kwargs: dict[str, Any]
    features: dict[str, torch.Tensor | None]  # named student layers' outputs (feature distillation)
    teacher: torch.Tensor | None = None  # the teacher's logits on ``args, kwargs``
    teacher_features: dict[str, torch.Tensor | None] = field(default_factory=dict)
    parts: tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None] | None = None  # kd, base, feature losses


class _Remember:
    """A forward hook that reports to the loss: the student's inputs and outputs (``role="student"``), or the
    output of a named layer (``"student:NAME"``, ``"teacher:NAME"``) for feature distillation.

    It holds the loss weakly and is not copied with the model (``quantize_model``'s deep copy would otherwise
    copy the loss and its teacher too), nor pickled with it."""

    def __init__(self, loss: DistillationLoss, module: nn.Module, role: str = "student") -> None:
        self.loss = weakref.ref(loss)
        self.role = role
        self.handle = module.register_forward_hook(self, with_kwargs=True)

    def __call__(self, module: nn.Module, args: tuple, kwargs: dict[str, Any], output: Any) -> None:
        loss = self.loss()
        if loss is not None:
            loss._observe(self.role, args, kwargs, output)
        else:  # the loss is gone (a notebook cell re-run builds a new one): nothing to report to any more
            self.handle.remove()

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
    are averaged per position, leaving out positions labelled with the base loss's ``ignore_index``, -100:
    padding), and ``T²`` keeps its gradient scale independent of ``T``. The history shows the
    parts, ``kd_loss`` (``T² * KL``) and ``base_loss``, so that ``loss = kd_weight * kd_loss + (1 - kd_weight) *
    base_loss``, and ``agreement``: the fraction of samples where student and teacher pick the same class.

    A causal LM's logits at position ``t`` predict token ``t + 1`` and its labels are the input ids, shifted
    inside its own loss (Hugging Face's convention). For such a student the per-position labels are shifted the
    same way (``labels[:, 1:]`` against ``logits[:, :-1]``): the KD term and ``agreement`` count position ``t``
    where label ``t + 1`` is not ignored, and the default base loss is the model's own causal-LM loss. A ``base``
    of your own gets the logits and labels as they are, and shifts them itself as the model's loss does.

    Args:
        teacher: the trained model; switched to ``eval()`` (said once if it has dropout or batch norm) and frozen
            (``requires_grad_(False)``). It runs on the student's inputs, under the trainer's precision, and is
            moved once to the trainer's device; a teacher kept in another float dtype (bf16, to halve its
            memory) stays in it and gets the inputs in that dtype. Hugging Face outputs (``.logits``) work for both
            models.
        temperature: ``T > 0``; higher softens both distributions (2 to 5 is usual).
        kd_weight: weight of the distillation term in ``[0, 1]``; ``1`` ignores the labels.
        base: the loss on the labels, called as ``base(student_logits, targets)``. The default is
            ``nn.CrossEntropyLoss()``, taken per position for per-position labels (shifted for a causal LM).
        features: optional feature distillation, ``{student layer name: teacher layer name}`` (names as in
            ``named_modules()``): ``feature_weight * mean(MSE(student layer output, teacher layer output))`` is
            added to the loss and logged as ``feature_loss``. The outputs must have the same shape.
        feature_weight: weight of the feature term (>= 0).
        shift_labels: whether per-position labels are shifted by one against the logits (above). None: when the
            student is a causal LM (a Hugging Face model that generates and is not an encoder-decoder); False for
            batches whose labels are already the next tokens; True for a model of your own with Hugging Face's
            convention.

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
        base: Callable[..., torch.Tensor] | None = None,
        features: Mapping[str, str] | None = None,
        feature_weight: float = 1.0,
        shift_labels: bool | None = None,
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
        if base is not None and not callable(base):
            raise TypeError(f"base must be a loss function base(logits, targets), got {type(base).__name__}.")
        if features is not None and (
            not isinstance(features, Mapping)
            or not features
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in features.items())
        ):
            raise TypeError(
                f"features must map student layer names to teacher layer names, e.g. {{'encoder.layer.1': "
                f"'encoder.layer.3'}}, got {features!r}."
            )
        if isinstance(feature_weight, bool) or not isinstance(feature_weight, (int, float)) or not feature_weight >= 0:
            raise ValueError(f"feature_weight must be a number >= 0, got {feature_weight!r}.")
        if shift_labels is not None and not isinstance(shift_labels, bool):
            raise TypeError(f"shift_labels must be True, False or None (decided by the student), got {shift_labels!r}.")
        self.temperature = float(temperature)
        self.kd_weight = float(kd_weight)
        self.base = base if base is not None else nn.CrossEntropyLoss()
        # the default is applied per position (and shifted for a causal LM); a base of one's own gets what it is given
        self._default_base = base is None
        self.shift_labels = shift_labels
        self._shift = bool(shift_labels)  # decided by the student at attach() when shift_labels is None
        self.features = dict(features or {})
        self.feature_weight = float(feature_weight)
        # Not a submodule: criterion.to()/.train()/.state_dict() and anything that walks modules leave it alone.
        self.__dict__["teacher"] = teacher
        self._said_eval = False
        self._freeze_teacher()
        self._hooked: weakref.WeakSet[nn.Module] = weakref.WeakSet()
        self._seen: _Seen | None = None  # the student's last forward
        self._pending: dict[str, torch.Tensor | None] = {}  # student layer outputs of the forward in progress
        self._teacher_pending: dict[str, torch.Tensor | None] = {}
        for name in set(self.features.values()):
            _Remember(self, _layer(teacher, name, "teacher"), f"teacher:{name}")

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
        if self.shift_labels is None:
            self._shift = is_causal_lm(unwrap_model(student))
        if student not in self._hooked:
            layers = [(name, _layer(unwrap_model(student), name, "student")) for name in self.features]
            for name, layer in layers:
                _Remember(self, layer, f"student:{name}")
            _Remember(self, student)
            self._hooked.add(student)
        return self

    def _observe(self, role: str, args: tuple, kwargs: dict[str, Any], output: Any) -> None:
        if role == "student":  # the model's call ends after its layers': their outputs belong to this call
            self._seen = _Seen(output, args, kwargs, self._pending)
            self._pending = {}
        elif role.startswith("student:"):
            self._pending[role[8:]] = _first_tensor(output)
        else:
            self._teacher_pending[role[8:]] = _first_tensor(output)

    def bind_trainer(self, trainer: Trainer) -> dict[str, Callable[[Any, Any], torch.Tensor]]:
        """Called by the ``Trainer`` once its model is set up: watch the model, move the teacher to the trainer's
        device (once) and return the metrics to log (``kd_loss``, ``base_loss``, ``agreement``)."""
        self.attach(trainer.model)
        device = trainer.device
        if any(p.device != device for p in self.teacher.parameters()):
            self.teacher.to(device)
        self.to(device)  # the base loss's buffers (class weights), if any
        metrics: dict[str, Callable[[Any, Any], torch.Tensor]] = {
            "kd_loss": self._kd_metric,
            "base_loss": self._base_metric,
            "agreement": self._agreement,
        }
        if self.features:
            metrics["feature_loss"] = self._feature_metric
        return metrics

    def _teacher_logits(self, outputs: Any, student: torch.Tensor) -> torch.Tensor:
        seen = self._seen
        if seen is None or not (seen.outputs is outputs or logits_of(seen.outputs) is student):
            raise RuntimeError(
                "DistillationLoss did not see the student produce these outputs, so it cannot run the teacher on "
                "the same inputs. Pass it as the Trainer's criterion (which attaches it), or call "
                "loss.attach(student) once and compute the loss right after student(inputs)."
            )
        if seen.teacher is None:
            if self.teacher.training:  # switched back to train() since: outputs must not vary between calls
                self._freeze_teacher()
            self._teacher_pending = {}
            args, kwargs = _in_dtype_of(self.teacher, seen.args, seen.kwargs)
            with torch.no_grad():
                teacher = logits_of(self.teacher(*args, **kwargs), who="The teacher")
            seen.teacher_features, self._teacher_pending = self._teacher_pending, {}
            if teacher.shape != student.shape:
                raise ValueError(
                    f"The teacher's outputs have shape {tuple(teacher.shape)}, the student's "
                    f"{tuple(student.shape)}: distillation compares them class by class. Give the student the "
                    "teacher's output layer size (the same classes, in the same order)."
                )
            seen.teacher = teacher.detach()
        return seen.teacher

    # -- the loss ------------------------------------------------------------------------------------
    def _parts(self, outputs: Any, targets: Any) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        student = logits_of(outputs, who="The student")
        teacher = self._teacher_logits(outputs, student)
        feature = self._feature_loss() if self.features else None
        t = self.temperature
        classes = student.shape[-1]
        # float32 for the soft targets whatever the autocast dtype: bf16 softmax at T > 1 loses the small tails
        log_p = F.log_softmax(student.float().reshape(-1, classes) / t, dim=-1)
        q = F.softmax(teacher.float().reshape(-1, classes) / t, dim=-1)
        labels = self._position_labels(student, targets)
        kept = labels != self._ignore_index if labels is not None else None
        if kept is None:
            kd = F.kl_div(log_p, q, reduction="batchmean") * (t * t)
        else:
            # batchmean over the kept rows, by a mask: indexing by a boolean tensor would wait for the device to
            # count it (a host sync every step). A batch of padding only adds 0 (no rows: 0/0 would be nan).
            per_row = torch.where(kept, F.kl_div(log_p, q, reduction="none").sum(-1), 0.0)
            kd = per_row.sum() / kept.sum().clamp(min=1) * (t * t)
        if targets is None:
            if self.kd_weight < 1:
                raise ValueError(
                    "The batch has no targets for the base loss. Yield (inputs, targets), or use "
                    "kd_weight=1.0 to learn from the teacher alone."
                )
            return kd, None, feature
        if self._default_base and labels is not None:
            return kd, self.base(student.reshape(-1, classes), labels), feature
        return kd, self.base(student, targets), feature

    @property
    def _ignore_index(self) -> int:
        return int(getattr(self.base, "ignore_index", -100))

    def _position_labels(self, student: torch.Tensor, targets: Any) -> torch.Tensor | None:
        """For per-position labels (sequences), the label each flattened logits row is judged against, else None
        (one label per sample: every row counts). For a causal LM (``_shift``) row ``t`` of a sequence gets label
        ``t + 1`` and its last row the ``ignore_index``, as Hugging Face's causal-LM loss pads and shifts them.

        Positions labelled with the ``ignore_index`` (-100: padding, a prompt) have no token to predict: the base
        loss skips them, and the KD term and the agreement must too, or a batch padded to a longer length would
        weigh the logits of pad tokens. A per-sample label of -100 is left alone: it marks an unlabeled sample,
        which is exactly what a teacher can still teach. Built without a host sync (no data-dependent shape)."""
        if (
            not isinstance(targets, torch.Tensor)
            or targets.ndim < 2
            or targets.is_floating_point()
            or tuple(targets.shape) != tuple(student.shape[:-1])
        ):
            return None
        if self._shift:
            targets = F.pad(targets[..., 1:], (0, 1), value=self._ignore_index)
        return targets.reshape(-1)

    def _feature_loss(self) -> torch.Tensor:
        seen = self._seen
        assert seen is not None  # _teacher_logits has checked it
        losses = []
        for s_name, t_name in self.features.items():
            s, t = seen.features.get(s_name), seen.teacher_features.get(t_name)
            if s is None or t is None:
                missing = f"the student's {s_name!r}" if s is None else f"the teacher's {t_name!r}"
                raise RuntimeError(
                    f"Feature distillation: {missing} layer gave no tensor in this forward pass (not called, or "
                    "its output holds no tensor). Name layers that run on every forward."
                )
            if s.shape != t.shape:
                raise ValueError(
                    f"Feature distillation compares the student's {s_name!r} (output {tuple(s.shape)}) with the "
                    f"teacher's {t_name!r} (output {tuple(t.shape)}): the shapes must match. Pair layers of the "
                    "same width (e.g. a student with the teacher's hidden size and fewer layers)."
                )
            losses.append(F.mse_loss(s.float(), t.float()))
        return torch.stack(losses).mean()

    def forward(self, outputs: Any, targets: Any = None) -> torch.Tensor:
        kd, base, feature = self._parts(outputs, targets)
        seen = self._seen
        if seen is not None:
            seen.parts = (kd.detach(), _detached(base), _detached(feature))
        # kd_weight=1 ignores the labels: a base loss of nan (a batch whose labels are all ignored) must not leak in
        loss = kd if base is None or self.kd_weight == 1 else self.kd_weight * kd + (1.0 - self.kd_weight) * base
        return loss if feature is None else loss + self.feature_weight * feature

    def extra_repr(self) -> str:
        return f"teacher={type(self.teacher).__name__}, temperature={self.temperature:g}, kd_weight={self.kd_weight:g}"

    # -- metrics (called after the loss on the same outputs: they read what it computed) ---------------
    def _cached_parts(
        self, outputs: Any, targets: Any
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        seen = self._seen
        if seen is not None and seen.parts is not None and seen.outputs is outputs:
            return seen.parts
        with torch.no_grad():
            return self._parts(outputs, targets)

    def _kd_metric(self, outputs: Any, targets: Any) -> torch.Tensor:
        return self._cached_parts(outputs, targets)[0]

    def _base_metric(self, outputs: Any, targets: Any) -> torch.Tensor:
        base = self._cached_parts(outputs, targets)[1]
        return base if base is not None else torch.full((), float("nan"))

    def _feature_metric(self, outputs: Any, targets: Any) -> torch.Tensor:
        feature = self._cached_parts(outputs, targets)[2]
        return feature if feature is not None else torch.full((), float("nan"))

    def _agreement(self, outputs: Any, targets: Any) -> torch.Tensor:
        student = logits_of(outputs, who="The student")
        teacher = self._teacher_logits(outputs, student)
        same = (student.argmax(-1) == teacher.argmax(-1)).reshape(-1)
        labels = self._position_labels(student, targets)
        if labels is None:
            return same.float().mean()
        kept = labels != self._ignore_index
        return (same & kept).sum() / kept.sum()  # a mask, not an index (no host sync); no kept row: nan, as before


def _in_dtype_of(teacher: nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
    """The student's inputs with their float tensors in the teacher's float dtype, when it has another one.

    A teacher kept in bf16 or fp16 (half the memory of the student's fp32) would otherwise fail on the student's
    float32 inputs (``mat1 and mat2 must have the same dtype``) outside autocast; token ids are left as they are."""
    dtype = next((p.dtype for p in teacher.parameters() if p.is_floating_point()), None)
    if dtype is None:
        return args, kwargs

    def cast(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(dtype) if tensor.is_floating_point() and tensor.dtype != dtype else tensor

    cast_args, cast_kwargs = tree_map_only(torch.Tensor, cast, (args, kwargs))
    return cast_args, cast_kwargs


def _layer(model: nn.Module, name: str, whose: str) -> nn.Module:
    try:
        return model.get_submodule(name)
    except AttributeError:
        names = [n for n, _ in model.named_modules() if n]
        shown = ", ".join(repr(n) for n in names[:12]) + (" ..." if len(names) > 12 else "")
        raise ValueError(
            f"Feature distillation: the {whose} has no layer {name!r}. Its layers (named_modules()): {shown}."
        ) from None
