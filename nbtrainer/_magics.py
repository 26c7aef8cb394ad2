"""``%load_ext nbtrainer``: the ``%nbtrainer`` line magic.

Subcommands (``%nbtrainer help`` prints every usage):

``doctor`` (alias ``env``)
    torch version and build, devices, which precisions each device really runs (checked with a tiny
    autocast forward+backward, never guessed), the notebook packages, whether the front-end extensions
    are installed, the ipykernel background-thread bug range, and a concrete fix for each problem.
    Returns a :class:`DoctorReport` (text in a terminal, HTML in a notebook).
``profile MODEL (--input-shape 1,3,32,32 | --inputs VAR) [--device D] [--precision P]``
    ``nbtrainer.profile_model`` on a model of the namespace, shown as a ``ProfileCard``; the profile is
    stored as ``_nbt_profile``.
``train MODEL CRITERION OPTIMIZER TRAIN_LOADER [VAL_LOADER] [--epochs N] [--precision P] [--accum K] [--metrics VAR]``
    builds and shows a ``TrainerWidget`` from namespace names; stored as ``_nbt_widget``.
``status`` / ``stop [N] [--wait S]``
    the runs inside ``Trainer.fit`` in this kernel, and stopping them at the next optimizer step. A magic
    only runs when no cell is busy, so this reaches runs in background threads (the widget's); a run in
    the foreground cell is stopped with the kernel's interrupt button instead (it stops cleanly).

This module imports IPython: it is loaded only by ``%load_ext nbtrainer`` (never by ``import nbtrainer``).
"""

from __future__ import annotations

import html
import importlib.metadata as metadata
import json
import os
import platform
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from IPython.core import magic_arguments
from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class

__all__ = ["NbtrainerMagics", "DoctorReport", "doctor_report", "load", "unload"]

# ipykernel releases before 7.1 drop widget/comm messages sent from background threads (7.0.x) or
# deliver them only when the cell ends, so a training thread cannot update the panel live.
IPYKERNEL_THREAD_FIX = (7, 1)
# ipywidgets major -> the jupyterlab_widgets major whose front end speaks its protocol
_WIDGETS_FRONTEND_MAJOR = {7: 1, 8: 3}
LABEXTENSIONS = {
    "@jupyter-widgets/jupyterlab-manager": "jupyterlab_widgets",
    "bqplot": "bqplot",
}
PACKAGES = ("ipywidgets", "jupyterlab_widgets", "bqplot", "ipykernel", "jupyterlab", "notebook", "voila",
            "torchmetrics", "ptflops", "tqdm")


# =============================================================================================
# doctor
# =============================================================================================

@dataclass
class Check:
    """One line of the report: a label, a value, and whether it is fine."""

    label: str
    value: str
    ok: bool | None = None  # None: informational


@dataclass
class Problem:
    what: str
    fix: str


