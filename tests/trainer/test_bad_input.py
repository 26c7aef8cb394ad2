"""Mistakes users really make, each caught before it costs anything.

Every case asserts: the error type; that the message names the problem AND the fix; that it was
raised before the first optimizer step (Adam's state is still empty and every parameter unchanged);
and that no file was written (the ModelCheckpoint directory is absent or empty).

====  ==========================================================  ====================  ==================================
 #    mistake                                                      error                 fix named in the message
====  ==========================================================  ====================  ==================================
 1    criterion given as a class (``nn.CrossEntropyLoss``)          TypeError             ``CrossEntropyLoss()``
 2    optimizer given as a class (``torch.optim.Adam``)             TypeError             ``Adam(model.parameters(), ...)``
 3    optimizer built for another model instance                    ValueError            build it from this model
 4    optimizer holds only frozen parameters                        ValueError            unfreeze / filter requires_grad
 5    scheduler bound to another optimizer                          ValueError            build it from this optimizer
 6    scheduler given as a class                                    TypeError             ``StepLR(optimizer, ...)``
 7    ``grad_accum_steps=0``                                        ValueError            int >= 1
 8    ``grad_accum_steps=2.0`` (not an int)                         ValueError            int >= 1
 9    ``epochs=0``                                                  ValueError            int >= 1
 10   unknown precision string (``"fp8"``)                          PrecisionError        the valid names
 11   precision the device can't run                                PrecisionError        the precisions that work here
 12   ``device="cuda"`` on a machine without CUDA                   RuntimeError          ``device='cpu'``
 13   unknown device string (``"gpu"``)                             ValueError            the valid device strings
 14   metrics given as a list                                       TypeError             ``{'acc': ...}``
 15   a metric that raises on the batch                             KeyError (same type)  ``fn(outputs, targets)``
 16   a metric returning a per-sample tensor                        ValueError            reduce with ``.mean()``
 17   torchmetrics metric computing a vector (``average=None``)     ValueError            ``average='macro'``
 18   torchmetrics metric configured for another task               RuntimeError (same)   ``task=``, ``num_classes=``
 19   EarlyStopping on ``val_loss`` with no val_loader              ValueError            a logged key
 20   ModelCheckpoint monitoring a key never logged                 ValueError            a logged key
 21   ModelCheckpoint filename using a key never logged             ValueError            ``{epoch}``/``{step}``/logged key
 22   ReduceLROnPlateau on ``val_loss`` with no val_loader          ValueError            ``scheduler_monitor=``
 23   OneCycleLR built for fewer steps than the fit takes           ValueError            ``trainer.total_steps(...)``
 24   checkpoint directory not writable                             PermissionError       a writable directory
 25   ``resume_from`` path missing                                  CheckpointError       check the path / 'last'
 26   ``resume_from`` a truncated file                              CheckpointError       an earlier checkpoint
 27   ``resume_from`` a plain state_dict (not a checkpoint)         CheckpointError       ``model.load_state_dict``
 28   ``resume_from="last"`` without a ModelCheckpoint              CheckpointError       add one / pass a path
 29   empty train loader                                            ValueError            dataset size / drop_last
 30   a Dataset passed where a loader is expected                   TypeError             ``DataLoader(dataset, ...)``
 31   a tensor passed as the loader                                 TypeError             ``DataLoader(TensorDataset...)``
 32   a generator as train_loader with epochs > 1                   TypeError             a DataLoader or a list
 33   loader yielding numpy arrays                                  TypeError             ``torch.as_tensor`` / collate
 34   loader yielding python lists of numbers                       TypeError             ``torch.as_tensor`` / collate
 35   batch with more inputs than the model's forward takes         TypeError (same)      ``num_inputs=``
 36   input feature size the model can't take                       RuntimeError (same)   check feature size / layout
 37   outputs [B, 1] vs targets [B] for MSELoss (silent broadcast)  ValueError            ``y.view(-1, 1)``
 38   CrossEntropyLoss with targets of shape [B, 1]                 RuntimeError (same)   ``y.squeeze(1)``
 39   CrossEntropyLoss with float class indices                     RuntimeError (same)   ``y.long()``
 40   a label >= the number of model outputs                        IndexError (same)     widen the last layer
 41   BCEWithLogitsLoss with integer targets                        RuntimeError (same)   ``y.float()``
 42   loss is not a scalar (``reduction='none'``)                   ValueError            ``reduction='mean'``
 43   loss computed under ``torch.no_grad``                         RuntimeError          remove no_grad/detach
 44   loss returned as a python float (``.item()``)                 TypeError             return a tensor
 45   callbacks given as one object, not a list                     TypeError             ``callbacks=[cb]``
 46   callback given as a class                                     TypeError             ``EarlyStopping(...)``
 47   callback using another trainer's hook name                    ValueError            the nbtrainer hook name
 48   ``precision='fp16-mixed'`` with a ``.half()`` model            TypeError             drop ``.half()``
 49   a plain tensor attribute on another device than the model     RuntimeError          ``register_buffer``
 50   model on the meta device                                      RuntimeError          ``to_empty``
 51   seed not an int                                               TypeError             ``seed=42``
 52   validation batches the model can't take                       RuntimeError (same)   check feature size
 53   ``on_nonfinite`` misspelled                                   ValueError            the three modes
 54   no criterion and a model output without ``.loss``             ValueError            pass a criterion
 55   ``target_keys`` not in the dict batch                         KeyError              the batch's keys
 56   ``compute_loss`` returning only a loss with metrics           ValueError            return (loss, outputs, targets)
 57   ``fit`` on a Trainer built with ``optimizer=None``            ValueError            pass an optimizer
 58   dict batch with ``label`` (not ``labels``), no criterion      ValueError            rename to ``labels`` / criterion
 59   several ``target_keys``: the criterion gets a tuple           TypeError (same)      unpack the tuple in the criterion
 60   OneCycleLR shorter than ``max_steps``, loader without len     ValueError            ``total_steps=max_steps``
 61   ``optimizer="adamw"`` with every parameter frozen             ValueError            ``optimizer=None`` (eval only)
 62   a loss function given the model's whole output object         TypeError (same)      ``out.logits``
 63   validation data of inputs alone (``val_data=x_val``)          ValueError            ``val_data=(x_val, y_val)``
 64   ModelCheckpoint filename spec a value can't take (``{x:d}``)  ValueError            a spec for ints / floats
 65   a hook's parameters named unlike its keywords                 TypeError             the names / ``**kwargs``
 66   ``scheduler_monitor=`` with a scheduler other than Plateau    ValueError            Plateau / drop it
 67   ``scheduler_monitor=`` and no scheduler                       ValueError            Plateau / drop it
 68   ``target_keys=`` with tuple batches                           ValueError            drop it / yield dicts
 69   ``num_inputs=`` with dict batches                             ValueError            drop it / ``target_keys=``
 70   a negative class label (``-1`` for "unknown")                 IndexError (same)     0-based / ``ignore_index=-1``
 71   a metric given as a class (``torchmetrics.Accuracy``)         TypeError             ``Accuracy(...)``
 72   ``NLLLoss`` on raw scores (``LogSoftmax`` forgotten)           ValueError            ``CrossEntropyLoss()``
 73   Keras' ``fit(x, y, batch_size=16)`` (y taken as validation)   TypeError             ``fit((x, y), batch_size=...)``
 74   ``DataLoader(dataset, batch_size=None)`` (items one by one)   TypeError             ``batch_size=32``
 75   ``compute_loss`` returning ``(loss, outputs)``                ValueError            ``(loss, outputs, targets)``
 76   a BatchNorm over features, the epoch's last batch of 1 item   ValueError            ``drop_last=True`` / batch_size
 77   ``Trainer(model, optimizer, loss)``: the two swapped          TypeError             ``Trainer(model, criterion, optimizer)``
====  ==========================================================  ====================  ==================================

"(same)": the original exception type is kept (``except RuntimeError`` in user code still works),
with a message that adds the batch's shapes/dtypes, what nbtrainer did with the batch and the fix.
"""

