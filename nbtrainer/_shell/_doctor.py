"""``%nbtrainer doctor`` / ``nbtrainer doctor``: what this environment can do for nbtrainer, and a fix for each problem.

torch version and build, devices, which precisions each device really runs (checked with a tiny
autocast forward+backward, never guessed), the notebook packages, whether the front-end extensions are
installed, the ipykernel background-thread bug range. No IPython import: usable from scripts too.
"""

from __future__ import annotations

import html
import importlib.metadata as metadata
import json
import logging
import os
import platform
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nbtrainer._report._format import format_bytes, text_html

__all__ = ["Check", "DoctorReport", "Problem", "bad_device", "doctor_report"]

log = logging.getLogger(__name__)

# ipykernel 7.0.x drops widget/comm messages sent from background threads, so a training thread cannot update the
# panel live (fixed in 7.1). 6.17 to 6.x deliver them (Google Colab's 6.17.1 is tested: issue 45).
IPYKERNEL_THREAD_FIX = (7, 1)
IPYKERNEL_FLOOR = (6, 17)
# ipywidgets major -> the jupyterlab_widgets major whose front end speaks its protocol
_WIDGETS_FRONTEND_MAJOR = {7: 1, 8: 3}
LABEXTENSIONS = {
    "@jupyter-widgets/jupyterlab-manager": "jupyterlab_widgets",
    "bqplot": "bqplot",
}
PACKAGES = (
    "ipywidgets",
    "jupyterlab_widgets",
    "bqplot",
    "ipykernel",
    "jupyterlab",
    "notebook",
    "voila",
    "torchmetrics",
    "ptflops",
    "tqdm",
)


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
        parts = [
            '<div class="nbt-doctor" style="font-family:var(--jp-ui-font-family,sans-serif);'
            'font-size:13px;line-height:1.4">',
            "<h4 style='margin:4px 0'>nbtrainer doctor</h4>",
        ]
        for title, rows in self.sections:
            parts.append(f"<div style='margin-top:8px;font-weight:600'>{e(title)}</div>")
            parts.append("<table style='border-collapse:collapse;margin-left:8px'>")
            for r in rows:
                parts.append(
                    f"<tr><td style='color:{color[r.ok]};padding:0 6px;text-align:center'>{mark[r.ok]}</td>"
                    f"<td style='padding:0 12px 0 {16 if r.label.startswith(' ') else 0}px;white-space:nowrap'>"
                    f"{e(r.label.strip())}</td>"
                    f"<td style='padding:0'><code>{e(r.value)}</code></td></tr>"
                )
            parts.append("</table>")
        if self.problems:
            parts.append(
                f"<div style='margin-top:10px;font-weight:600;color:#cf222e'>"
                f"Problems ({len(self.problems)})</div><ol style='margin:4px 0'>"
            )
            for p in self.problems:
                parts.append(f"<li>{e(p.what)}<br><b>Fix:</b> <code>{e(p.fix)}</code></li>")
            parts.append("</ol>")
        else:
            parts.append("<div style='margin-top:10px;color:#1a7f37;font-weight:600'>No problems found.</div>")
        if self.notes:
            parts.append(
                "<ul style='margin:6px 0;color:#57606a'>"
                + "".join(f"<li>{text_html(n)}</li>" for n in self.notes)
                + "</ul>"
            )
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
    ipython = sys.modules.get("IPython")  # never imported from here: the CLI runs without it
    shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
    if shell is None:
        return "plain Python (no IPython shell): widgets need a Jupyter front end (JupyterLab, Notebook 7, Voila)"
    name = type(shell).__name__
    if name == "ZMQInteractiveShell":
        return "Jupyter kernel (ZMQInteractiveShell): widgets can be displayed"
    if name == "TerminalInteractiveShell":
        return "terminal IPython: widgets need a Jupyter front end (JupyterLab, Notebook 7, Voila)"
    return f"{name}: widgets need a Jupyter kernel and front end"


def _unavailable(dev: Any) -> str | None:
    """Why torch cannot use the parsed device ``dev`` here, or None."""
    import torch

    if dev.type == "cpu":
        return None
    if dev.type == "cuda":
        if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
            return (
                f"this torch ({torch.__version__}) is a CPU build, without CUDA: install a CUDA build "
                "(https://pytorch.org/get-started/locally)"
            )
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            return "no CUDA GPU is visible (driver, container flags or CUDA_VISIBLE_DEVICES); check with nvidia-smi"
        if (dev.index or 0) >= count:
            return f"{dev} does not exist: {count} GPU(s) visible, cuda:0 to cuda:{count - 1}"
        return None
    if dev.type == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is not None and mps.is_available():
            return None
        return "MPS (the Apple GPU) is not available here: it needs macOS on Apple silicon and a torch built with MPS"
    backend = getattr(torch, dev.type, None)  # xpu, mtia...: torch.<type>.is_available()
    available = getattr(backend, "is_available", None)
    if callable(available):
        try:
            if available():
                return None
        except Exception:
            log.debug("the device backend's is_available() failed: the device is reported unusable", exc_info=True)
    return f"torch has no usable {dev.type!r} device here"


def bad_device(devices: list[str], *, command: str = "nbtrainer doctor") -> str | None:
    """``bad --device 'x': <reason and fix>`` for the first name torch cannot parse or this machine cannot use,
    else None (the CLI and ``%nbtrainer doctor`` refuse it, in one line, before any check runs). ``command``: what
    the user typed, named in the fix (``%nbtrainer doctor`` in a notebook)."""
    if not devices:
        return None
    import torch

    for dev in devices:
        try:
            parsed = torch.device(dev)
        except (RuntimeError, ValueError) as exc:
            return f"bad --device {dev!r}: {exc}"
        reason = _unavailable(parsed)
        if reason:
            return f"bad --device {dev!r}: {reason}; `{command}` without --device checks what is here"
    return None


