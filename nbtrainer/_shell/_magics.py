"""``%load_ext nbtrainer``: the ``%nbtrainer`` line magic.

Subcommands (``%nbtrainer help`` prints every usage):

``doctor`` (alias ``env``)
    torch version and build, devices, which precisions each device really runs (checked with a tiny
    autocast forward+backward, never guessed), the notebook packages, whether the front-end extensions
    are installed, the ipykernel background-thread bug range, and a concrete fix for each problem.
    Shows a :class:`DoctorReport` wherever the line stands in a cell (text in a terminal, HTML in a notebook) and
    keeps it as ``_nbt_doctor``.
``profile MODEL (--input-shape 1,3,32,32 | --inputs VAR) [--device D] [--precision P]``
    ``nbtrainer.profile_model`` on a model of the namespace, shown as a ``ProfileCard`` (in terminal
    IPython, which has no front end for widgets, as text); the profile is stored as ``_nbt_profile``.
``train MODEL CRITERION OPTIMIZER TRAIN_LOADER [VAL_LOADER] [--epochs N] [--precision P] [--accum K] [--metrics VAR]``
    builds and shows a ``TrainerWidget`` from namespace names; stored as ``_nbt_widget``. In terminal
    IPython (no front end for a panel) it trains in the foreground with console progress instead; the
    trainer and the history are stored as ``_nbt_trainer`` and ``_nbt_history``.
``compare MAKE_MODEL OPTIMIZER CRITERION TRAIN_LOADER [VAL_LOADER] [--strategies LIST|VAR] [--steps N]``
    ``nbtrainer.compare_strategies``: trains once per strategy (presets ``fp32,fp16,bf16,ckpt,accumN,adafactor,all``
    or a dict of the namespace) and shows the table; stored as ``_nbt_compare``. In a notebook with
    ipywidgets and bqplot installed it shows a ``CompareWidget`` (table and bar charts, rows added as each
    strategy finishes; stored as ``_nbt_compare_widget``), else the table's own HTML; in terminal IPython
    it prints the text table.
``compare-inference MODEL LOADER [--methods LIST] [--models VAR] [--baseline NAME] [--rounds R]``
    ``nbtrainer.compare_inference``: the model under each quantization method (and the models of a dict of the
    namespace, e.g. a distilled student) on the same batches; stored as ``_nbt_compare_inference``, shown as a
    ``CompareWidget`` in a notebook (``_nbt_compare_inference_widget``), printed in terminal IPython.
``status`` / ``stop [N] [--wait S]``
    the runs inside ``Trainer.fit`` in this kernel, and stopping them at the next optimizer step. A magic
    only runs when no cell is busy, so this reaches runs in background threads (the widget's); a run in
    the foreground cell is stopped with the kernel's interrupt button instead (it stops cleanly).

This module imports IPython: it is loaded only by ``%load_ext nbtrainer`` (never by ``import nbtrainer``).
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class

from nbtrainer._events._frontend import in_notebook
from nbtrainer._report._format import format_number
from nbtrainer._shell._doctor import DoctorReport, bad_device, doctor_report
from nbtrainer._shell._magics_args import PARSERS, full_usage, parse, parse_shape, split_list, usage_of

if TYPE_CHECKING:
    from nbtrainer._trainer._trainer import Trainer

__all__ = ["DoctorReport", "NbtrainerMagics", "doctor_report", "load", "unload"]

# =============================================================================================
# the magic
# =============================================================================================


@magics_class
class NbtrainerMagics(Magics):
    """The ``%nbtrainer`` line magic (see this module's docstring)."""

    # -- namespace ---------------------------------------------------------------------------
    @property
    def _user_ns(self) -> dict[str, Any]:
        """The notebook's namespace (a magic run by IPython always has its shell)."""
        if self.shell is None:
            raise UsageError("%nbtrainer runs in an IPython shell: load it with %load_ext nbtrainer")
        return self.shell.user_ns

    def _lookup(self, name: str, what: str) -> Any:
        """A name (or dotted attribute path, e.g. ``trainer.model``) from the user namespace; no eval."""
        if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", name):
            raise UsageError(f"{what} must be a variable name (optionally dotted), got {name!r}")
        head, *rest = name.split(".")
        ns = self._user_ns
        if head not in ns:
            raise UsageError(f"{what} {head!r} is not defined in the notebook's namespace")
        obj = ns[head]
        for attr in rest:
            try:
                obj = getattr(obj, attr)
            except AttributeError:
                raise UsageError(f"{what} {name!r}: {type(obj).__name__} has no attribute {attr!r}") from None
        return obj

    def _display(self, obj: Any) -> None:
        from IPython.display import display

        display(obj)

    # -- entry point ---------------------------------------------------------------------------
    @line_magic  # registered under the method's name: %nbtrainer
    def nbtrainer(self, line: str = "") -> Any:
        line = line.strip()
        if not line or line in ("help", "-h", "--help"):
            print(full_usage())
            return None
        sub, _, rest = line.partition(" ")
        if sub not in PARSERS:
            raise UsageError(f"%nbtrainer: unknown subcommand {sub!r}\n{full_usage()}")
        args = parse(sub, rest)
        if args is None:  # -h: the help was printed
            return None
        handler = getattr(self, "_cmd_" + ("doctor" if sub == "env" else sub).replace("-", "_"))
        return handler(args)

    # -- subcommands ---------------------------------------------------------------------------
    def _cmd_doctor(self, args: Any) -> None:
        devices = split_list(args.device) or None
        problem = bad_device(devices or [], command="%nbtrainer doctor")
        if problem:
            raise UsageError(f"%nbtrainer doctor: {problem}")
        report = doctor_report(devices)
        # shown wherever the magic stands in the cell, as the profile and compare magics show theirs (a returned
        # report showed only as a cell's last line); the object stays at hand for code
        self._user_ns["_nbt_doctor"] = report
        if in_notebook():
            self._display(report)
        else:
            print(report)
        return None

    def _cmd_profile(self, args: Any) -> None:
        import torch

        from nbtrainer._setup._precision import PrecisionError, normalize_precision, resolve_device

        model = self._lookup(args.model, "MODEL")
        if not isinstance(model, torch.nn.Module):
            raise UsageError(f"MODEL {args.model!r} is a {type(model).__name__}, not a torch.nn.Module")
        if bool(args.inputs) == bool(args.input_shape):
            raise UsageError(
                "%nbtrainer profile: give exactly one of --input-shape SHAPE or --inputs VAR\n" + usage_of("profile")
            )
        if args.inputs:
            example = self._lookup(args.inputs, "--inputs")
        else:
            shapes = [parse_shape(s) for s in args.input_shape]
            tensors = tuple(torch.randn(*s) for s in shapes)
            example = tensors[0] if len(tensors) == 1 else tensors
        try:
            precisions = tuple(normalize_precision(p) for p in split_list(args.precision))
        except PrecisionError as exc:
            raise UsageError(f"%nbtrainer profile: {exc}") from None
        try:
            devices = tuple(resolve_device(d) for d in split_list(args.device))
        except (RuntimeError, ValueError) as exc:
            raise UsageError(f"%nbtrainer profile: bad --device {args.device!r}: {exc}") from None
        if not precisions or not devices:
            raise UsageError("%nbtrainer profile: --device and --precision need a value\n" + usage_of("profile"))

        try:
            from nbtrainer import profile_model
        except ImportError as exc:
            raise UsageError(f"%nbtrainer profile: nbtrainer.profile_model is not available here ({exc})") from None
        try:
            profile = profile_model(model, example, devices=devices, precisions=precisions)
        except (RuntimeError, TypeError, ValueError) as exc:
            if not args.input_shape:  # the user's own tensors: the error is the model's, shown whole
                raise
            given = " ".join(args.input_shape)  # made up from --input-shape: a shape the model cannot take
            raise UsageError(f"%nbtrainer profile: the model cannot take inputs of shape {given}: {exc}") from None
        self._user_ns["_nbt_profile"] = profile
        if not in_notebook():  # terminal IPython: no front end to draw a widget, so the text (not its repr)
            print(profile)
            return None
        try:
            from nbtrainer import ProfileCard
        except (ImportError, AttributeError):
            card = None
        else:
            card = ProfileCard(profile)
        if card is not None:
            self._display(card)
        elif hasattr(profile, "_repr_html_"):
            from IPython.display import HTML

            self._display(HTML(profile._repr_html_()))
        else:
            self._display(profile)
        return None

    def _cmd_train(self, args: Any) -> None:
        if args.epochs < 1:
            raise UsageError(f"%nbtrainer train: --epochs must be >= 1, got {args.epochs}\n{usage_of('train')}")
        if args.accum < 1:
            raise UsageError(f"%nbtrainer train: --accum must be >= 1, got {args.accum}\n{usage_of('train')}")
        from nbtrainer._setup._precision import PrecisionError, normalize_precision

        try:
            precision = normalize_precision(args.precision)
        except PrecisionError as exc:
            raise UsageError(f"%nbtrainer train: {exc}") from None
        model = self._lookup(args.model, "MODEL")
        criterion = None if args.criterion == "None" else self._lookup(args.criterion, "CRITERION")
        optimizer = self._lookup(args.optimizer, "OPTIMIZER")
        train_loader = self._lookup(args.train_loader, "TRAIN_LOADER")
        val_loader = self._lookup(args.val_loader, "VAL_LOADER") if args.val_loader else None
        metrics = self._lookup(args.metrics, "--metrics") if args.metrics else None

        if not in_notebook():
            return self._train_here(args, model, criterion, optimizer, train_loader, val_loader, precision, metrics)
        from nbtrainer import TrainerWidget

        try:  # what the names hold is checked there: a wrong one is the user's argument, not a bug to trace
            widget = TrainerWidget(
                model,
                criterion,
                optimizer,
                train_loader,
                val_loader,
                epochs=args.epochs,
                precision=precision,
                grad_accum_steps=args.accum,
                metrics=metrics,
            )
        except (TypeError, ValueError) as exc:
            raise UsageError(f"%nbtrainer train: {exc}") from None
        self._user_ns["_nbt_widget"] = widget
        self._display(widget)
        return None

    def _train_here(
        self,
        args: Any,
        model: Any,
        criterion: Any,
        optimizer: Any,
        train_loader: Any,
        val_loader: Any,
        precision: str,
        metrics: Any,
    ) -> None:
        """Terminal IPython: no front end can show the panel, so train in the foreground with console
        progress (Ctrl-C stops at the next step and keeps the history)."""
        import sys

        from nbtrainer import Trainer

        try:
            trainer = Trainer(
                model, criterion, optimizer, precision=precision, grad_accum_steps=args.accum, metrics=metrics
            )
        except (TypeError, ValueError) as exc:
            raise UsageError(f"%nbtrainer train: {exc}") from None
        ns: dict[str, Any] = self.shell.user_ns if self.shell is not None else {}
        ns["_nbt_trainer"] = trainer
        print(
            "nbtrainer: no notebook front end here, so training runs in the foreground with console progress "
            "(trainer: _nbt_trainer, history: _nbt_history).",
            file=sys.stderr,
            flush=True,
        )
        ns["_nbt_history"] = trainer.fit(train_loader, val_loader, epochs=args.epochs)
        return None

    def _cmd_compare(self, args: Any) -> None:
        usage = usage_of("compare")
        for opt in ("steps", "epochs", "repeats"):
            value = getattr(args, opt)
            if value is not None and value < 1:
                raise UsageError(f"%nbtrainer compare: --{opt} must be >= 1, got {value}\n{usage}")
        if args.steps is not None and args.epochs is not None:
            raise UsageError(f"%nbtrainer compare: give --steps or --epochs, not both\n{usage}")
        from nbtrainer._compare import compare_strategies, resolve_strategies

        make_model = self._lookup(args.make_model, "MAKE_MODEL")
        if not callable(make_model) or hasattr(make_model, "parameters"):
            raise UsageError(
                f"MAKE_MODEL {args.make_model!r} must be a function returning a fresh model "
                "(each strategy trains its own copy), not a model"
            )
        optimizer = None if args.optimizer == "None" else self._lookup(args.optimizer, "OPTIMIZER")
        criterion = None if args.criterion == "None" else self._lookup(args.criterion, "CRITERION")
        train_loader = self._lookup(args.train_loader, "TRAIN_LOADER")
        val_loader = self._lookup(args.val_loader, "VAL_LOADER") if args.val_loader else None
        metrics = self._lookup(args.metrics, "--metrics") if args.metrics else None
        spec: Any = args.strategies
        if re.fullmatch(r"[A-Za-z_]\w*", spec) and isinstance(self._user_ns.get(spec), dict):
            spec = self._user_ns[spec]
        try:
            strategies = resolve_strategies(spec)
        except (TypeError, ValueError) as exc:
            raise UsageError(f"%nbtrainer compare: {exc}") from None
        metric = None if str(args.metric).lower() == "none" else args.metric
        if args.device != "auto":  # before anything is shown: a widget left at "0 done" behind a traceback helps no one
            from nbtrainer._setup._precision import resolve_device

            try:
                resolve_device(args.device)
            except (RuntimeError, ValueError) as exc:
                raise UsageError(f"%nbtrainer compare: bad --device {args.device!r}: {exc}") from None

        def progress(row: dict) -> None:
            done = "failed: " + str(row["reason"]) if row["status"] != "ok" else "done"
            print(f"  {row['name']}: {done}", flush=True)

        show_live = None
        if in_notebook():  # a widget needs a front end; terminal IPython gets the text table
            try:  # the widget layer is optional: without ipywidgets/bqplot the table's own HTML is shown
                from nbtrainer.widgets import CompareWidget
            except ImportError:
                pass
            else:
                show_live = CompareWidget.run
        print(f"Comparing {len(strategies)} strategies: {', '.join(strategies)}", flush=True)
        options = {
            "epochs": args.epochs,
            "steps": args.steps,
            "metric": metric,
            "metrics": metrics,
            "device": args.device,
            "repeats": args.repeats,
        }
        if show_live is not None:  # shown before the first strategy trains; rows and bars fill in as they come
            widget = show_live(
                make_model,
                optimizer,
                criterion,
                train_loader,
                val_loader,
                strategies,
                show=self._display,
                on_row=progress,
                **options,
            )
            table = widget.comparison
            self._user_ns["_nbt_compare_widget"] = widget
        else:
            table = compare_strategies(
                make_model, optimizer, criterion, train_loader, val_loader, strategies, on_row=progress, **options
            )
            if in_notebook():
                self._display(table)
            else:
                print(table)
        self._user_ns["_nbt_compare"] = table
        return None

    def _cmd_compare_inference(self, args: Any) -> None:
        import torch

        usage = usage_of("compare-inference")
        model = self._lookup(args.model, "MODEL")
        if not isinstance(model, torch.nn.Module):
            raise UsageError(f"MODEL {args.model!r} is a {type(model).__name__}, not a torch.nn.Module")
        loader = self._lookup(args.loader, "LOADER")
        models = self._lookup(args.models, "--models") if args.models else None
        if models is not None and not isinstance(models, dict):
            kind = type(models).__name__
            raise UsageError(f"--models {args.models!r} must name a dict {{name: model}}, not a {kind}")
        for opt in ("rounds", "max_batches"):
            value = getattr(args, opt)
            if value is not None and value < 1:
                raise UsageError(f"%nbtrainer compare-inference: --{opt.replace('_', '-')} must be >= 1\n{usage}")
        from nbtrainer import compare_inference

        try:
            table = compare_inference(
                model,
                loader,
                methods=split_list(args.methods),
                models=models,
                baseline=args.baseline,
                rounds=args.rounds,
                max_batches=args.max_batches,
            )
        except (TypeError, ValueError) as exc:
            raise UsageError(f"%nbtrainer compare-inference: {exc}") from None
        self._user_ns["_nbt_compare_inference"] = table
        if not in_notebook():  # terminal IPython: the text table
            print(table)
            return None
        try:  # the widget layer is optional: without ipywidgets/bqplot the table's own HTML is shown
            from nbtrainer.widgets import CompareWidget
        except ImportError:
            self._display(table)
        else:
            widget = CompareWidget(table)
            self._user_ns["_nbt_compare_inference_widget"] = widget
            self._display(widget)
        return None

    @staticmethod
    def _runs() -> list[Any]:
        from nbtrainer import Trainer

        return list(Trainer.active())

    @staticmethod
    def _describe(i: int, trainer: Trainer) -> str:
        p = trainer.progress
        parts = [f"[{i}] {type(trainer.model).__name__}", str(p.status or trainer.status)]
        parts.append(f"epoch {p.epoch}/{p.epochs}")
        total = f"/{format_number(p.total_steps)}" if p.total_steps else ""
        parts.append(f"step {format_number(p.global_step)}{total}")
        if p.loss is not None:
            parts.append(f"loss {format_number(p.loss)}")
        parts.append(f"{trainer.device} {trainer.precision}")
        return " · ".join(parts)

    def _cmd_status(self, args: Any) -> None:
        runs = self._runs()
        if not runs:
            print("No training runs in progress in this kernel.")
            return None
        print(f"{len(runs)} training run(s) in progress:")
        for i, t in enumerate(runs):
            print("  " + self._describe(i, t))
        print("Stop with `%nbtrainer stop` (all) or `%nbtrainer stop N`.")
        return None

    def _cmd_stop(self, args: Any) -> None:
        runs = self._runs()
        if not runs:
            print("No training runs in progress in this kernel.")
            return None
        if args.run is not None:
            if not 0 <= args.run < len(runs):
                raise UsageError(
                    f"%nbtrainer stop: no run {args.run}; runs are 0..{len(runs) - 1} (see %nbtrainer status)"
                )
            runs = [runs[args.run]]
        for t in runs:
            t.request_stop("stopped by %nbtrainer stop")
            print("stop requested: " + self._describe(runs.index(t) if args.run is None else args.run, t))
        if args.wait > 0:
            deadline = time.monotonic() + args.wait
            while time.monotonic() < deadline and any(t in self._runs() for t in runs):
                time.sleep(0.05)
            left = [t for t in runs if t in self._runs()]
            print("all stopped." if not left else f"{len(left)} run(s) still stopping after {args.wait:g}s.")
        else:
            print("The run(s) stop at the next optimizer step.")
        return None


NbtrainerMagics.nbtrainer.__doc__ = "%nbtrainer: train, profile and inspect from a notebook.\n\n" + full_usage()


def load(ipython: Any) -> None:
    """Register ``%nbtrainer`` (called by ``%load_ext nbtrainer``)."""
    ipython.register_magics(NbtrainerMagics)


def unload(ipython: Any) -> None:
    """Remove ``%nbtrainer`` (called by ``%unload_ext nbtrainer``)."""
    manager = ipython.magics_manager
    line = manager.magics.get("line", {})
    fn = line.get("nbtrainer")
    if fn is not None and isinstance(getattr(fn, "__self__", None), NbtrainerMagics):
        del line["nbtrainer"]
    manager.registry.pop(NbtrainerMagics.__name__, None)