from __future__ import annotations

import dataclasses
import math
import os
import pathlib
import re
import sys
from collections.abc import Callable
from typing import Any

import pytest
import torch
from conftest import LazyModule, accuracy, make_classification, make_loader
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from nbtrainer import CheckpointError, EarlyStopping, ModelCheckpoint, PrecisionError, Trainer

torchmetrics = LazyModule("torchmetrics")  # imported at first use: collection stays cheap in every worker

X, Y = make_classification(n=64)


def _model(d=10, out=3):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(d, 16), nn.ReLU(), nn.Linear(16, out))


def _loader(x=X, y=Y, bs=16, **kw):
    return make_loader(x, y, batch_size=bs, **kw)


class Env:
    """A model, an Adam optimizer and a checkpoint dir; ``trainer(**kw)`` builds a Trainer over them."""

    def __init__(self, ck, model=None):
        self.ck = str(ck)
        self.model = model if model is not None else _model()
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-2)
        self.before = [p.detach().clone() for p in self.model.parameters()]

    def trainer(self, criterion=None, callbacks=None, ckpt=True, **kw):
        cbs = list(callbacks or []) + ([ModelCheckpoint(self.ck, every_n_steps=1, save_last=True)] if ckpt else [])
        crit = nn.CrossEntropyLoss() if criterion is None else criterion
        kw.setdefault("device", "cpu")
        return Trainer(self.model, crit, kw.pop("optimizer", self.opt), callbacks=cbs, progress=False, **kw)

    def untouched(self):
        assert not self.opt.state, "an optimizer step happened"
        assert all(torch.equal(a, b) for a, b in zip(self.before, self.model.parameters(), strict=True)), (
            "weights changed"
        )
        assert not os.path.exists(self.ck) or os.listdir(self.ck) == [], f"files written: {os.listdir(self.ck)}"


CASES: dict[str, tuple[Callable[[Any], Any], type[BaseException], tuple[str, ...]]] = {}


def case(name, exc, *patterns):
    def deco(fn):
        CASES[name] = (fn, exc, patterns)
        return fn

    return deco


# 1-13: arguments --------------------------------------------------------------------------------------
case("01-criterion-class", TypeError, "class CrossEntropyLoss, not an instance", r"CrossEntropyLoss\(\)")(
    lambda e: e.trainer(criterion=nn.CrossEntropyLoss)
)
case("02-optimizer-class", TypeError, "class Adam, not an optimizer", r"Adam\(model.parameters\(\), lr=")(
    lambda e: e.trainer(optimizer=torch.optim.Adam)
)
case("03-optimizer-other-model", ValueError, "none of the model's parameters", "Build it from this model's parameters")(
    lambda e: e.trainer(optimizer=torch.optim.Adam(_model().parameters()))
)


def _frozen(e):
    for p in e.model.parameters():
        p.requires_grad_(False)
    return e.trainer().fit(_loader(), epochs=1)


