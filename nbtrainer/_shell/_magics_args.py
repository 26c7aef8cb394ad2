"""The ``%nbtrainer`` subcommands' arguments: one ``MagicArgumentParser`` per subcommand, usage texts, parsing.

Imports IPython: loaded only through ``nbtrainer._shell._magics`` (``%load_ext nbtrainer``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from IPython.core import magic_arguments
from IPython.core.error import UsageError
from IPython.core.magic_arguments import MagicArgumentParser

__all__ = ["PARSERS", "full_usage", "parse", "parse_shape", "split_list", "usage", "usage_of"]


def _subcommand(name: str, description: str) -> Callable[[Callable[[], None]], MagicArgumentParser]:
    """Decorate a stub that carries ``magic_arguments.argument`` decorators: the stub's name then holds the
    parser magic_arguments builds from them, whose usage reads ``%nbtrainer <name> ...``."""

    def wrap(fn: Callable[[], None]) -> MagicArgumentParser:
        fn.__doc__ = description
        parser: MagicArgumentParser = magic_arguments.magic_arguments(name=f"nbtrainer {name}")(fn).parser
        return parser

    return wrap


@_subcommand("doctor", "Check torch, devices, precisions and the notebook stack; suggest fixes.")
@magic_arguments.argument(
    "--device", action="append", metavar="DEV", help="check only this device (repeatable); default: every device found"
)
def _doctor_args() -> None: ...


@_subcommand("profile", "Profile a model of the namespace (FLOPs, parameters, memory, latency).")
@magic_arguments.argument("model", metavar="MODEL", help="name of an nn.Module in the namespace")
@magic_arguments.argument(
    "--input-shape",
    metavar="SHAPE",
    action="append",
    help="shape of a random float input, e.g. 1,3,32,32 (repeat for several inputs)",
)
@magic_arguments.argument(
    "--inputs", metavar="VAR", help="name of the example inputs in the namespace (tensor, tuple or dict)"
)
@magic_arguments.argument(
    "--device", default="auto", metavar="DEV", help="auto | cpu | cuda | cuda:1 ..., or a comma list (default auto)"
)
@magic_arguments.argument(
    "--precision", default="fp32", metavar="P", help="fp32 | fp16-mixed | bf16-mixed, or a comma list (default fp32)"
)
def _profile_args() -> None: ...


@_subcommand("train", "Build and show a TrainerWidget from names in the namespace (stored as _nbt_widget).")
@magic_arguments.argument("model", metavar="MODEL")
@magic_arguments.argument("criterion", metavar="CRITERION", help="loss function (or None if the model returns .loss)")
@magic_arguments.argument("optimizer", metavar="OPTIMIZER")
@magic_arguments.argument("train_loader", metavar="TRAIN_LOADER")
@magic_arguments.argument(
    "val_loader", metavar="VAL_LOADER", nargs="?", default=None, help="validation loader (optional)"
)
@magic_arguments.argument("--epochs", type=int, default=1, metavar="N", help="number of epochs (default 1)")
@magic_arguments.argument("--precision", default="fp32", metavar="P", help="fp32 | fp16-mixed | bf16-mixed")
@magic_arguments.argument("--accum", type=int, default=1, metavar="K", help="gradient accumulation steps")
@magic_arguments.argument("--metrics", metavar="VAR", help="name of a dict of metrics in the namespace")
def _train_args() -> None: ...


@_subcommand(
    "compare", "Train once per strategy; compare step time, memory, loss and a metric (stored as _nbt_compare)."
)
@magic_arguments.argument("make_model", metavar="MAKE_MODEL", help="name of a function returning a fresh model")
@magic_arguments.argument(
    "optimizer", metavar="OPTIMIZER", help="optimizer class or callable params -> optimizer, or None (AdamW)"
)
@magic_arguments.argument("criterion", metavar="CRITERION", help="loss function (or None if the model returns .loss)")
@magic_arguments.argument("train_loader", metavar="TRAIN_LOADER")
@magic_arguments.argument(
    "val_loader", metavar="VAL_LOADER", nargs="?", default=None, help="validation loader (optional)"
)
@magic_arguments.argument(
    "--strategies",
    default="fp32,bf16,ckpt,accum4,adafactor",
    metavar="LIST|VAR",
    help="comma list of presets (fp32, fp16, bf16, ckpt, accumN, adafactor, all) or the "
    "name of a dict {name: {trainer options}}",
)
@magic_arguments.argument(
    "--steps", type=int, default=None, metavar="N", help="optimizer steps per strategy (default: one epoch)"
)
@magic_arguments.argument("--epochs", type=int, default=None, metavar="N", help="epochs per strategy")
@magic_arguments.argument("--metric", default="val_acc", metavar="KEY", help="validation key to report, or none")
@magic_arguments.argument("--metrics", metavar="VAR", help="name of a dict of metrics in the namespace")
@magic_arguments.argument("--device", default="auto", metavar="DEV")
@magic_arguments.argument("--repeats", type=int, default=1, metavar="R", help="round-robin repeats for timings")
def _compare_args() -> None: ...


@_subcommand(
    "compare-inference",
    "Size, latency and metric of a model under each quantization method, and of other models "
    "(stored as _nbt_compare_inference).",
)
@magic_arguments.argument("model", metavar="MODEL", help="name of the trained nn.Module (the baseline's model)")
@magic_arguments.argument("loader", metavar="LOADER", help="name of the batches to run (a validation loader)")
@magic_arguments.argument(
    "--methods",
    default="fp32,bf16,int8-dynamic,int8-weight,int4-weight,codebook4",
    metavar="LIST",
    help="comma list of fp32, bf16, int8-dynamic, int8-weight, int4-weight, codebook4",
)
@magic_arguments.argument("--models", metavar="VAR", help="name of a dict {name: model} to compare too")
@magic_arguments.argument("--baseline", default="fp32", metavar="NAME", help="the variant ratios refer to")
@magic_arguments.argument("--rounds", type=int, default=5, metavar="R", help="timed rounds (default 5)")
@magic_arguments.argument("--max-batches", type=int, default=None, metavar="N", help="use the first N batches")
def _compare_inference_args() -> None: ...


@_subcommand("status", "List the training runs going on in this kernel.")
def _status_args() -> None: ...


@_subcommand("stop", "Stop the training runs in this kernel at the next optimizer step.")
@magic_arguments.argument(
    "run",
    metavar="N",
    nargs="?",
    type=int,
    default=None,
    help="the run number from %%nbtrainer status (default: all runs)",
)
@magic_arguments.argument(
    "--wait", type=float, default=0.0, metavar="S", help="wait up to S seconds for the runs to stop"
)
def _stop_args() -> None: ...


PARSERS: dict[str, MagicArgumentParser] = {
    "doctor": _doctor_args,
    "env": _doctor_args,
    "profile": _profile_args,
    "train": _train_args,
    "compare": _compare_args,
    "compare-inference": _compare_inference_args,
    "status": _status_args,
    "stop": _stop_args,
}
_ORDER = ("doctor", "profile", "train", "compare", "compare-inference", "status", "stop")


def usage(parser: MagicArgumentParser) -> str:
    text = parser.format_usage().strip()
    text = re.sub(r"^::\s*", "", text)
    text = " ".join(re.sub(r"^usage:\s*", "", text).split())  # one line: argparse wraps it oddly
    return "usage: " + (text if text.startswith("%") else "%" + text)


def full_usage() -> str:
    lines = ["%nbtrainer SUBCOMMAND [options]   (doctor alias: env)", ""]
    for name in _ORDER:
        parser = PARSERS[name]
        lines.append(usage(parser).removeprefix("usage: "))
        lines.append(f"    {parser.description}")
    lines.append("")
    lines.append("%nbtrainer help  prints this; `%nbtrainer SUBCOMMAND -h` the options of one subcommand.")
    return "\n".join(lines)


def parse(name: str, argstring: str) -> Any:
    parser = PARSERS[name]
    if re.search(r"(^|\s)(-h|--help)(\s|$)", argstring):
        help_text = parser.format_help()
        print(usage(parser) + help_text[help_text.find("\n\n", len("::\n\n")) :].rstrip())
        return None
    try:
        return parser.parse_argstring(argstring)
    except (UsageError, ValueError) as exc:  # ValueError: unbalanced quotes from shlex
        raise UsageError(f"%nbtrainer {name}: {exc}\n{usage(parser)}") from None


def split_list(value: str | list[str] | None) -> list[str]:
    if value is None:
        return []
    items = value if isinstance(value, list) else [value]
    return [p.strip() for item in items for p in item.split(",") if p.strip()]


def parse_shape(text: str) -> tuple[int, ...]:
    parts = [p for p in re.split(r"[,x\s()\[\]]+", text.strip()) if p]
    try:
        shape = tuple(int(p) for p in parts)
    except ValueError:
        shape = ()
    if not shape or any(d <= 0 for d in shape):
        raise UsageError(
            f"%nbtrainer profile: bad --input-shape {text!r}: use positive integers like 1,3,32,32\n"
            f"{usage(_profile_args)}"
        )
    return shape


def usage_of(name: str) -> str:
    """The one-line usage of subcommand ``name``."""
    return usage(PARSERS[name])