def doctor_report(devices: list[str] | None = None) -> DoctorReport:
    """Build the ``%nbtrainer doctor`` report (usable without IPython's magic machinery)."""
    import torch

    from nbtrainer import __version__
    from nbtrainer._setup._precision import PRECISIONS, precision_support

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
            "pip install torch --index-url https://download.pytorch.org/whl/cpu"
        )
    rows = rep.section("devices and precisions (each checked with a real autocast forward + backward)")
    for dev in devices:
        if dev == "cpu":
            desc = _cpu_name()
        elif dev.startswith("cuda"):
            idx = torch.device(dev).index or 0
            props = torch.cuda.get_device_properties(idx)
            desc = f"{props.name}, compute capability {props.major}.{props.minor}, {format_bytes(props.total_memory)}"
        else:
            desc = dev
        rows.append(Check(dev, desc))
        try:
            support = precision_support(dev)
        except Exception as exc:
            log.debug("precision support could not be checked: a problem row says why", exc_info=True)
            rows.append(Check("  precisions", f"could not be checked: {type(exc).__name__}: {exc}", False))
            rep.problems.append(
                Problem(
                    f"device {dev} failed the precision check ({type(exc).__name__}: {exc})",
                    "check the driver with `nvidia-smi` and that torch.version.cuda is supported by it; "
                    "restart the kernel after changing drivers or CUDA_VISIBLE_DEVICES",
                )
            )
            continue
        for name in PRECISIONS:
            ok, reason = support[name]
            first = (reason or "").strip().splitlines()[:1]  # a dispatcher error lists every backend after it
            rows.append(Check(f"  {name}", "supported" if ok else f"not available: {''.join(first)}", ok))

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
        rep.problems.append(
            Problem(
                "ipywidgets is not installed: no panel, no notebook progress bars",
                'pip install "ipywidgets>=7.7"   (then restart the kernel)',
            )
        )
    elif _vtuple(ipw) < (7, 7):
        rep.problems.append(
            Problem(
                f"ipywidgets {ipw} is older than 7.7, which nbtrainer's panel needs",
                'pip install -U "ipywidgets>=7.7,<9"   (then restart the kernel and reload the page)',
            )
        )
    if ipw and jlw and versions["jupyterlab"]:  # jupyterlab_widgets is JupyterLab's front end only
        want = _WIDGETS_FRONTEND_MAJOR.get(_vtuple(ipw)[:1][0] if _vtuple(ipw) else -1)
        if want is not None and _vtuple(jlw)[:1] != (want,):
            rep.problems.append(
                Problem(
                    f"ipywidgets {ipw} needs jupyterlab_widgets {want}.x, found {jlw}: widgets show "
                    "'Error displaying widget: model not found'",
                    f'pip install -U "ipywidgets>=8.1" "jupyterlab_widgets>={want},<{want + 1}"   '
                    "(in the environment that runs JupyterLab; then reload the page)",
                )
            )
    if bq is None:
        rep.problems.append(
            Problem(
                "bqplot is not installed: the panel's live charts need it",
                'pip install "bqplot>=0.12,<0.14"   (then restart the kernel and reload the page)',
            )
        )
    elif _vtuple(bq) < (0, 12):
        rep.problems.append(Problem(f"bqplot {bq} is older than 0.12", 'pip install -U "bqplot>=0.12,<0.14"'))
    if ipk is None:
        rep.problems.append(Problem("ipykernel is not installed in this environment", 'pip install "ipykernel>=6.17"'))
    elif _vtuple(ipk) < IPYKERNEL_FLOOR:
        rep.problems.append(
            Problem(
                f"ipykernel {ipk} is older than 6.17", 'pip install -U "ipykernel>=6.17"   (then restart the kernel)'
            )
        )
    elif (7, 0) <= _vtuple(ipk)[:2] < IPYKERNEL_THREAD_FIX:
        rep.problems.append(
            Problem(
                f"ipykernel {ipk} is in the thread-update bug range (< 7.1): widget and chart updates sent from "
                "a background thread (the training thread) do not reach the browser while it runs",
                'pip install -U "ipykernel>=7.1"   (then restart the kernel)',
            )
        )
    else:
        rows.append(Check("thread updates", f"ipykernel {ipk}: live updates from the training thread work", True))

    # -- front-end extensions -------------------------------------------------------------------
    rows = rep.section("front-end extensions (JupyterLab / Notebook 7 / Voila)")
    dirs = _labextension_dirs()
    for ext, dist in LABEXTENSIONS.items():
        found = _find_labextension(ext, dirs)
        if found:
            rows.append(Check(ext, f"{found[0]} in {found[1]}", True))
        else:
            rows.append(Check(ext, "not found", False))
            rep.problems.append(
                Problem(
                    f"the {ext} front-end extension is not installed: widgets show 'Loading widget...' or "
                    "'Error displaying widget'",
                    f'pip install "{dist}"   (in the environment that runs JupyterLab/Voila; then restart the '
                    "server and reload the page; `jupyter labextension list` shows what it sees)",
                )
            )
    if dirs:
        rep.notes.append(
            "Front-end extensions were looked up in this kernel's Jupyter paths; if JupyterLab runs "
            "from another environment, check there with `jupyter labextension list`."
        )

    rows = rep.section("shell")
    rows.append(Check("front end", _shell_kind()))
    return rep
