"""Small real models, synthetic data and helpers shared by the widget tests (no kernel, no browser)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import torch
from _waits import wait_for  # noqa: F401  (the widget tests import it from here)
from conftest import make_classification, make_loader, mlp


@contextlib.contextmanager
def widgets_made_elsewhere() -> Iterator[list[tuple[str, str]]]:
    """``(thread name, widget class)`` of each widget made while the block runs by a thread other than this one
    (ipywidgets' construction hook, the one there was put back after): a widget made off the kernel's thread races
    its answer to ``comm_info``."""
    import ipywidgets

    here, made = threading.get_ident(), list[tuple[str, str]]()
    previous = ipywidgets.Widget._widget_construction_callback

    def record(widget: object) -> None:
        if threading.get_ident() != here:
            made.append((threading.current_thread().name, type(widget).__name__))

    ipywidgets.Widget.on_widget_constructed(record)
    try:
        yield made
    finally:
        ipywidgets.Widget._widget_construction_callback = previous


class Slow:
    """Each optimizer step takes a little wall time, so another thread can act mid-run."""

    def __init__(self, delay: float = 0.002) -> None:
        self.delay = delay

    def on_optimizer_step(self, trainer, step, skipped):
        time.sleep(self.delay)


class CountRefresh:
    def __init__(self) -> None:
        self.n = 0

    def on_refresh(self, trainer, progress):
        self.n += 1


def accuracy(outputs, targets):
    return (outputs.argmax(dim=1) == targets).float().mean()


def parts(n: int = 512, bs: int = 16, lr: float = 0.05, seed: int = 0):
    x, y = make_classification(n=n, seed=seed)
    model = mlp(seed=seed)
    return model, torch.nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=lr), make_loader(x, y, bs)


def make_widget(n: int = 512, bs: int = 16, epochs: int = 2, slow: float | None = None, val: bool = True, **kw):
    from nbtrainer import TrainerWidget

    model, crit, opt, _ = parts(n=8, bs=bs)
    x, y = make_classification(n=n + 128)  # one task: the last 128 samples are the validation set
    loader = make_loader(x[:n], y[:n], bs)
    x, y = x[n:], y[n:]
    callbacks = list(kw.pop("callbacks", []))
    if slow:
        callbacks.append(Slow(slow))
    kw.setdefault("refresh_interval", 0.05)
    kw.setdefault("progress", False)
    kw.setdefault("ui_interval", 0.05)
    return TrainerWidget(
        model,
        crit,
        opt,
        loader,
        make_loader(x, y, 32) if val else None,
        epochs=epochs,
        metrics={"acc": accuracy},
        callbacks=callbacks,
        **kw,
    )


def tooltip(widget) -> str:
    """The hover text the front end gets: the ``tooltip`` trait (ipywidgets 8, a Button on 7), else the
    ``description_tooltip`` trait (ipywidgets 7, Colab). Not a plain attribute: that would reach no front end."""
    name = "tooltip" if widget.has_trait("tooltip") else "description_tooltip"
    return widget.trait_values()[name] or ""


def classes(widget) -> set[str]:
    """Every CSS class in a widget tree."""
    out = set(getattr(widget, "_dom_classes", ()))
    for child in getattr(widget, "children", ()) or ():
        out |= classes(child)
    return out
