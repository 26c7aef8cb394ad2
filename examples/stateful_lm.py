"""A stateful model: a tiny LSTM language model trained with truncated backpropagation through time (TBPTT).

The token stream is cut into ``batch_size`` parallel columns and each batch is the next ``bptt`` tokens of
every column, in order, so the LSTM's hidden state at the end of one batch is the right start for the next.
A :class:`TBPTTLoss` object is both the trainer's ``compute_loss`` and a callback: it carries the hidden
state (detached, so backpropagation stops at the batch boundary) from batch to batch, resets it when an
epoch or a validation starts, and saves it in checkpoints (``state_dict``), so a run resumed mid-epoch
continues exactly as the uninterrupted one. Runs in seconds on a CPU, on generated data.

    python examples/stateful_lm.py [--epochs 3]
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import torch
from torch import nn

from nbtrainer import Trainer

VOCAB = 12


def token_stream(n: int, seed: int = 0) -> torch.Tensor:
    """A stream with long-range state: runs of a token pattern whose next token depends on the last two."""
    g = torch.Generator().manual_seed(seed)
    out = torch.empty(n, dtype=torch.long)
    a, b = 0, 1
    for i in range(n):
        if torch.rand((), generator=g) < 0.1:  # noise the model cannot predict
            a, b = b, int(torch.randint(0, VOCAB, (), generator=g))
        else:
            a, b = b, (a + 2 * b + 1) % VOCAB
        out[i] = b
    return out


def tbptt_batches(stream: torch.Tensor, batch_size: int, bptt: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``(x, y)`` batches of shape ``(batch_size, bptt)``, ``y`` shifted by one: batch ``i + 1`` continues
    batch ``i`` in every row (the order is the state's order: never shuffle these)."""
    cols = (stream.numel() - 1) // batch_size
    x_all = stream[: cols * batch_size].view(batch_size, cols)
    y_all = stream[1 : cols * batch_size + 1].view(batch_size, cols)
    return [(x_all[:, i : i + bptt], y_all[:, i : i + bptt]) for i in range(0, cols - bptt + 1, bptt)]


class LSTMLM(nn.Module):
    """Embedding -> LSTM -> next-token logits; ``forward(input, hidden)`` returns ``(logits, hidden)``."""

    def __init__(self, vocab: int = VOCAB, dim: int = 32, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.lstm = nn.LSTM(dim, dim, num_layers=layers, batch_first=True)
        self.head = nn.Linear(dim, vocab)

    def forward(
        self, tokens: torch.Tensor, hidden: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        out, hidden = self.lstm(self.embed(tokens), hidden)
        return self.head(out), hidden


class TBPTTLoss:
    """``compute_loss`` for a stateful model, and the callback that keeps its state right.

    One hidden state for training and one for evaluation (the model's mode says which), each detached
    after every batch; reset at ``on_epoch_start`` / ``on_validation_start`` (fit's validation and
    ``evaluate()`` both fire it). Pass the same object as ``compute_loss=`` and in ``callbacks=``.
    """

    def __init__(self) -> None:
        self.hidden: dict[bool, tuple[torch.Tensor, ...] | None] = {True: None, False: None}

    def __call__(self, model: nn.Module, batch: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x, y = batch
        state = self.hidden[model.training]
        if state is not None and state[0].shape[1] != x.shape[0]:
            state = None  # a batch of another size does not continue these rows
        logits, new_state = model(x, state)
        self.hidden[model.training] = tuple(h.detach() for h in new_state)  # TBPTT: no gradient across batches
        flat = logits.reshape(-1, logits.shape[-1])
        return nn.functional.cross_entropy(flat, y.reshape(-1)), flat, y.reshape(-1)

    def on_epoch_start(self, trainer: Any, epoch: int) -> None:
        self.hidden[True] = None

    def on_validation_start(self, trainer: Any) -> None:
        self.hidden[False] = None

    # saved in checkpoints (a callback's state): a mid-epoch resume continues with the same hidden state
    def state_dict(self) -> dict[str, Any]:
        state = self.hidden[True]
        return {"train": list(state) if state is not None else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = state.get("train")
        self.hidden[True] = tuple(saved) if saved is not None else None


def accuracy(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return (outputs.argmax(dim=-1) == targets).float().mean()


def make_trainer(*, seed: int = 0, callbacks: tuple[Any, ...] = (), **options: Any) -> Trainer:
    """A trainer for :class:`LSTMLM` with a :class:`TBPTTLoss` (``options`` go to :class:`Trainer`)."""
    torch.manual_seed(seed)
    model = LSTMLM()
    loss = TBPTTLoss()
    options.setdefault("progress", False)
    return Trainer(
        model,
        None,  # the loss comes from compute_loss
        torch.optim.Adam(model.parameters(), lr=1e-2),
        compute_loss=loss,
        callbacks=[loss, *callbacks],
        metrics={"acc": accuracy},
        max_grad_norm=1.0,
        seed=seed,
        **options,
    )


def data(
    *, batch_size: int = 8, bptt: int = 16, seed: int = 0
) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], list[tuple[torch.Tensor, torch.Tensor]]]:
    """Training and validation batches, cut from two generated streams."""
    train = tbptt_batches(token_stream(4000, seed), batch_size, bptt)
    val = tbptt_batches(token_stream(1200, seed + 1), batch_size, bptt)
    return train, val


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    train, val = data(seed=args.seed)
    trainer = make_trainer(seed=args.seed, progress="lines")
    history = trainer.fit(train, val, epochs=args.epochs)
    val_acc = history.last["val_acc"]
    print(f"{history.status}: {len(history)} epochs, val_acc={val_acc:.3f} (chance {1 / VOCAB:.3f})")
    if val_acc < 0.5:
        print(f"val_acc={val_acc:.3f} is below 0.5: the model did not learn the stream", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