@dataclass
class DoctorReport:
    """What ``%nbtrainer doctor`` found. ``str(report)`` is the text; notebooks show ``_repr_html_``."""

    sections: list[tuple[str, list[Check]]] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def section(self, title: str) -> list[Check]:
        rows: list[Check] = []
        self.sections.append((title, rows))
        return rows

    def to_text(self) -> str:
        out = ["nbtrainer doctor"]
        for title, rows in self.sections:
            out.append("")
            out.append(title)
            width = max((len(r.label) for r in rows), default=0)
            for r in rows:
                mark = {True: "ok  ", False: "FAIL", None: "    "}[r.ok]
                out.append(f"  {mark} {r.label.ljust(width)}  {r.value}".rstrip())
        out.append("")
        if self.problems:
            out.append(f"problems ({len(self.problems)}), each with a fix:")
            for i, p in enumerate(self.problems, 1):
                out.append(f"  {i}. {p.what}")
                out.append(f"     fix: {p.fix}")
        else:
            out.append("problems: none found")
        if self.notes:
            out.append("")
            out.append("notes:")
            out.extend(f"  - {n}" for n in self.notes)
        return "\n".join(out)

    def __str__(self) -> str:
        return self.to_text()

    def __repr__(self) -> str:
        return self.to_text()

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(self.to_text())

    def _repr_html_(self) -> str:
        e = html.escape
        mark = {True: "&#x2714;", False: "&#x2718;", None: ""}
        color = {True: "#1a7f37", False: "#cf222e", None: "inherit"}
        parts = ['<div class="nbt-doctor" style="font-family:var(--jp-ui-font-family,sans-serif);'
                 'font-size:13px;line-height:1.4">',
                 "<h4 style='margin:4px 0'>nbtrainer doctor</h4>"]
        for title, rows in self.sections:
            parts.append(f"<div style='margin-top:8px;font-weight:600'>{e(title)}</div>")
            parts.append("<table style='border-collapse:collapse;margin-left:8px'>")
            for r in rows:
                parts.append(
                    f"<tr><td style='color:{color[r.ok]};padding:0 6px;text-align:center'>{mark[r.ok]}</td>"
                    f"<td style='padding:0 12px 0 {16 if r.label.startswith(' ') else 0}px;white-space:nowrap'>"
                    f"{e(r.label.strip())}</td>"
                    f"<td style='padding:0'><code>{e(r.value)}</code></td></tr>")
            parts.append("</table>")
        if self.problems:
            parts.append(f"<div style='margin-top:10px;font-weight:600;color:#cf222e'>"
                         f"Problems ({len(self.problems)})</div><ol style='margin:4px 0'>")
            for p in self.problems:
                parts.append(f"<li>{e(p.what)}<br><b>Fix:</b> <code>{e(p.fix)}</code></li>")
            parts.append("</ol>")
        else:
            parts.append("<div style='margin-top:10px;color:#1a7f37;font-weight:600'>No problems found.</div>")
        if self.notes:
            parts.append("<ul style='margin:6px 0;color:#57606a'>"
                         + "".join(f"<li>{e(n)}</li>" for n in self.notes) + "</ul>")
        parts.append("</div>")
        return "".join(parts)


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _vtuple(v: str | None) -> tuple[int, ...]:
    if not v:
        return ()
    nums = []
    for part in re.split(r"[.+-]", v):
        if not part.isdigit():
            break
        nums.append(int(part))
    return tuple(nums)


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _labextension_dirs() -> list[str]:
    try:
        from jupyter_core.paths import jupyter_path
    except ImportError:
        return []
    return jupyter_path("labextensions")


def _find_labextension(name: str, dirs: list[str]) -> tuple[str, str] | None:
    """``(version, directory)`` of an installed prebuilt lab extension, or None."""
    for d in dirs:
        pkg = Path(d, *name.split("/"), "package.json")
        if pkg.is_file():
            try:
                version = json.loads(pkg.read_text()).get("version", "?")
            except (OSError, ValueError):
                version = "?"
            return version, d
    return None


def _shell_kind() -> str:
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - this module imports IPython already
        return "plain Python"
    shell = get_ipython()
    name = type(shell).__name__ if shell is not None else "none"
    if name == "ZMQInteractiveShell":
        return "Jupyter kernel (ZMQInteractiveShell): widgets can be displayed"
    if name == "TerminalInteractiveShell":
        return "terminal IPython: widgets need a Jupyter front end (JupyterLab, Notebook 7, Voila)"
    return f"{name}: widgets need a Jupyter kernel and front end"


