"""A script that trains until the Ctrl-C test sends it SIGINT (``tests/trainer/test_interrupt.py``).

Usage::

    python tests/trainer/_interrupt_worker.py CKPT_DIR [--accum N]

Prints ``STEP n`` after every optimizer step (each step sleeps a little, so SIGINT lands inside a step),
``END <status>`` from ``on_fit_end`` and ``RETURNED <status>`` if ``fit`` returns.
"""

from __future__ import annotations

import signal
import sys
import time

import torch

# Ctrl-C as in a script started from a terminal. A test run started in the background of a shell script
# (`cmd &`) passes SIGINT down as ignored, and Python then leaves it ignored: the signal would be lost.
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
torch.set_num_threads(1)

from nbtrainer import ModelCheckpoint, Trainer  # noqa: E402


class Report:
    def on_train_batch_end(self, trainer, batch_idx, loss):
        time.sleep(0.02)  # a step long enough for the signal to arrive mid-step

    def on_optimizer_step(self, trainer, step, skipped):
        print(f"STEP {step}", flush=True)

    def on_fit_end(self, trainer, history):
        print(f"END {history.status}", flush=True)


def main() -> None:
    ckpt_dir = sys.argv[1]
    accum = int(sys.argv[sys.argv.index("--accum") + 1]) if "--accum" in sys.argv else 1
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    x, y = torch.randn(512, 8), torch.randint(0, 2, (512,))
    trainer = Trainer(
        model,
        torch.nn.CrossEntropyLoss(),
        "sgd",
        lr=0.05,
        grad_accum_steps=accum,
        callbacks=[ModelCheckpoint(ckpt_dir, save_last=True, save_top_k=0), Report()],
        progress=False,
    )
    history = trainer.fit((x, y), batch_size=8, epochs=1000)
    print(f"RETURNED {history.status}", flush=True)


if __name__ == "__main__":
    main()
