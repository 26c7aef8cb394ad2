"""The command line: ``python -m nbtrainer`` and the ``nbtrainer`` console script.

``nbtrainer doctor`` is ``%nbtrainer doctor`` for a terminal (torch build, devices, the precisions each
really runs, the notebook stack, a fix for each problem); ``nbtrainer checkpoint PATH`` says where a saved
run stands and how to continue it. ``--help`` and ``--version`` import neither torch nor IPython.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["build_parser", "main"]

_EPILOG = """examples:
  nbtrainer doctor                  check this environment (exit status 1 with --strict when a problem is found)
  nbtrainer doctor --device cuda:0  one device only
  nbtrainer checkpoint ckpt/last.ckpt
  python -m nbtrainer --help        the same, without the console script

In a notebook: %load_ext nbtrainer, then %nbtrainer help."""


def build_parser() -> argparse.ArgumentParser:
    from nbtrainer import __version__

    parser = argparse.ArgumentParser(
        prog="nbtrainer",
        description="nbtrainer: fast, visible, controllable PyTorch training in Jupyter and in scripts.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"nbtrainer {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    doctor = sub.add_parser(
        "doctor",
        help="check torch, devices, precisions and the notebook stack; suggest a fix for each problem",
        description="Check torch, devices, the precisions each device really runs, and the notebook stack.",
    )
    doctor.add_argument(
        "--device", action="append", metavar="DEV", help="check only this device (repeatable); default: all found"
    )
    doctor.add_argument("--strict", action="store_true", help="exit with status 1 when a problem is found")
    ckpt = sub.add_parser(
        "checkpoint",
        help="show where a saved run stands (epoch, step, status, schedule) and how to continue it",
        description="Show where a checkpoint's run stands and how to continue it (loads with weights_only=True).",
    )
    ckpt.add_argument("path", metavar="PATH", help="a checkpoint file (e.g. ckpt/last.ckpt)")
    return parser


def _doctor(args: argparse.Namespace) -> int:
    from nbtrainer._shell._doctor import bad_device, doctor_report

    problem = bad_device(args.device or [])
    if problem:
        print(f"nbtrainer doctor: {problem}", file=sys.stderr)
        return 2
    report = doctor_report(args.device)
    print(report.to_text())
    return 1 if args.strict and report.problems else 0


def _checkpoint(args: argparse.Namespace) -> int:
    from nbtrainer._resume._checkpoint_io import CheckpointError, load_checkpoint

    try:
        ckpt = load_checkpoint(args.path, map_location="cpu")
    except (CheckpointError, OSError) as exc:
        print(f"nbtrainer checkpoint: {exc}", file=sys.stderr)
        return 1
    print(describe_checkpoint(ckpt, args.path))
    return 0


def describe_checkpoint(ckpt: dict[str, Any], path: str) -> str:
    """A few lines on a loaded checkpoint: position, status, config, schedule left, last epoch's values."""
    from nbtrainer._events._progress import format_logs
    from nbtrainer._report._format import format_duration, format_number
    from nbtrainer._resume._continue import completed_epochs, schedule_capacity

    loop, config, history = ckpt.get("loop", {}), ckpt.get("config", {}), ckpt.get("history", {})
    epochs = history.get("epochs", [])
    done = completed_epochs(loop)
    where = f"{done} epoch(s) complete" + (
        "" if loop.get("epoch_complete") else f", {loop.get('batch', 0)} batch(es) into the next"
    )
    lines = [
        f"checkpoint {path}",
        f"  position   {where}, step {format_number(int(loop.get('global_step', 0)))}",
        f"  status     {_status(history)}",
        f"  config     {config.get('optimizer')}, scheduler {config.get('scheduler')}, "
        f"precision {config.get('precision')}, grad_accum_steps={config.get('grad_accum_steps')}, "
        f"trained {format_duration(config.get('elapsed', 0.0))}",
    ]
    capacity = schedule_capacity(config.get("scheduler") or "", ckpt.get("scheduler") or {})
    if capacity is not None:
        total, taken = capacity
        lines.append(f"  schedule   {config.get('scheduler')}: {total - taken} of total_steps={total} left")
    if epochs:
        lines.append(f"  last epoch {epochs[-1].get('epoch')}: {format_logs(epochs[-1])}")
    planned = config.get("epochs")
    complete = bool(loop.get("epoch_complete"))
    # max_steps is a planned end of one fit ("finished" in its History), not of the run's epochs
    by_max_steps = str(history.get("stop_reason") or "").startswith("max_steps")
    if planned is not None:
        finished = complete and done >= int(planned)
    else:  # saved between fits by an earlier version, without the planned epochs: the History's word
        finished = complete and history.get("status") == "finished" and not by_max_steps
    if by_max_steps and not finished:
        of = f" of {planned} planned" if planned is not None else ""
        lines[2] = f"  status     {history['stop_reason']}: the fit ended there, {done}{of} epoch(s) complete"
    used_up = capacity is not None and capacity[0] - capacity[1] <= 0
    more = f"trainer.fit_more(train_loader, val_loader, epochs=N, resume_from={path!r}"
    more += ", scheduler=fn | None)" if used_up else ")"
    if finished:
        lines[2] = f"  status     finished: all {planned if planned is not None else done} planned epoch(s) done"
        lines.append(f"  continue   nothing left of this run; N more epochs: {more}")
        if used_up:
            lines.append(f"             (its {config.get('scheduler')} is used up: give a fresh schedule, or None)")
    else:
        planned_text = str(planned) if planned is not None else "TOTAL"
        left = f" ({int(planned) - done} epoch(s) left)" if planned is not None else ""
        lines.append(
            f"  continue   trainer.fit(train_loader, val_loader, epochs={planned_text}, resume_from={path!r}) "
            f"to finish the planned run{left}, or {more} for N more epochs"
        )
    return "\n".join(lines)


def _status(history: dict[str, Any]) -> str:
    status = history.get("status", "?")
    if status == "running":
        return "saved during the run"
    return status + (f" ({history['stop_reason']})" if history.get("stop_reason") else "")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "doctor":
        return _doctor(args)
    if args.command == "checkpoint":
        return _checkpoint(args)
    parser.print_help()
    return 0