def doctor_report(devices: list[str] | None = None) -> DoctorReport:
    """Build the ``%nbtrainer doctor`` report (usable without IPython's magic machinery)."""
    import torch

    from nbtrainer import __version__
    from nbtrainer._precision import PRECISIONS, precision_support

    rep = DoctorReport()

    # -- torch --------------------------------------------------------------------------------
    rows = rep.section("torch")
    cuda_build = torch.version.cuda
    hip_build = getattr(torch.version, "hip", None)
    if cuda_build:
        build = f"CUDA {cuda_build} build"
    elif hip_build:
        build = f"ROCm {hip_build} build"
    else:
        build = "CPU build"
    rows.append(Check("version", f"{torch.__version__} ({build})"))
    if cuda_build and torch.backends.cudnn.is_available():
        rows.append(Check("cuDNN", str(torch.backends.cudnn.version())))
    rows.append(Check("CPU threads", f"{torch.get_num_threads()} (os.cpu_count() = {os.cpu_count()})"))
    rows.append(Check("nbtrainer", f"{__version__} on Python {platform.python_version()} ({platform.system()})"))

    # -- devices and precisions -----------------------------------------------------------------
    if devices is None:
        devices = ["cpu"]
        if torch.cuda.is_available():
            devices += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
        mps = getattr(torch.backends, "mps", None)
        if mps is not None and mps.is_available():
            devices.append("mps")
    if (cuda_build or hip_build) and not torch.cuda.is_available():
        rep.notes.append(
            "torch is a GPU build but no GPU is visible (driver, container flags or CUDA_VISIBLE_DEVICES). "
            "On a CPU-only machine the CPU build is much smaller: "
            "pip install torch --index-url https://download.pytorch.org/whl/cpu")
    rows = rep.section("devices and precisions (each checked with a real autocast forward + backward)")
    for dev in devices:
        if dev == "cpu":
            desc = _cpu_name()
        elif dev.startswith("cuda"):
            idx = torch.device(dev).index or 0
            props = torch.cuda.get_device_properties(idx)
            desc = (f"{props.name}, compute capability {props.major}.{props.minor}, "
                    f"{props.total_memory / 2**30:.1f} GiB")
        else:
            desc = dev
        rows.append(Check(dev, desc))
        try:
            support = precision_support(dev)
        except Exception as exc:  # noqa: BLE001 - a broken device is a finding, not a crash
            rows.append(Check("  precisions", f"could not be checked: {type(exc).__name__}: {exc}", False))
            rep.problems.append(Problem(
                f"device {dev} failed the precision check ({type(exc).__name__}: {exc})",
                "check the driver with `nvidia-smi` and that torch.version.cuda is supported by it; "
                "restart the kernel after changing drivers or CUDA_VISIBLE_DEVICES"))
            continue
        for name in PRECISIONS:
            ok, reason = support[name]
            rows.append(Check(f"  {name}", "supported" if ok else f"not available: {reason}", ok))

    # -- notebook packages ---------------------------------------------------------------------
    rows = rep.section("notebook packages")
    versions = {name: _version(name) for name in PACKAGES}
    for name in PACKAGES:
        v = versions[name]
        if v is None and name in ("notebook", "voila", "jupyterlab"):
            rows.append(Check(name, "not installed in this kernel's environment"))
            continue
        rows.append(Check(name, v or "NOT INSTALLED", None if v else False))

    ipw, jlw, bq, ipk = (versions[n] for n in ("ipywidgets", "jupyterlab_widgets", "bqplot", "ipykernel"))
    if ipw is None:
        rep.problems.append(Problem("ipywidgets is not installed: no panel, no notebook progress bars",
                                    'pip install "ipywidgets>=8.1"   (then restart the kernel)'))
    elif _vtuple(ipw) < (8, 1):
        rep.problems.append(Problem(f"ipywidgets {ipw} is older than 8.1, which nbtrainer's panel needs",
                                    'pip install -U "ipywidgets>=8.1" "jupyterlab_widgets>=3"   '
                                    "(then restart the kernel and reload the page)"))
    if ipw and jlw:
        want = _WIDGETS_FRONTEND_MAJOR.get(_vtuple(ipw)[:1][0] if _vtuple(ipw) else -1)
        if want is not None and _vtuple(jlw)[:1] != (want,):
            rep.problems.append(Problem(
                f"ipywidgets {ipw} needs jupyterlab_widgets {want}.x, found {jlw}: widgets show "
                "'Error displaying widget: model not found'",
                f'pip install -U "ipywidgets>=8.1" "jupyterlab_widgets>={want},<{want + 1}"   '
                "(in the environment that runs JupyterLab; then reload the page)"))
    if bq is None:
        rep.problems.append(Problem("bqplot is not installed: the panel's live charts need it",
                                    'pip install "bqplot>=0.13"   (then restart the kernel and reload the page)'))
    elif _vtuple(bq) < (0, 13):
        rep.problems.append(Problem(f"bqplot {bq} is older than 0.13", 'pip install -U "bqplot>=0.13"'))
    if ipk is None:
        rep.problems.append(Problem("ipykernel is not installed in this environment",
                                    'pip install "ipykernel>=7.1"'))
    elif _vtuple(ipk) < IPYKERNEL_THREAD_FIX:
        rep.problems.append(Problem(
            f"ipykernel {ipk} is in the thread-update bug range (< 7.1): widget and chart updates sent from "
            "a background thread (the training thread) do not reach the browser while it runs",
            'pip install -U "ipykernel>=7.1"   (then restart the kernel)'))
    else:
        rows.append(Check("thread updates", f"ipykernel {ipk} >= 7.1: live updates from the training thread work",
                          True))

    # -- front-end extensions -------------------------------------------------------------------
    rows = rep.section("front-end extensions (JupyterLab / Notebook 7 / Voila)")
    dirs = _labextension_dirs()
    for ext, dist in LABEXTENSIONS.items():
        found = _find_labextension(ext, dirs)
        if found:
            rows.append(Check(ext, f"{found[0]} in {found[1]}", True))
        else:
            rows.append(Check(ext, "not found", False))
            rep.problems.append(Problem(
                f"the {ext} front-end extension is not installed: widgets show 'Loading widget...' or "
                "'Error displaying widget'",
                f'pip install "{dist}"   (in the environment that runs JupyterLab/Voila; then restart the '
                "server and reload the page; `jupyter labextension list` shows what it sees)"))
    if dirs:
        rep.notes.append("Front-end extensions were looked up in this kernel's Jupyter paths; if JupyterLab runs "
                         "from another environment, check there with `jupyter labextension list`.")

    rows = rep.section("shell")
    rows.append(Check("front end", _shell_kind()))
    return rep


