"""The panel's side actions: Save checkpoint and Profile (in helper threads), and safe click handlers."""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["PanelActions"]


class PanelActions:
    """Mixed into :class:`TrainerWidget` (uses its ``trainer``, ``view``, ``train_loader``, ``_run``...)."""

    def save_checkpoint(self, path: str | None = None) -> str:
        """Write a checkpoint (mid-run: at the next step boundary, from the training thread)."""
        path = path or self.view.save_path.value
        out = self.trainer.save_checkpoint(path)
        self._notify("info", f"checkpoint saved to {out} (step {self.trainer.global_step})")
        return out

    def profile(self, **kwargs: Any) -> Any:
        """``nbtrainer.profile_model`` on one batch of the train loader; shown as a ProfileCard in the panel."""
        from nbtrainer import precision_support, profile_model

        from ._profile_card import ProfileCard

        if self._run is not None and self._run.alive:
            raise RuntimeError("Profile between runs: it would compete with training for the device.")
        t = self.trainer
        args, kw, targets = t.batch_spec.split(next(iter(self.train_loader)))
        inputs = kw if (kw and not args) else (args[0] if len(args) == 1 else tuple(args))
        kwargs.setdefault("precisions", tuple(p for p, (ok, _) in precision_support(t.device).items() if ok))
        kwargs.setdefault("time_budget_s", 0.5)
        if t.criterion is not None and targets is not None:
            kwargs.setdefault("criterion", t.criterion)
            kwargs.setdefault("targets", targets)
        prof = profile_model(self._model, inputs, devices=(str(t.device),), optimizer=t.optimizer, **kwargs)
        self.view.profile_area.children = (ProfileCard(prof),)
        return prof

    def _guarded(self, fn: Any) -> None:
        """Click handlers: an error becomes a panel message (an exception there would be lost in a log)."""
        try:
            fn()
        except Exception as exc:  # noqa: BLE001
            self._notify("error", f"{type(exc).__name__}: {exc}")

    def _in_background(self, name: str, fn: Any) -> None:
        if name in self._busy:
            return
        self._busy.add(name)
        button = self.view.save if name == "save" else self.view.profile
        button.disabled = True
        if name == "profile":
            self.view.start.disabled = True
            self._notify("info", "profiling one batch (runs on copies of the model)...")

        def target() -> None:
            try:
                fn()
            except Exception as exc:  # noqa: BLE001
                self._notify("error", f"{name} failed: {type(exc).__name__}: {exc}")
            finally:
                self._busy.discard(name)
                running = self._run is not None and self._run.alive
                button.disabled = name == "profile" and running
                self.view.start.disabled = running

        threading.Thread(target=target, name=f"nbtrainer-{name}", daemon=True).start()