case("04-optimizer-all-frozen", ValueError, "requires_grad=False", "Unfreeze")(_frozen)
case("05-scheduler-other-optimizer", ValueError, "different optimizer", "Create the scheduler from this trainer's")(
    lambda e: e.trainer(scheduler=torch.optim.lr_scheduler.StepLR(torch.optim.SGD(_model().parameters(), 0.1), 1))
)
case("06-scheduler-class", TypeError, "class StepLR, not a scheduler", r"StepLR\(optimizer")(
    lambda e: e.trainer(scheduler=torch.optim.lr_scheduler.StepLR)
)
case("07-accum-zero", ValueError, "grad_accum_steps must be an int >= 1, got 0")(
    lambda e: e.trainer(grad_accum_steps=0)
)
case("08-accum-float", ValueError, "grad_accum_steps must be an int >= 1, got 2.0")(
    lambda e: e.trainer(grad_accum_steps=2.0)
)
case("09-epochs-zero", ValueError, "epochs must be an int >= 1, got 0")(lambda e: e.trainer().fit(_loader(), epochs=0))
case("10-precision-unknown", PrecisionError, "Unknown precision 'fp8'", "Use one of fp32, fp16-mixed, bf16-mixed")(
    lambda e: e.trainer(precision="fp8")
)


def _precision_unsupported(e):
    import nbtrainer._setup._precision as prec

    real = prec._trial

    def broken(device, dtype):
        if dtype is torch.bfloat16:
            raise RuntimeError("no bf16 kernels on this device")
        return real(device, dtype)

    prec._support.cache_clear()
    prec._trial = broken
    try:
        return e.trainer(precision="bf16-mixed")
    finally:
        prec._trial = real
        prec._support.cache_clear()


case(
    "11-precision-unsupported",
    PrecisionError,
    "bf16-mixed' is not available on cpu",
    "no bf16 kernels",
    r"Choose one of \['fp32', 'fp16-mixed'\]",
    "never switches precision silently",
)(_precision_unsupported)
if not torch.cuda.is_available():
    case("12-cuda-unavailable", RuntimeError, "CUDA is not available", "Use device='cpu'")(
        lambda e: e.trainer(device="cuda")
    )
case("13-device-unknown", ValueError, "Unknown device 'gpu'", "Use 'auto', 'cpu', 'cuda'")(
    lambda e: e.trainer(device="gpu")
)

# 14-18: metrics --------------------------------------------------------------------------------------------
case("14-metrics-list", TypeError, "metrics must be a dict", r"metrics=\{'acc'")(
    lambda e: e.trainer(metrics=[torchmetrics.Accuracy(task="multiclass", num_classes=3)])
)


def _raising_metric(outputs, targets):
    return {"a": 1}["missing"]


case("15-metric-raises", KeyError, "Metric 'bad' raised on the first training batch", r"fn\(outputs, targets\)")(
    lambda e: e.trainer(metrics={"bad": _raising_metric}).fit(_loader(), epochs=1)
)
case("16-metric-not-scalar", ValueError, r"Metric 'acc' returned a tensor of shape \(16,\)", r"\.mean\(\)")(
    lambda e: e.trainer(metrics={"acc": lambda o, t: (o.argmax(1) == t).float()}).fit(_loader(), epochs=1)
)
case("17-torchmetric-vector", ValueError, r"Metric 'acc' computed a tensor of shape \(3,\)", "average='macro'")(
    lambda e: e.trainer(metrics={"acc": torchmetrics.Accuracy(task="multiclass", num_classes=3, average=None)}).fit(
        _loader(), epochs=1
    )
)
case(
    "18-torchmetric-wrong-task", RuntimeError, "Metric 'f1' .*failed on the first training batch", "task=, num_classes="
)(lambda e: e.trainer(metrics={"f1": torchmetrics.F1Score(task="binary")}).fit(_loader(), epochs=1))

# 19-24: callbacks, schedules, files ------------------------------------------------------------------------
case(
    "19-earlystopping-no-val",
    ValueError,
    "EarlyStopping monitors 'val_loss', which this fit will never log",
    "no val_loader",
    "Pick one of them",
)(lambda e: e.trainer(callbacks=[EarlyStopping("val_loss")]).fit(_loader(), epochs=2))
case("20-checkpoint-monitor-missing", ValueError, "ModelCheckpoint monitors 'val_acc'", "Pick one of them")(
    lambda e: e.trainer(callbacks=[ModelCheckpoint(e.ck, monitor="val_acc")], ckpt=False).fit(
        _loader(), _loader(), epochs=1
    )
)
case(
    "21-checkpoint-filename-key",
    ValueError,
    r"filename 'best-\{val_f1:.3f\}' uses \['val_f1'\]",
    r"Use \{epoch\}, \{step\}",
)(
    lambda e: e.trainer(callbacks=[ModelCheckpoint(e.ck, filename="best-{val_f1:.3f}")], ckpt=False).fit(
        _loader(), _loader(), epochs=1
    )
)


def _plateau(e):
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(e.opt)
    return e.trainer(scheduler=sched, scheduler_monitor="val_loss").fit(_loader(), epochs=2)


case(
    "22-plateau-no-val",
    ValueError,
    "ReduceLROnPlateau would monitor 'val_loss'",
    "no val_loader",
    "Set scheduler_monitor=",
)(_plateau)


def _onecycle(e):
    sched = torch.optim.lr_scheduler.OneCycleLR(e.opt, max_lr=0.1, total_steps=len(_loader()) * 2)
    return e.trainer(scheduler=sched).fit(_loader(), epochs=3)


case(
    "23-onecycle-too-short",
    ValueError,
    "OneCycleLR was built for total_steps=8 but this fit takes 12",
    r"total_steps=trainer.total_steps\(train_loader, epochs\)",
)(_onecycle)


def _unwritable(e):
    blocker = os.path.join(os.path.dirname(e.ck), "a-file")
    with open(blocker, "w") as fh:
        fh.write("x")
    e.ck = os.path.join(blocker, "ckpts")
    return e.trainer().fit(_loader(), epochs=1)


case("24-checkpoint-dir-unwritable", PermissionError, "cannot create dirpath", "Pass a writable directory")(_unwritable)

