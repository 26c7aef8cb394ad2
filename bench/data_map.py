"""The data map (issue 55): does it find mislabeled items, and what does it cost?

1. **Label issues.** scikit-learn's digits (1,500 training images, 297 held out), 5% of the training labels flipped to
   another class at random (seeded), a small CNN (two conv layers, Adam 3e-3, batch 32) trained for 10 and for 40
   epochs with a ``DataMap``. Precision at k (k = the number flipped: the share of the top k that were flipped, which
   is also the recall) of:
   * ``DataMap.label_issues(k)`` (the mean probability of the label while training, ``1 - confidence``), and the
     area under the margin (``aum``) as a second ranking;
   * ``interpret`` on the training set after the fit (in-sample: the final model's loss per item);
   * cleanlab's out-of-sample recipe (when ``pip install cleanlab`` works): 5-fold cross-validated predicted
     probabilities (5 more trainings of the same CNN for the same epochs), ranked by ``find_label_issues``'s
     self-confidence.
   Three seeds (the flip, the split and the initialization), and the work each ranking takes beyond the one fit
   (process CPU time: the machine is shared, and CPU seconds do not stretch with its load).
2. **Overhead.** The steady-state step time with and without a ``DataMap`` (alternated rounds, one process), on the
   tiny MLP 32-64-10 (batch 32, in-memory arrays; target within 3%) and on the digits CNN.

    python bench/data_map.py [--seeds 3] [--rounds 9] [--only issues|overhead]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _models import tiny_mlp
from _rounds import interleaved, machine_line


def digits_flipped(seed: int, share: float = 0.05) -> dict[str, Any]:
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x, dtype=torch.float32).reshape(-1, 1, 8, 8) / 16.0
    y = torch.tensor(y)
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(len(x), generator=g)
    train = perm[297:]
    x_train, y_true = x[train], y[train]
    k = int(share * len(train))
    flipped = torch.randperm(len(train), generator=g)[:k]
    y_given = y_true.clone()
    y_given[flipped] = (y_given[flipped] + torch.randint(1, 10, (k,), generator=g)) % 10
    return {"x": x_train, "y": y_given, "y_true": y_true, "flipped": set(flipped.tolist()), "k": k}


def small_cnn(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(64 * 16, 128),
        nn.ReLU(),
        nn.Linear(128, 10),
    )


def train(x: torch.Tensor, y: torch.Tensor, epochs: int, seed: int, callbacks: list[Any]) -> Any:
    from nbtrainer import Trainer

    trainer = Trainer(
        small_cnn(seed),
        nn.CrossEntropyLoss(),
        "adam",
        lr=3e-3,
        seed=seed,
        callbacks=callbacks,
        progress=False,
        run_store=False,
    )
    trainer.fit((x, y), batch_size=32, epochs=epochs)
    return trainer


def precision(ranked: list[int], flipped: set[int], k: int) -> float:
    return len(flipped & set(ranked[:k])) / k


def cleanlab_ranking(data: dict[str, Any], epochs: int, seed: int) -> list[int] | None:
    try:
        from cleanlab.filter import find_label_issues
    except ImportError:
        return None
    x, y = data["x"], data["y"]
    n = len(x)
    folds = torch.randperm(n, generator=torch.Generator().manual_seed(seed + 100)).chunk(5)
    probs = torch.zeros(n, 10)
    for held in folds:
        keep = torch.ones(n, dtype=torch.bool)
        keep[held] = False
        trainer = train(x[keep], y[keep], epochs, seed, [])
        with torch.no_grad():
            trainer.model.eval()
            probs[held] = trainer.model(x[held]).softmax(1)
    ranked = find_label_issues(
        y.numpy(), probs.numpy(), filter_by="prune_by_noise_rate", return_indices_ranked_by="self_confidence"
    )
    # cleanlab returns only the items it flags; the rest follow by self-confidence (for a full top k)
    rest = torch.argsort(probs.gather(1, y[:, None])[:, 0]).tolist()
    flagged = [int(i) for i in ranked]
    return flagged + [i for i in rest if i not in set(flagged)]


def issues(seeds: int) -> list[str]:
    from nbtrainer import DataMap

    rows = []
    for epochs in (10, 40):
        for seed in range(seeds):
            data = digits_flipped(seed)
            x, y, flipped, k = data["x"], data["y"], data["flipped"], data["k"]
            dm = DataMap()
            start = time.process_time()
            trainer = train(x, y, epochs, seed, [dm])
            fit_time = time.process_time() - start
            t0 = time.process_time()
            ranked_map = [i.index for i in dm.label_issues(k)]
            t_map = time.process_time() - t0
            aum_rank = torch.argsort(dm.aum).tolist()
            auto = dm.label_issues()
            t0 = time.process_time()
            interp = trainer.interpret((x, y), batch_size=256)
            ranked_in = [r["index"] for r in interp.top_losses(k)]
            t_in = time.process_time() - t0
            t0 = time.process_time()
            ranked_cl = cleanlab_ranking(data, epochs, seed)
            t_cl = time.process_time() - t0
            rules = {}
            for rule, mask in (("aum<0", dm.aum < 0), ("conf<0.5", dm.confidence < 0.5)):
                picked = set(mask.nonzero().flatten().tolist())
                rules[rule] = (len(picked), len(picked & flipped) / max(len(picked), 1), len(picked & flipped) / k)
            suggested_right = sum(
                1 for i in dm.label_issues(k) if i.index in flipped and i.suggested == int(data["y_true"][i.index])
            )
            rows.append(
                {
                    "epochs": epochs,
                    "seed": seed,
                    "k": k,
                    "fit_s": fit_time,
                    "map": precision(ranked_map, flipped, k),
                    "aum": precision(aum_rank, flipped, k),
                    "interpret": precision(ranked_in, flipped, k),
                    "cleanlab": precision(ranked_cl, flipped, k) if ranked_cl is not None else None,
                    "t_map": t_map,
                    "t_in": t_in,
                    "t_cl": t_cl if ranked_cl is not None else None,
                    "auto_n": len(auto),
                    "auto_prec": len(flipped & set(auto.indices)) / max(len(auto), 1),
                    "auto_recall": len(flipped & set(auto.indices)) / k,
                    "suggested": suggested_right / max(1, len(flipped & set(ranked_map))),
                    "rules": rules,
                }
            )
            print("  ", rows[-1], flush=True)
    lines = [
        "| epochs | seed | k | DataMap top-k | AUM top-k | interpret in-sample | cleanlab 5-fold | suggested = true "
        "label | label_issues() (k=None): n, precision, recall | fit | map's ranking | interpret | cleanlab |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cl = f"{r['cleanlab']:.3f}" if r["cleanlab"] is not None else "n/a"
        tcl = f"{r['t_cl']:.1f} s" if r["t_cl"] is not None else "n/a"
        lines.append(
            f"| {r['epochs']} | {r['seed']} | {r['k']} | **{r['map']:.3f}** | {r['aum']:.3f} | {r['interpret']:.3f} | "
            f"{cl} | {r['suggested']:.0%} | {r['auto_n']}, {r['auto_prec']:.2f}, {r['auto_recall']:.2f} | "
            f"{r['fit_s']:.1f} s | {r['t_map'] * 1e3:.1f} ms | {r['t_in'] * 1e3:.0f} ms | {tcl} |"
        )
    return lines


class StepClock:
    """Times between consecutive optimizer steps inside an epoch (the first step of an epoch is not timed)."""

    def __init__(self) -> None:
        self.deltas: list[float] = []
        self._last: float | None = None

    def on_epoch_start(self, trainer: Any, epoch: int) -> None:
        self._last = None

    def on_optimizer_step(self, trainer: Any, step: int, skipped: bool) -> None:
        now = time.perf_counter()
        if self._last is not None:
            self.deltas.append(now - self._last)
        self._last = now


def overhead(rounds: int) -> list[str]:
    from nbtrainer import DataMap, Trainer

    g = torch.Generator().manual_seed(0)
    x_mlp, y_mlp = torch.randn(12800, 32, generator=g), torch.randint(0, 10, (12800,), generator=g)
    cnn_data = digits_flipped(0)

    def run(name: str) -> tuple[float, float]:
        clock = StepClock()
        mapped = name.endswith("+map")
        callbacks: list[Any] = [clock, *([DataMap()] if mapped else [])]
        if name.startswith("tiny"):
            torch.manual_seed(0)
            model: nn.Module = tiny_mlp()
            data, epochs = (x_mlp, y_mlp), 3
        else:
            model, data, epochs = small_cnn(0), (cnn_data["x"], cnn_data["y"]), 2
        trainer = Trainer(model, nn.CrossEntropyLoss(), "sgd", lr=0.05, callbacks=callbacks, progress=False,
                          run_store=False, seed=0)  # fmt: skip
        start = time.perf_counter()
        trainer.fit(data, batch_size=32, epochs=epochs)
        whole = (time.perf_counter() - start) / trainer.global_step
        return statistics.median(clock.deltas), whole

    names = ["tiny", "tiny+map", "cnn", "cnn+map"]
    res = interleaved(run, names, rounds)
    lines = [
        "| workload | steady-state step (median) | vs without | whole fit per step (refreshes, epoch ends) | vs "
        "without | per-round ratios (whole fit) |",
        "|---|---|---|---|---|---|",
    ]
    for n in names:
        base = n.replace("+map", "")
        step = statistics.median(r[0] for r in res[n])
        whole = statistics.median(r[1] for r in res[n])
        step_b = statistics.median(r[0] for r in res[base])
        whole_b = statistics.median(r[1] for r in res[base])
        ratios = sorted(a[1] / b[1] for a, b in zip(res[n], res[base], strict=True))
        lines.append(
            f"| {n} | {step * 1e6:.1f} us | {step / step_b:.3f}x | {whole * 1e6:.1f} us | {whole / whole_b:.3f}x | "
            f"{', '.join(f'{r:.3f}' for r in ratios)} |"
        )
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--only", choices=["issues", "overhead"], default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(machine_line(torch.device("cpu")))
    print(f"# load average before: {os.getloadavg()}")
    if args.only != "overhead":
        print("\n1. Label issues: digits, 5% of the training labels flipped, small CNN\n")
        print("\n".join(issues(args.seeds)))
    if args.only != "issues":
        print(f"\n2. Step time with and without a DataMap ({args.rounds} alternated rounds)\n")
        print("\n".join(overhead(args.rounds)))
    print(f"\n# load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