# =============================================================================================
# argument parsing: one MagicArgumentParser per subcommand
# =============================================================================================

def _subcommand(name: str, description: str) -> Callable[[Callable], Callable]:
    """Decorate a stub so magic_arguments builds a parser whose usage reads ``%nbtrainer <name> ...``."""
    def wrap(fn: Callable) -> Callable:
        fn.__doc__ = description
        return magic_arguments.magic_arguments(name=f"nbtrainer {name}")(fn)
    return wrap


@_subcommand("doctor", "Check torch, devices, precisions and the notebook stack; suggest fixes.")
@magic_arguments.argument("--device", action="append", metavar="DEV",
                          help="check only this device (repeatable); default: every device found")
def _doctor_args() -> None: ...


@_subcommand("profile", "Profile a model of the namespace (FLOPs, parameters, memory, latency).")
@magic_arguments.argument("model", metavar="MODEL", help="name of an nn.Module in the namespace")
@magic_arguments.argument("--input-shape", metavar="SHAPE", action="append",
                          help="shape of a random float input, e.g. 1,3,32,32 (repeat for several inputs)")
@magic_arguments.argument("--inputs", metavar="VAR",
                          help="name of the example inputs in the namespace (tensor, tuple or dict)")
@magic_arguments.argument("--device", default="auto", metavar="DEV",
                          help="auto | cpu | cuda | cuda:1 ..., or a comma list (default auto)")
@magic_arguments.argument("--precision", default="fp32", metavar="P",
                          help="fp32 | fp16-mixed | bf16-mixed, or a comma list (default fp32)")
def _profile_args() -> None: ...


@_subcommand("train", "Build and show a TrainerWidget from names in the namespace (stored as _nbt_widget).")
@magic_arguments.argument("model", metavar="MODEL")
@magic_arguments.argument("criterion", metavar="CRITERION", help="loss function (or None if the model returns .loss)")
@magic_arguments.argument("optimizer", metavar="OPTIMIZER")
@magic_arguments.argument("train_loader", metavar="TRAIN_LOADER")
@magic_arguments.argument("val_loader", metavar="VAL_LOADER", nargs="?", default=None,
                          help="validation loader (optional)")
@magic_arguments.argument("--epochs", type=int, default=1, metavar="N", help="number of epochs (default 1)")
@magic_arguments.argument("--precision", default="fp32", metavar="P", help="fp32 | fp16-mixed | bf16-mixed")
@magic_arguments.argument("--accum", type=int, default=1, metavar="K", help="gradient accumulation steps")
@magic_arguments.argument("--metrics", metavar="VAR", help="name of a dict of metrics in the namespace")
def _train_args() -> None: ...


@_subcommand("status", "List the training runs going on in this kernel.")
def _status_args() -> None: ...