# 25-28: resume ------------------------------------------------------------------------------------------------
case("25-resume-missing", CheckpointError, "No checkpoint at .*nope.ckpt", "Check the path")(
    lambda e: e.trainer().fit(_loader(), epochs=1, resume_from=os.path.join(os.path.dirname(e.ck), "nope.ckpt"))
)


def _resume_truncated(e):
    other = Env(os.path.join(os.path.dirname(e.ck), "src"))
    t = other.trainer(ckpt=False)
    t.fit(_loader(), epochs=1)
    path = t.save_checkpoint(os.path.join(os.path.dirname(e.ck), "full.ckpt"))
    data = pathlib.Path(path).read_bytes()
    cut = os.path.join(os.path.dirname(e.ck), "cut.ckpt")
    with open(cut, "wb") as fh:
        fh.write(data[: len(data) // 3])
    return e.trainer().fit(_loader(), epochs=2, resume_from=cut)


case("26-resume-truncated", CheckpointError, "truncated or corrupt", "Resume from an earlier checkpoint")(
    _resume_truncated
)


def _resume_state_dict(e):
    path = os.path.join(os.path.dirname(e.ck), "weights.pt")
    torch.save(_model().state_dict(), path)
    return e.trainer().fit(_loader(), epochs=1, resume_from=path)


case("27-resume-not-a-checkpoint", CheckpointError, "not an nbtrainer checkpoint", r"model.load_state_dict")(
    _resume_state_dict
)
case("28-resume-last-no-callback", CheckpointError, "needs a ModelCheckpoint callback", "pass a checkpoint path")(
    lambda e: e.trainer(ckpt=False).fit(_loader(), epochs=1, resume_from="last")
)

# 29-34: loaders and batches -----------------------------------------------------------------------------------
case("29-empty-loader", ValueError, "train_loader is empty", "batch_size and drop_last")(
    lambda e: e.trainer().fit(_loader(X[:8], Y[:8], bs=16, drop_last=True), epochs=1)
)
case("30-dataset-not-loader", TypeError, "train_loader is a Dataset", r"DataLoader\(dataset, batch_size=32")(
    lambda e: e.trainer().fit(torch.utils.data.TensorDataset(X, Y), epochs=1)
)
case("31-tensor-as-loader", TypeError, "train_loader is a tensor", r"DataLoader\(TensorDataset\(x, y\)")(
    lambda e: e.trainer().fit(X, epochs=1)
)
case("32-generator-several-epochs", TypeError, "one-shot iterator", "a DataLoader or a list")(
    lambda e: e.trainer().fit((b for b in _loader()), epochs=2)
)
case("33-numpy-batches", TypeError, r"batch\[0\] is a numpy.ndarray", r"torch.as_tensor")(
    lambda e: e.trainer().fit([(X[:16].numpy(), Y[:16])], epochs=1)
)
case("34-list-batches", TypeError, r"batch\[1\] is a python list of numbers", "collate_fn")(
    lambda e: e.trainer().fit([(X[:16], Y[:16].tolist())], epochs=1)
)

# 35-44: the first batch through model and criterion -------------------------------------------------------------
case(
    "35-too-many-inputs",
    TypeError,
    "The model could not take the first train_loader batch",
    r"2 positional input\(s\)",
    "set num_inputs=",
)(lambda e: e.trainer().fit([(X[:16], X[:16], Y[:16])], epochs=1))
case("36-feature-size", RuntimeError, r"shapes cannot be multiplied", r"float32\[16, 7\]", "check the feature size")(
    lambda e: e.trainer().fit([(X[:16, :7], Y[:16])], epochs=1)
)


def _mse_shapes(e):
    e.model[2] = nn.Linear(16, 1)
    e.__init__(e.ck, e.model)
    return e.trainer(criterion=nn.MSELoss()).fit([(X[:16], Y[:16].float())], epochs=1)


case(
    "37-mse-broadcast",
    ValueError,
    r"MSELoss got outputs of shape \[16, 1\] and targets of shape \[16\]",
    r"broadcast to \[16, 16\]",
    r"y.view\(-1, 1\)",
)(_mse_shapes)
case("38-ce-target-2d", RuntimeError, r"targets int64\[16, 1\]", r"y.squeeze\(1\)")(
    lambda e: e.trainer().fit([(X[:16], Y[:16, None])], epochs=1)
)
case("39-ce-float-targets", RuntimeError, "wants integer class indices", r"y.long\(\)")(
    lambda e: e.trainer().fit([(X[:16], Y[:16].float())], epochs=1)
)
case(
    "40-label-out-of-range",
    IndexError,
    "Target 3 is out of bounds",
    r"number of model outputs \(3\)",
    "last layer as wide as the number of classes",
)(lambda e: e.trainer().fit([(X[:16], torch.full((16,), 3))], epochs=1))


def _bce_int(e):
    e.model[2] = nn.Linear(16, 1)
    e.__init__(e.ck, e.model)
    return e.trainer(criterion=nn.BCEWithLogitsLoss()).fit([(X[:16], (Y[:16, None] > 0).long())], epochs=1)


case("41-bce-int-targets", RuntimeError, "BCEWithLogitsLoss wants float targets", r"y.float\(\)")(_bce_int)
case("42-loss-not-scalar", ValueError, r"loss has shape \(16,\)", "reduction='mean'")(
    lambda e: e.trainer(criterion=nn.CrossEntropyLoss(reduction="none")).fit(_loader(), epochs=1)
)


def _no_grad_loss(model, batch):
    with torch.no_grad():
        return nn.functional.cross_entropy(model(batch[0]), batch[1])


case("43-loss-no-grad", RuntimeError, "training loss has no grad_fn", "torch.no_grad")(
    lambda e: e.trainer(compute_loss=_no_grad_loss).fit(_loader(), epochs=1)
)
case("44-loss-python-float", TypeError, "loss is a float, not a tensor", "scalar torch.Tensor")(
    lambda e: e.trainer(compute_loss=lambda m, b: float(nn.functional.cross_entropy(m(b[0]), b[1]))).fit(
        _loader(), epochs=1
    )
)

# 45-56: callbacks, model, misc ----------------------------------------------------------------------------------


class _LightningStyle:
    def on_train_epoch_end(self, trainer):
        pass


case("45-callbacks-not-a-list", TypeError, "callbacks must be a list", r"callbacks=\[cb\]")(
    # the mistake under test, which a type checker also sees
    lambda e: Trainer(e.model, nn.CrossEntropyLoss(), e.opt, callbacks=EarlyStopping("loss"), progress=False)  # type: ignore[arg-type]
)
case("46-callback-class", TypeError, "class EarlyStopping, not an instance", r"EarlyStopping\(")(
    lambda e: e.trainer(callbacks=[EarlyStopping])
)
case(
    "47-foreign-hook-name",
    ValueError,
    r"defines on_train_epoch_end\(\), which nbtrainer never calls",
    r"Rename it to on_epoch_end\(\)",
)(lambda e: e.trainer(callbacks=[_LightningStyle()]))


def _half_fp16(e):
    e.model.half()
    e.__init__(e.ck, e.model)
    return e.trainer(precision="fp16-mixed").fit(_loader(), epochs=1)


case("48-fp16-half-model", TypeError, "are float16", r"Drop .half\(\)")(_half_fp16)


class _WithMask(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(10, 3)
        self.scale = torch.ones(3, device="meta")  # a plain attribute, not a buffer: .to() never moves it

    def forward(self, x):
        return self.lin(x) * self.scale


case(
    "49-tensor-attribute-other-device",
    RuntimeError,
    "model.scale is a plain tensor attribute on meta",
    r"register_buffer\('scale'",
)(lambda e: Env(e.ck, _WithMask()).trainer().fit(_loader(), epochs=1))


def _meta_model(e):
    with torch.device("meta"):
        model = _model()
    env = Env(e.ck, model)
    return env.trainer().fit(_loader(), epochs=1)


case("50-meta-model", RuntimeError, "parameters on the 'meta' device", r"to_empty\(device=")(_meta_model)
case("51-seed-not-int", TypeError, "seed must be an int or None, got '42'", "seed=42")(lambda e: e.trainer(seed="42"))
case("52-val-batches-wrong", RuntimeError, "could not take the first val_loader batch", "check the feature size")(
    lambda e: e.trainer().fit(_loader(), _loader(X[:, :7], Y), epochs=1)
)
case("53-on-nonfinite-typo", ValueError, "on_nonfinite must be one of 'raise', 'skip', 'stop', got 'skipp'")(
    lambda e: e.trainer(on_nonfinite="skipp")
)
case("54-no-criterion-no-loss", ValueError, "model output has no 'loss'", r"Pass a criterion")(
    lambda e: Trainer(e.model, None, e.opt, progress=False, device="cpu", callbacks=[ModelCheckpoint(e.ck)]).fit(
        _loader(), epochs=1
    )
)
case("55-target-keys-missing", KeyError, r"target_keys \['label'\] not in the batch", "Set target_keys=")(
    lambda e: e.trainer(target_keys="label").fit([{"x": X[:16], "y": Y[:16]}], epochs=1)
)
case(
    "56-compute-loss-only-loss-with-metrics",
    ValueError,
    "compute_loss returned only a loss",
    r"return \(loss, outputs, targets\)",
)(
    lambda e: e.trainer(
        metrics={"acc": lambda o, t: o.sum()}, compute_loss=lambda m, b: nn.functional.cross_entropy(m(b[0]), b[1])
    ).fit(_loader(), epochs=1)
)


# 57-62: evaluation-only trainers, Hugging Face-style batches and outputs, streams -----------------------------
case(
    "57-fit-without-optimizer", ValueError, "fit needs an optimizer", "optimizer=None", r"AdamW\(model.parameters\(\)"
)(lambda e: e.trainer(optimizer=None).fit(_loader(), epochs=1))


@dataclasses.dataclass
class _Out:
    logits: torch.Tensor
    loss: torch.Tensor | None = None


class _HFStyle(nn.Module):
    """Keyword inputs; a loss only from ``labels`` (extra keywords are accepted and ignored, like HF models)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(10, 3)

    def forward(self, x, labels=None, **kwargs):
        logits = self.lin(x)
        return _Out(logits, nn.functional.cross_entropy(logits, labels) if labels is not None else None)


class _Keyword(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(10, 3)

    def forward(self, x):
        return self.lin(x)


def _label_not_labels(e):
    env = Env(e.ck, _HFStyle())
    return Trainer(env.model, None, env.opt, progress=False, device="cpu").fit([{"x": X[:16], "label": Y[:16]}])


case(
    "58-label-key-no-criterion",
    ValueError,
    "model output has no 'loss'",
    "took the batch key 'label' as the targets",
    "Rename the key to 'labels'",
    "or pass a criterion",
)(_label_not_labels)
case(
    "59-several-target-keys-tuple",
    TypeError,
    r"targets are a tuple \(int64\[16\], float32\[16\]\)",
    "target_keys= with several keys, in that order",
    "Unpack them in the criterion",
)(
    lambda e: (
        Env(e.ck, _Keyword())
        .trainer(target_keys=("y", "w"))
        .fit([{"x": X[:16], "y": Y[:16], "w": torch.ones(16)}], epochs=1)
    )
)


def _onecycle_stream(e):
    sched = torch.optim.lr_scheduler.OneCycleLR(e.opt, max_lr=0.1, total_steps=3)
    return e.trainer(scheduler=sched).fit((b for b in _loader()), epochs=1, max_steps=4)


case(
    "60-onecycle-shorter-than-max-steps",
    ValueError,
    "OneCycleLR was built for total_steps=3 but this fit runs up to max_steps=4",
    "total_steps=4",
)(_onecycle_stream)


def _frozen_named_optimizer(e):
    for p in e.model.parameters():
        p.requires_grad_(False)
    return e.trainer(optimizer="adamw")


case("61-named-optimizer-all-frozen", ValueError, "optimizer='adamw' has nothing to train", "optimizer=None")(
    _frozen_named_optimizer
)
case(
    "62-criterion-gets-output-object",
    TypeError,
    "The model returns a _Out, and the criterion gets it whole",
    r"CrossEntropyLoss\(\)\(out.logits, y\)",
)(lambda e: Env(e.ck, _HFStyle()).trainer().fit([({"x": X[:16]}, Y[:16])], epochs=1))


# once the end of the first epoch's crash: "zip() argument 2 is longer than argument 1"
case("63-val-inputs-only", ValueError, "validation batch gave no loss", r"val_data=\(x_val, y_val\)")(
    lambda e: e.trainer().fit((X, Y), val_data=X[:32], batch_size=16, epochs=1)
)
# once the end of the first epoch's "Unknown format code 'd' for object of type 'float'", naming no callback
case(
    "64-checkpoint-filename-format-spec",
    ValueError,
    r"ModelCheckpoint filename 'ep\{epoch\}-\{val_loss:d\}' cannot be formatted",
    "Unknown format code 'd'",
    r"every other logged value a float",
    r"\{val_loss:.4f\}",
)(
    lambda e: e.trainer(callbacks=[ModelCheckpoint(e.ck, monitor="val_loss", filename="ep{epoch}-{val_loss:d}")]).fit(
        _loader(), _loader(), epochs=1
    )
)


class _HookMetricsNotLogs:
    def on_epoch_end(self, trainer, epoch, metrics):
        pass


# once "on_epoch_end() got an unexpected keyword argument 'logs'" after the first epoch trained
case(
    "65-hook-parameter-names",
    TypeError,
    r"Callback _HookMetricsNotLogs defines on_epoch_end\(trainer, epoch, metrics\)",
    "no parameter 'logs'",
    r"on_epoch_end\(self, trainer, epoch, logs\), or accept \*\*kwargs",
)(lambda e: e.trainer(callbacks=[_HookMetricsNotLogs()]).fit(_loader(), epochs=1))

# 66-69: once accepted and silently ignored, the fit finishing as if they had been applied
case(
    "66-scheduler-monitor-not-plateau",
    ValueError,
    "scheduler_monitor='val_loss' is read only by a ReduceLROnPlateau",
    "this fit has a StepLR",
    "silently ignored",
    r"scheduler=ReduceLROnPlateau\(optimizer\)",
    "trainer.scheduler_monitor = None",
)(
    lambda e: e.trainer(scheduler=torch.optim.lr_scheduler.StepLR(e.opt, 1), scheduler_monitor="val_loss").fit(
        _loader(), _loader(), epochs=1
    )
)
case(
    "67-scheduler-monitor-no-scheduler",
    ValueError,
    "scheduler_monitor='loss' is read only by a ReduceLROnPlateau",
    "this fit has no scheduler",
    "drop scheduler_monitor=",
)(lambda e: e.trainer(scheduler_monitor="loss").fit(_loader(), epochs=1))
case(
    "68-target-keys-tuple-batches",
    ValueError,
    "target_keys='y' names entries of dict",
    r"first train_loader batch is a (tuple|list) \(not a dict\)",
    "silently ignored",
    "Drop target_keys=",
)(lambda e: e.trainer(target_keys="y").fit(_loader(), epochs=1))
case(
    "69-num-inputs-dict-batches",
    ValueError,
    "num_inputs=1 counts the leading elements of tuple batches",
    r"first train_loader batch is a dict \(keys \['x', 'labels'\]\)",
    "Drop num_inputs=",
)(lambda e: e.trainer(num_inputs=1).fit([{"x": X[:16], "labels": Y[:16]}], epochs=1))


def _negative_label(e):
    y = Y[:16].clone()
    y[3] = -1
    return e.trainer().fit([(X[:16], y)], epochs=1)


case(
    "70-negative-label",
    IndexError,
    r"Target -1 is out of bounds\. A label is negative \(-1\)",  # one period: torch's, not a second
    r"class labels run from 0 to 2",
    r"CrossEntropyLoss\(ignore_index=-1\)",
)(_negative_label)
case("71-metric-class", TypeError, r"metrics\['acc'\] is the class Accuracy, not a metric", r"Accuracy\(\.\.\.\)")(
    lambda e: e.trainer(metrics={"acc": pytest.importorskip("torchmetrics").Accuracy}).fit(_loader(), epochs=1)
)

case(
    "72-nll-on-logits",
    ValueError,
    "NLLLoss takes log-probabilities",
    "raw scores",
    r"nn.CrossEntropyLoss\(\)",
    r"nn.LogSoftmax\(dim=1\)",
)(lambda e: e.trainer(criterion=nn.NLLLoss()).fit(_loader(), epochs=1))

case("73-keras-fit-x-y", TypeError, r"fit\(x, y\) took y as the validation data", r"fit\(\(x, y\), batch_size=32\)")(
    lambda e: e.trainer().fit(X[:32], Y[:32], batch_size=16, epochs=1)
)
case("74-loader-batch-size-none", TypeError, "DataLoader with batch_size=None", r"DataLoader\(dataset, batch_size=32")(
    lambda e: e.trainer().fit(DataLoader(TensorDataset(X[:32], Y[:32]), batch_size=None), epochs=1)
)


def _two_tuple_loss(model, batch):
    x, y = batch
    out = model(x)
    return nn.functional.cross_entropy(out, y), out


case("75-compute-loss-two-tuple", ValueError, r"compute_loss returned a tuple of 2 \(Tensor, Tensor\)",
     r"\(loss, outputs, targets\)")(lambda e: e.trainer(compute_loss=_two_tuple_loss).fit(_loader(), epochs=1))  # fmt: skip


def _batch_norm_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(10, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))


def _batch_norm_last_item(e):
    e.__init__(e.ck, _batch_norm_model())  # the checks after the case look at this model and its optimizer
    return e.trainer().fit(_loader(X[:33], Y[:33]), epochs=1)  # batches of 16, 16 and 1


# once the end of epoch 1's bare "Expected more than 1 value per channel when training", after its optimizer steps
case("76-batch-norm-last-batch-of-one", ValueError, r"last batch of each epoch holds 1 item \(33 samples",
     r"BatchNorm1d '1'", r"drop_last=True", r"batch_size=15")(_batch_norm_last_item)  # fmt: skip


# the order other libraries use (optimizer before loss): the message said only "got AdamW"
case("77-optimizer-and-criterion-swapped", TypeError, r"got Adam\.", r"Trainer\(model, criterion, optimizer\)",
     r"criterion=\.\.\., optimizer=\.\.\.")(lambda e: e.trainer(criterion=e.opt, optimizer=nn.CrossEntropyLoss()))  # fmt: skip


@pytest.mark.parametrize("name", sorted(CASES))
def test_mistake_is_caught_before_anything_happens(tmp_path, name):
    fn, exc, patterns = CASES[name]
    env = Env(tmp_path / "ckpts")
    with pytest.raises(exc) as err:
        fn(env)
    message = str(err.value.args[0]) if isinstance(err.value, KeyError) and err.value.args else str(err.value)
    for pattern in patterns:
        assert re.search(pattern, message), f"{pattern!r} not in: {message}"
    env.untouched()


def test_catalogue_is_large_and_documented():
    assert len(CASES) >= 25
    doc = sys.modules[__name__].__doc__ or ""
    for name in CASES:
        number = str(int(name.split("-")[0]))
        assert f"\n {number} " in doc or f"\n {number}  " in doc, f"case {name} missing from the table"


def test_a_failed_first_batch_leaves_no_trace(tmp_path):
    """After a first-batch error the RNG is where seeding put it... and a fixed retry runs normally."""
    env = Env(tmp_path / "ck")
    trainer = env.trainer(seed=3)
    with pytest.raises(RuntimeError):
        trainer.fit([(X[:16, :7], Y[:16])], epochs=1)
    env.untouched()
    history = trainer.fit(_loader(), epochs=1)
    assert history.status == "finished"


def test_validation_peek_changes_nothing(tmp_path):
    """Trying the first validation batch up front restores every RNG: same run with or without it."""
    from nbtrainer._loop._batch_steps import BatchSteps

    def run():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(10, 16), nn.Dropout(0.3), nn.ReLU(), nn.Linear(16, 3))
        trainer = Trainer(
            model, nn.CrossEntropyLoss(), torch.optim.Adam(model.parameters()), seed=1, progress=False, device="cpu"
        )
        # shuffled without its own generator: each iter() draws from the global RNG
        val = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=16, shuffle=True)
        trainer.fit(_loader(shuffle=True), val, epochs=2)
        return [p.detach().clone() for p in model.parameters()], trainer.history.steps["loss"]

    with_peek = run()
    real = BatchSteps.check_val_loader
    BatchSteps.check_val_loader = lambda *a: None  # type: ignore[method-assign]
    try:
        without = run()
    finally:
        BatchSteps.check_val_loader = real  # type: ignore[method-assign]
    assert with_peek[1] == without[1]
    assert all(torch.equal(a, b) for a, b in zip(with_peek[0], without[0], strict=True))


# -- after an error or an interrupt the trainer holds nothing of the batch ------------------------------------
class _Boom(nn.Module):
    def __init__(self, at: int, exc: type) -> None:
        super().__init__()
        self.lin, self.n, self.at, self.exc = nn.Linear(10, 3), 0, at, exc

    def forward(self, x):
        self.n += 1
        if self.n == self.at:
            raise self.exc("boom")
        return self.lin(x)


@pytest.mark.parametrize("exc,accum", [(RuntimeError, 2), (KeyboardInterrupt, 2), (RuntimeError, 1)])
def test_batches_are_collectable_after_a_failed_or_interrupted_fit(exc, accum):
    import gc
    import weakref

    model = _Boom(at=4, exc=exc)
    trainer = Trainer(
        model,
        nn.CrossEntropyLoss(),
        torch.optim.Adam(model.parameters()),
        progress=False,
        device="cpu",
        grad_accum_steps=accum,
        metrics={"acc": accuracy},
    )
    batches = [(X[i : i + 16].clone(), Y[i : i + 16].clone()) for i in range(0, 64, 16)]
    refs = [weakref.ref(t) for b in batches for t in b]
    try:
        trainer.fit(batches, epochs=1)
    except (RuntimeError, KeyboardInterrupt):  # a script gets the KeyboardInterrupt back once the run is closed
        pass
    assert trainer.status == ("interrupted" if exc is KeyboardInterrupt else "failed")
    del batches
    alive = [r for r in refs if r() is not None]
    gc.collect()
    assert not [r for r in refs if r() is not None], "a batch is still referenced after the fit ended"
    assert not alive, "a reference cycle held a batch until gc ran"
    assert trainer.run_state.loop is None and all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("accum", [1, 2])
def test_a_failed_fit_keeps_the_steps_it_took_in_the_history(accum):
    """An error at the 30th micro-batch, with no refresh since the fit started: the steps before it are read once
    on the way out and reach the History (and the last progress) before on_exception; the error is raised."""
    model = _Boom(at=30, exc=ValueError)
    seen = []

    class AtFailure:
        def on_exception(self, trainer, exception):
            seen.append(list(trainer.history.steps["step"]))

    trainer = Trainer(
        model,
        nn.CrossEntropyLoss(),
        torch.optim.SGD(model.parameters(), lr=0.1),
        progress=False,
        device="cpu",
        grad_accum_steps=accum,
        refresh_interval=3600.0,
        callbacks=[AtFailure()],
    )
    batches = [(X[i % 64 : i % 64 + 16], Y[i % 64 : i % 64 + 16]) for i in range(0, 16 * 40, 16)]
    with pytest.raises(ValueError, match="boom"):
        trainer.fit(batches, epochs=1)
    done = 29 // accum  # the micro-batches before the failing one, in closed windows
    assert trainer.global_step == done and trainer.status == "failed"
    steps = trainer.history.steps
    assert steps["step"] == list(range(1, done + 1)) and seen == [steps["step"]]
    assert all(math.isfinite(v) for v in steps["loss"])
    assert trainer.progress.global_step == done and trainer.progress.loss is not None


def test_onecycle_overflow_on_a_loader_without_len_is_explained_before_the_extra_step():
    """A stream (IterableDataset) can't be counted up front: the fit stops with a clear error right before
    the optimizer step the schedule has no room for, not with torch's 'Tried to step N times'."""

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(zip(X, Y, strict=True))

    env = Env(".")
    sched = torch.optim.lr_scheduler.OneCycleLR(env.opt, max_lr=0.1, total_steps=3)
    trainer = env.trainer(scheduler=sched, ckpt=False)
    with pytest.raises(ValueError) as err:
        trainer.fit(torch.utils.data.DataLoader(Stream(), batch_size=8), epochs=1)
    message = str(err.value)
    assert "OneCycleLR was built for total_steps=3 and this fit has used them all" in message
    assert "has no len()" in message and "max_steps=3" in message and "Tried to step" not in message
    assert trainer.global_step == 3 and sched.last_epoch == 3 and trainer.status == "failed"


def test_a_label_out_of_range_in_a_later_batch_is_explained_and_check_data_finds_it_first():
    """Before: labels 1..C with many classes often leave C out of the first batch, which the first-batch check passes;
    a later batch then died with torch's bare "Target 100 is out of bounds." after optimizer steps had run."""
    torch.manual_seed(0)
    x, y = torch.randn(256, 20), torch.randint(0, 100, (256,)) + 1  # 1..100 for 100 classes
    order = torch.cat([torch.nonzero(y < 100).flatten(), torch.nonzero(y == 100).flatten()])
    x, y = x[order], y[order]  # the 100s at the end: the first batch is in range
    trainer = Trainer(nn.Linear(20, 100), nn.CrossEntropyLoss(), "adamw", progress=False)
    with pytest.raises(IndexError) as err:
        trainer.fit((x, y), batch_size=32, shuffle=False, epochs=1)
    assert trainer.global_step > 0  # steps ran: the message says so, and where
    message = str(err.value)
    assert re.search(rf"epoch 1 \(after optimizer step {trainer.global_step}\) holds the label 100", message), message
    assert "number of model outputs" in message and "Trainer(check_data=True)" in message, message
    checked = Trainer(nn.Linear(20, 100), nn.CrossEntropyLoss(), "adamw", progress=False, check_data=True)
    with pytest.raises(ValueError, match="label") as refused:
        checked.fit((x, y), batch_size=32, shuffle=False, epochs=1)
    assert checked.global_step == 0, refused.value  # what the message advises finds it before the first step


def test_nll_loss_on_log_softmax_outputs_trains():
    """The check on NLLLoss's inputs passes log-probabilities (every value <= 0) and the run trains."""
    torch.manual_seed(0)
    x = torch.randn(128, 8)
    y = (x[:, 0] > 0).long()
    model = nn.Sequential(nn.Linear(8, 2), nn.LogSoftmax(dim=1))
    h = Trainer(model, nn.NLLLoss(), "adamw", lr=1e-2, progress=False).fit((x, y), batch_size=32, epochs=3)
    assert h.status == "finished" and 0 < h.epochs[-1]["loss"] < h.epochs[0]["loss"]


@pytest.mark.parametrize(
    "make_model, loader",
    [
        # a BatchNorm2d normalizes over the item's pixels too: one image is enough for torch
        (lambda: nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4 * 4 * 4, 3)), "images"),
        (lambda: _frozen_norm(_batch_norm_model()), "features"),  # in eval mode it uses its running statistics
        (_batch_norm_model, "drop_last"),  # the fix the refusal names
        (_batch_norm_model, "even"),  # 32 samples in batches of 16: no single item
    ],
    ids=["batchnorm2d", "frozen", "drop_last", "even"],
)
def test_a_batch_norm_that_can_take_every_batch_trains(make_model, loader):
    torch.manual_seed(0)
    x = {"images": torch.randn(33, 1, 6, 6)}.get(loader, X[:33])
    data = TensorDataset(x[:32] if loader == "even" else x, Y[:32] if loader == "even" else Y[:33])
    batches = DataLoader(data, batch_size=16, drop_last=loader == "drop_last")
    history = Trainer(make_model(), nn.CrossEntropyLoss(), "adam", progress=False).fit(batches, epochs=1)
    assert history.status == "finished"


def _frozen_norm(model):
    model[1].eval()
    return model


def test_a_batch_of_one_item_is_not_refused_where_max_steps_ends_the_fit_before_it():
    history = Trainer(_batch_norm_model(), nn.CrossEntropyLoss(), "adam", progress=False).fit(
        _loader(X[:33], Y[:33]), epochs=1, max_steps=2
    )
    assert history.status == "finished" and len(history.steps["step"]) == 2