@_subcommand("stop", "Stop the training runs in this kernel at the next optimizer step.")
@magic_arguments.argument("run", metavar="N", nargs="?", type=int, default=None,
                          help="the run number from %%nbtrainer status (default: all runs)")
@magic_arguments.argument("--wait", type=float, default=0.0, metavar="S",
                          help="wait up to S seconds for the runs to stop")
def _stop_args() -> None: ...


_PARSERS: dict[str, Callable] = {
    "doctor": _doctor_args,
    "env": _doctor_args,
    "profile": _profile_args,
    "train": _train_args,
    "status": _status_args,
    "stop": _stop_args,
}
_ORDER = ("doctor", "profile", "train", "status", "stop")


def _usage(fn: Callable) -> str:
    text = fn.parser.format_usage().strip()
    text = re.sub(r"^::\s*", "", text)
    text = " ".join(re.sub(r"^usage:\s*", "", text).split())  # one line: argparse wraps it oddly
    return "usage: " + (text if text.startswith("%") else "%" + text)


def full_usage() -> str:
    lines = ["%nbtrainer SUBCOMMAND [options]   (doctor alias: env)", ""]
    for name in _ORDER:
        fn = _PARSERS[name]
        lines.append(_usage(fn).removeprefix("usage: "))
        lines.append(f"    {fn.parser.description}")
    lines.append("")
    lines.append("%nbtrainer help  prints this; `%nbtrainer SUBCOMMAND -h` the options of one subcommand.")
    return "\n".join(lines)


def _parse(name: str, argstring: str) -> Any:
    fn = _PARSERS[name]
    if re.search(r"(^|\s)(-h|--help)(\s|$)", argstring):
        help_text = fn.parser.format_help()
        print(_usage(fn) + help_text[help_text.find("\n\n", len("::\n\n")):].rstrip())
        return None
    try:
        return fn.parser.parse_argstring(argstring)
    except UsageError as exc:
        raise UsageError(f"%nbtrainer {name}: {exc}\n{_usage(fn)}") from None
    except ValueError as exc:  # unbalanced quotes from shlex
        raise UsageError(f"%nbtrainer {name}: {exc}\n{_usage(fn)}") from None


def _split_list(value: str | list[str] | None) -> list[str]:
    if value is None:
        return []
    items = value if isinstance(value, list) else [value]
    return [p.strip() for item in items for p in item.split(",") if p.strip()]


def _parse_shape(text: str) -> tuple[int, ...]:
    parts = [p for p in re.split(r"[,x\s()\[\]]+", text.strip()) if p]
    try:
        shape = tuple(int(p) for p in parts)
    except ValueError:
        shape = ()
    if not shape or any(d <= 0 for d in shape):
        raise UsageError(f"%nbtrainer profile: bad --input-shape {text!r}: use positive integers like 1,3,32,32\n"
                         f"{_usage(_profile_args)}")
    return shape


# =============================================================================================
# the magic
# =============================================================================================

@magics_class
class NbtrainerMagics(Magics):
    """The ``%nbtrainer`` line magic (see this module's docstring)."""

    # -- namespace ---------------------------------------------------------------------------
    def _lookup(self, name: str, what: str) -> Any:
        """A name (or dotted attribute path, e.g. ``trainer.model``) from the user namespace; no eval."""
        if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", name):
            raise UsageError(f"{what} must be a variable name (optionally dotted), got {name!r}")
        head, *rest = name.split(".")
        ns = self.shell.user_ns
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
    @line_magic("nbtrainer")
    def nbtrainer(self, line: str = "") -> Any:
        line = line.strip()
        if not line or line in ("help", "-h", "--help"):
            print(full_usage())
            return None
        sub, _, rest = line.partition(" ")
        if sub not in _PARSERS:
            raise UsageError(f"%nbtrainer: unknown subcommand {sub!r}\n{full_usage()}")
        args = _parse(sub, rest)
        if args is None:  # -h: the help was printed
            return None
        handler = getattr(self, "_cmd_" + ("doctor" if sub == "env" else sub))
        return handler(args)

    # -- subcommands ---------------------------------------------------------------------------
    def _cmd_doctor(self, args: Any) -> DoctorReport:
        devices = _split_list(args.device) or None
        if devices:
            import torch

            for dev in devices:
                try:
                    torch.device(dev)
                except (RuntimeError, ValueError) as exc:
                    raise UsageError(f"%nbtrainer doctor: bad --device {dev!r}: {exc}") from None
        return doctor_report(devices)

    def _cmd_profile(self, args: Any) -> None:
        import torch

        from nbtrainer._precision import PrecisionError, normalize_precision, resolve_device

        model = self._lookup(args.model, "MODEL")
        if not isinstance(model, torch.nn.Module):
            raise UsageError(f"MODEL {args.model!r} is a {type(model).__name__}, not a torch.nn.Module")
        if bool(args.inputs) == bool(args.input_shape):
            raise UsageError("%nbtrainer profile: give exactly one of --input-shape SHAPE or --inputs VAR\n"
                             + _usage(_profile_args))
        if args.inputs:
            example = self._lookup(args.inputs, "--inputs")
        else:
            shapes = [_parse_shape(s) for s in args.input_shape]
            tensors = tuple(torch.randn(*s) for s in shapes)
            example = tensors[0] if len(tensors) == 1 else tensors
        try:
            precisions = tuple(normalize_precision(p) for p in _split_list(args.precision))
        except PrecisionError as exc:
            raise UsageError(f"%nbtrainer profile: {exc}") from None
        try:
            devices = tuple(resolve_device(d) for d in _split_list(args.device))
        except (RuntimeError, ValueError) as exc:
            raise UsageError(f"%nbtrainer profile: bad --device {args.device!r}: {exc}") from None
        if not precisions or not devices:
            raise UsageError("%nbtrainer profile: --device and --precision need a value\n" + _usage(_profile_args))

        try:
            from nbtrainer import profile_model
        except ImportError as exc:
            raise UsageError(f"%nbtrainer profile: nbtrainer.profile_model is not available here ({exc})") from None
        profile = profile_model(model, example, devices=devices, precisions=precisions)
        self.shell.user_ns["_nbt_profile"] = profile
        try:
            from nbtrainer import ProfileCard
        except (ImportError, AttributeError):
            ProfileCard = None  # noqa: N806 - the widget layer is not there: show the profile's own HTML
        if ProfileCard is not None:
            self._display(ProfileCard(profile))
        elif hasattr(profile, "_repr_html_"):
            from IPython.display import HTML

            self._display(HTML(profile._repr_html_()))
        else:
            self._display(profile)
        return None

    def _cmd_train(self, args: Any) -> None:
        if args.epochs < 1:
            raise UsageError(f"%nbtrainer train: --epochs must be >= 1, got {args.epochs}\n{_usage(_train_args)}")
        if args.accum < 1:
            raise UsageError(f"%nbtrainer train: --accum must be >= 1, got {args.accum}\n{_usage(_train_args)}")
        from nbtrainer._precision import PrecisionError, normalize_precision

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

        from nbtrainer import TrainerWidget

        widget = TrainerWidget(model, criterion, optimizer, train_loader, val_loader, epochs=args.epochs,
                               precision=precision, grad_accum_steps=args.accum, metrics=metrics)
        self.shell.user_ns["_nbt_widget"] = widget
        self._display(widget)
        return None

    @staticmethod
    def _runs() -> list[Any]:
        from nbtrainer import Trainer

        return list(Trainer.active())

    @staticmethod
    def _describe(i: int, trainer: Any) -> str:
        p = getattr(trainer, "progress", None)
        model = type(getattr(trainer, "model", None)).__name__
        parts = [f"[{i}] {model}"]
        status = getattr(p, "status", None) or getattr(trainer, "status", "?")
        parts.append(status)
        if p is not None:
            parts.append(f"epoch {p.epoch}/{p.epochs}")
            total = f"/{p.total_steps}" if p.total_steps else ""
            parts.append(f"step {p.global_step}{total}")
            if p.loss is not None:
                parts.append(f"loss {p.loss:.4g}")
        parts.append(f"{getattr(trainer, 'device', '?')} {getattr(trainer, 'precision', '')}".strip())
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
                raise UsageError(f"%nbtrainer stop: no run {args.run}; runs are 0..{len(runs) - 1} "
                                 "(see %nbtrainer status)")
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
