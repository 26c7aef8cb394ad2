"""Build the demo notebooks (and the browser tests' panel notebook) from the sources below.

    python notebooks/_build.py            # (re)write every notebook
    python notebooks/_build.py --check    # exit 1 if a notebook on disk differs from what this builds

Notebooks are written without outputs or execution counts and with fixed cell ids, so a rebuild of
unchanged sources gives byte-identical files. Each one is self-contained (no import from this repo
other than ``nbtrainer``) and opens with a one-paragraph usage card. ``tests/test_notebooks.py``
executes them in a real kernel; ``tests/browser`` drives the panel notebook in Chromium.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
BROWSER_NB_DIR = REPO / "tests" / "browser" / "notebooks"


def md(text: str) -> tuple[str, str]:
    return ("markdown", textwrap.dedent(text).strip("\n"))


def code(text: str) -> tuple[str, str]:
    return ("code", textwrap.dedent(text).strip("\n"))


# -- shared cells (copied into each notebook: every notebook runs on its own) ------------------------

SETUP = code("""
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    # Models this small run fastest on one intra-op thread, and it leaves a core for the kernel and the
    # panel (on a busy 2-core machine, 2 threads can be many times slower).
    torch.set_num_threads(1)
    torch.manual_seed(0)
""")

DIGITS = code("""
    # 1,797 handwritten digits, 8x8 pixels, bundled with scikit-learn (no download)
    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x, dtype=torch.float32).reshape(-1, 1, 8, 8) / 16.0
    y = torch.tensor(y, dtype=torch.long)
    x_tr, x_va, y_tr, y_va = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)
    train_loader = DataLoader(TensorDataset(x_tr, y_tr), batch_size=64, shuffle=True,
                              generator=torch.Generator().manual_seed(0))
    val_loader = DataLoader(TensorDataset(x_va, y_va), batch_size=256)
    len(x_tr), len(x_va)
""")

CNN = code("""
    def small_cnn() -> nn.Module:
        return nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Dropout(0.2), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10),
        )


    def accuracy(outputs, targets):
        return (outputs.argmax(dim=1) == targets).float().mean()
""")


# -- 01 quickstart -------------------------------------------------------------------------------------

QUICKSTART = [
    md("""
    # Quickstart: train a small CNN with a live panel

    **Usage:** run all cells (*Run → Run All Cells*, or `jupyter execute 01_quickstart.ipynb` in a terminal);
    it takes about 10 s on 2 CPU cores, with no GPU and no download. A small CNN learns scikit-learn's
    handwritten digits while the panel shows the loss, learning rate and accuracy live. When the run ends,
    press **Start** to train on, **Pause** / **Stop** it at any step, move the learning-rate slider or the
    accumulation steps mid-run, or press **Profile**; the last cells turn the run's `History` into a table
    and a chart. Needs the project installed (`pip install -e .` from the repository root; Binder does it).
    """),
    SETUP,
    DIGITS,
    CNN,
    md("""
    ## The panel

    `TrainerWidget` takes what `nbtrainer.Trainer` takes (model, loss, optimizer, loaders, metrics, options such as
    `precision=` or `grad_accum_steps=`). Displaying it shows the panel; training runs in a background thread, so the
    buttons keep working while it trains.
    """),
    code("""
    from nbtrainer import TrainerWidget

    model = small_cnn()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-4)
    w = TrainerWidget(model, nn.CrossEntropyLoss(), optimizer, train_loader, val_loader,
                      metrics={"acc": accuracy}, epochs=5, seed=0)
    w
    """),
    md("""
    `w.fit()` is the same as pressing **Start** and waiting: the cell returns the `History` when the run ends
    (`w.start()` returns at once instead; `w.wait()` waits later). A static summary is left under the panel, so
    the results still show where widgets are not rendered (GitHub, nbviewer).
    """),
    code("""
    history = w.fit()
    history
    """),
    md("""
    ## The run as a table and a chart

    One row per epoch (`history.to_pandas("steps")` has one per optimizer step).
    """),
    code("""
    table = history.to_pandas()
    table[["loss", "acc", "val_loss", "val_acc", "lr", "time", "samples_per_s"]].round(4)
    """),
    code("""
    import bqplot.pyplot as plt

    steps = history.to_pandas("steps")
    fig = plt.figure(title="training loss per step, validation loss per epoch", legend_location="top-right",
                     layout={"width": "700px", "height": "320px"})
    plt.plot(steps["step"], steps["loss"], labels=["train loss"], opacities=[0.5], display_legend=True)
    plt.plot(table["steps"], table["val_loss"], colors=["orange"], marker="circle", labels=["val loss"],
             display_legend=True)  # "steps": the global optimizer step at the end of each epoch
    plt.xlabel("optimizer step")
    plt.show()
    """),
    code("""
    best = history.best("val_acc", mode="max")
    print(f"{history.status}: best val_acc {best['val_acc']:.3f} at epoch {best['epoch']}")
    """),
]


# -- 02 precision and accumulation ------------------------------------------------------------------

PRECISION = [
    md("""
    # Precision and gradient accumulation on a CPU

    **Usage:** run all cells (*Run → Run All Cells*); about 15 s on 2 CPU cores. The same small CNN is trained on
    scikit-learn's digits under `fp32`, `bf16-mixed` and `fp16-mixed` autocast, with and without gradient
    accumulation at the same effective batch size (64), and one table compares wall time, measured training
    memory per step and validation accuracy: the classic mixed-precision experiment, reproduced on a laptop.
    Change `EPOCHS` or `CONFIGS` below and run again to try your own.
    """),
    SETUP,
    DIGITS,
    CNN,
    md("""
    Which precisions does this CPU really run? `precision_support` *checks* each one with a tiny autocast
    forward and backward (nothing is guessed); an unsupported precision is refused by the `Trainer`, never
    silently downgraded.
    """),
    code("""
    from nbtrainer import Trainer, precision_support, profile_model

    precision_support("cpu")
    """),
    md("""
    `run()` trains a fresh copy of the model (same seed) and measures:
    * **time**: wall time of `trainer.fit`;
    * **memory**: one training step's memory, measured by `profile_model` at the micro-batch size (parameters,
      gradients, AdamW state, and the activations saved for backward, which is what precision and accumulation
      change);
    * **accuracy** on the validation set after the last epoch.

    With `accum=k` the loader yields micro-batches of `64 // k` and the trainer steps the optimizer every `k`
    micro-batches, so each update still sees 64 samples.
    """),
    code("""
    import time

    import pandas as pd

    EPOCHS = 3
    BATCH = 64


    def run(precision: str, accum: int = 1, epochs: int = EPOCHS) -> dict:
        torch.manual_seed(0)
        model = small_cnn()
        micro = BATCH // accum
        loader = DataLoader(TensorDataset(x_tr, y_tr), batch_size=micro, shuffle=True,
                            generator=torch.Generator().manual_seed(0))
        trainer = Trainer(model, nn.CrossEntropyLoss(), torch.optim.AdamW(model.parameters(), lr=3e-3),
                          metrics={"acc": accuracy}, precision=precision, grad_accum_steps=accum,
                          seed=0, progress=False)
        start = time.perf_counter()
        history = trainer.fit(loader, val_loader, epochs=epochs)
        seconds = time.perf_counter() - start
        memory = profile_model(model, x_tr[:micro], precisions=(precision,), include=("memory",),
                               criterion=nn.CrossEntropyLoss(), targets=y_tr[:micro]).memory["cpu"][precision]
        return {"precision": precision, "accum": accum, "micro-batch": micro,
                "time (s)": seconds, "samples/s": len(x_tr) * epochs / seconds,
                "step memory (KiB)": memory["total"] / 1024, "activations (KiB)": memory["activations"] / 1024,
                "val_acc": history.last["val_acc"], "fp16 skipped steps": history.last["skipped_steps"]}


    run("fp32", epochs=1);  # warm-up: the first fit in a process pays one-off costs (thread pools, kernels)
    """),
    code("""
    CONFIGS = [("fp32", 1), ("bf16-mixed", 1), ("fp16-mixed", 1), ("fp32", 4), ("bf16-mixed", 4)]
    results = pd.DataFrame([run(p, a) for p, a in CONFIGS]).set_index(["precision", "accum"])
    results.round({"time (s)": 2, "samples/s": 0, "step memory (KiB)": 0, "activations (KiB)": 0, "val_acc": 3})
    """),
    md("""
    How to read it:
    * **Memory.** Mixed precision keeps the weights, gradients and optimizer state in fp32; what shrinks is the
      activations saved for backward (16-bit copies). Accumulation shrinks them further by running smaller
      micro-batches, at the same effective batch size.
    * **Time.** On a CPU, low-precision autocast pays off only where the CPU has native bf16/fp16 instructions
      (AVX-512 BF16, AMX); elsewhere the casts can cost more than they save (fp16 is often emulated on CPUs). With
      accumulation there are `k` times more, smaller forward/backward passes, so fixed per-batch costs grow. A model
      this small is dominated by such overheads, and timings on a shared machine are noisy: run it twice.
    * **Accuracy** is about the same everywhere. Accumulation is exact for the loss (each micro-batch is scaled
      by its window), but BatchNorm sees micro-batches of 16 rather than 64, so the runs are not identical.
    * `fp16-mixed` uses a gradient scaler (on CPU too); steps it skipped after an overflow are counted.
    """),
    code("""
    base = results.loc[("fp32", 1)]
    (results[["time (s)", "step memory (KiB)", "activations (KiB)"]] / base[["time (s)", "step memory (KiB)",
                                                                          "activations (KiB)"]]).round(2)
    """),
]


# -- 03 profiling ------------------------------------------------------------------------------------

PROFILING = [
    md("""
    # Profiling a model before training it

    **Usage:** run all cells (*Run → Run All Cells*); about 20 s on 2 CPU cores. `profile_model` measures a
    model on example inputs (parameters and size, MACs/FLOPs, latency per precision, and the memory one training
    step needs, broken down) without touching the model itself; `fits()` says whether a batch size fits a memory
    budget and suggests micro-batch × accumulation when it does not. The same report is one magic away:
    `%load_ext nbtrainer`, then `%nbtrainer profile MODEL --input-shape 1,3,32,32` (or `--inputs VAR`). Try it on
    your own model by replacing the two below.
    """),
    code("""
    import torch
    from torch import nn

    torch.set_num_threads(1)  # small models: one thread is fastest and leaves a core for the kernel
    torch.manual_seed(0)
    """),
    md("Two small models: a CNN for 32×32 colour images and a transformer encoder that classifies token sequences."),
    code("""
    cnn = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 8 * 8, 128), nn.ReLU(), nn.Linear(128, 10),
    )


    class TinyEncoder(nn.Module):
        \"\"\"Token ids (batch, seq) -> class logits: embedding, positions, 2 encoder layers, mean pooling.\"\"\"

        def __init__(self, vocab: int = 1000, d: int = 64, heads: int = 4, layers: int = 2, seq: int = 64,
                     classes: int = 2) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab, d)
            self.pos = nn.Parameter(torch.zeros(1, seq, d))
            layer = nn.TransformerEncoderLayer(d, heads, dim_feedforward=4 * d, dropout=0.1, batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
            self.head = nn.Linear(d, classes)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            h = self.encoder(self.embed(tokens) + self.pos[:, : tokens.shape[1]])
            return self.head(h.mean(dim=1))


    encoder = TinyEncoder()
    tokens = torch.randint(0, 1000, (16, 64))  # a batch of 16 sequences of 64 tokens
    """),
    md("""
    ## `profile_model`

    Latency is timed for each precision on each device (`devices=("cpu", "cuda")` on a GPU machine); memory is
    measured by running one real training step on a copy. The result shows as a report in a notebook.
    """),
    code("""
    from nbtrainer import profile_model

    prof = profile_model(cnn, torch.randn(32, 3, 32, 32), precisions=("fp32", "bf16-mixed"), time_budget_s=0.3)
    prof
    """),
    md("Every number is also data: `to_pandas()` gives one long table (and `to_dict()` plain JSON-able data)."),
    code("""
    frame = prof.to_pandas()
    frame[frame.section.isin(["size", "compute"])].head(12)
    """),
    md("""
    Would a batch of 4,096 fit in 64 MiB for training? If not, `fits()` suggests a micro-batch and the gradient
    accumulation that keeps the effective batch size.
    """),
    code("""
    plan = prof.fits(budget_gb=64 / 1024, batch_size=4096)
    print(plan)
    """),
    md("""
    `ProfileCard` is the same report as a widget (the panel's **Profile** button shows it too). Here for the
    encoder, whose inputs are integer token ids:
    """),
    code("""
    from nbtrainer import ProfileCard

    enc_prof = profile_model(encoder, tokens, precisions=("fp32", "bf16-mixed"), time_budget_s=0.3)
    ProfileCard(enc_prof)
    """),
    md("""
    ## The magics

    `%load_ext nbtrainer` adds one line magic, `%nbtrainer`, with subcommands (`%nbtrainer help` lists them).
    `profile` works on any model in the namespace: give an input shape (random floats) or the name of an input
    variable. The profile is kept as `_nbt_profile`.
    """),
    code("""
    %load_ext nbtrainer
    """),
    code("""
    %nbtrainer profile cnn --input-shape 32,3,32,32
    """),
    code("""
    %nbtrainer profile encoder --inputs tokens --precision fp32,bf16-mixed
    """),
    code("""
    _nbt_profile.latency_ms["cpu"]
    """),
    md(
        "`%nbtrainer doctor` checks this environment: torch build, devices and the precisions they really run, "
        "the notebook packages and their front-end extensions, each problem with a fix."
    ),
    code("""
    %nbtrainer doctor
    """),
]


# -- 04 multiple inputs and outputs ------------------------------------------------------------------

MULTI = [
    md("""
    # Multiple inputs, multiple outputs, dict batches

    **Usage:** run all cells (*Run → Run All Cells*); about 10 s on 2 CPU cores. The `Trainer` (and the panel)
    takes batches in the shapes models really use: `(x, y)`, `(x1, x2, ..., y)` → `model(x1, x2, ...)`,
    `num_inputs=k` when there are several targets, and dicts → `model(**inputs)` with the targets picked by
    `target_keys`; outputs can be tuples or dicts, and the loss and metrics receive them as the model returned
    them. Each section below trains the same digits data in one of these shapes; copy the one that looks like
    your data.
    """),
    SETUP,
    code("""
    import torch.nn.functional as F

    x, y = load_digits(return_X_y=True)
    image = torch.tensor(x, dtype=torch.float32).reshape(-1, 1, 8, 8) / 16.0
    # a second input: the "ink profile" of each digit (row sums and column sums, 16 numbers)
    profile = torch.cat([image.sum(dim=3).flatten(1), image.sum(dim=2).flatten(1)], dim=1) / 8.0
    digit = torch.tensor(y, dtype=torch.long)
    parity = digit % 2  # a second target: is the digit odd?
    idx_tr, idx_va = train_test_split(torch.arange(len(digit)), test_size=0.2, random_state=0, stratify=digit)
    image.shape, profile.shape
    """),
    code("""
    class TwoInputNet(nn.Module):
        \"\"\"An image branch and a profile branch, joined; one head per task (one or two outputs).\"\"\"

        def __init__(self, two_heads: bool = False, as_dict: bool = False) -> None:
            super().__init__()
            self.image_branch = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                              nn.Flatten(), nn.Linear(16 * 4 * 4, 64), nn.ReLU())
            self.profile_branch = nn.Sequential(nn.Linear(16, 32), nn.ReLU())
            self.digit_head = nn.Linear(96, 10)
            self.parity_head = nn.Linear(96, 2) if two_heads else None
            self.as_dict = as_dict

        def forward(self, image, profile):
            h = torch.cat([self.image_branch(image), self.profile_branch(profile)], dim=1)
            if self.parity_head is None:
                return self.digit_head(h)
            digit, parity = self.digit_head(h), self.parity_head(h)
            return {"digit": digit, "parity": parity} if self.as_dict else (digit, parity)


    def loader(*tensors, train=True):
        idx = idx_tr if train else idx_va
        return DataLoader(TensorDataset(*(t[idx] for t in tensors)), batch_size=64 if train else 256,
                          shuffle=train, generator=torch.Generator().manual_seed(0))
    """),
    md("""
    ## Two inputs, one target: `(image, profile, digit)`

    With no other hint the last element of a tuple batch is the target and the others are the model's
    positional inputs.
    """),
    code("""
    from nbtrainer import Trainer

    torch.manual_seed(0)
    model = TwoInputNet()
    trainer = Trainer(model, nn.CrossEntropyLoss(), torch.optim.AdamW(model.parameters(), lr=3e-3),
                      metrics={"acc": lambda out, t: (out.argmax(1) == t).float().mean()}, seed=0, progress=False)
    history = trainer.fit(loader(image, profile, digit), loader(image, profile, digit, train=False), epochs=3)
    history.to_pandas()[["loss", "acc", "val_loss", "val_acc"]].round(4)
    """),
    md("""
    ## Two inputs, two outputs, two targets: `(image, profile, digit, parity)` with `num_inputs=2`

    The model returns a tuple; the loss and the metrics get `(digit_logits, parity_logits)` and
    `(digit, parity)`.
    """),
    code("""
    def multitask_loss(outputs, targets):
        (digit_logits, parity_logits), (digit_t, parity_t) = outputs, targets
        return F.cross_entropy(digit_logits, digit_t) + 0.5 * F.cross_entropy(parity_logits, parity_t)


    tuple_metrics = {
        "digit_acc": lambda out, t: (out[0].argmax(1) == t[0]).float().mean(),
        "parity_acc": lambda out, t: (out[1].argmax(1) == t[1]).float().mean(),
    }
    torch.manual_seed(0)
    model = TwoInputNet(two_heads=True)
    trainer = Trainer(model, multitask_loss, torch.optim.AdamW(model.parameters(), lr=3e-3), num_inputs=2,
                      metrics=tuple_metrics, seed=0, progress=False)
    history = trainer.fit(loader(image, profile, digit, parity), loader(image, profile, digit, parity, train=False),
                          epochs=3)
    history.to_pandas()[["loss", "digit_acc", "parity_acc", "val_digit_acc", "val_parity_acc"]].round(4)
    """),
    md("""
    ## Dict batches and dict outputs, in the panel

    A dataset that yields dicts (the default collate keeps them dicts). The keys named in `target_keys` are the
    targets (here two, passed to the loss as a tuple in that order); every other key is a keyword argument of
    the model, so `model(image=..., profile=...)`. The model returns a dict. `TrainerWidget` takes the same
    options as `Trainer`.
    """),
    code("""
    from torch.utils.data import Dataset


    class DigitsDict(Dataset):
        def __init__(self, idx):
            self.idx = idx

        def __len__(self):
            return len(self.idx)

        def __getitem__(self, i):
            j = self.idx[i]
            return {"image": image[j], "profile": profile[j], "digit": digit[j], "parity": parity[j]}


    dict_train = DataLoader(DigitsDict(idx_tr), batch_size=64, shuffle=True, generator=torch.Generator().manual_seed(0))
    dict_val = DataLoader(DigitsDict(idx_va), batch_size=256)
    next(iter(dict_val)).keys()
    """),
    code("""
    from nbtrainer import TrainerWidget


    def dict_loss(outputs, targets):
        digit_t, parity_t = targets  # in target_keys order
        return F.cross_entropy(outputs["digit"], digit_t) + 0.5 * F.cross_entropy(outputs["parity"], parity_t)


    dict_metrics = {
        "digit_acc": lambda out, t: (out["digit"].argmax(1) == t[0]).float().mean(),
        "parity_acc": lambda out, t: (out["parity"].argmax(1) == t[1]).float().mean(),
    }
    torch.manual_seed(0)
    dict_model = TwoInputNet(two_heads=True, as_dict=True)
    w = TrainerWidget(dict_model, dict_loss, torch.optim.AdamW(dict_model.parameters(), lr=3e-3), dict_train, dict_val,
                      metrics=dict_metrics, target_keys=("digit", "parity"), epochs=3, seed=0)
    w
    """),
    code("""
    history = w.fit()  # the same as pressing Start and waiting
    history.to_pandas()[["loss", "digit_acc", "parity_acc", "val_digit_acc", "val_parity_acc"]].round(4)
    """),
    md(
        "`predict` returns the outputs for a whole loader, concatenated and in the model's own structure (here a dict):"
    ),
    code("""
    predictions = w.trainer.predict(dict_val)
    {k: tuple(v.shape) for k, v in predictions.items()}
    """),
    code("""
    (predictions["digit"].argmax(1) == digit[idx_va]).float().mean().item()
    """),
]


# -- 05 scripts ----------------------------------------------------------------------------------------

SCRIPT_WIDGET = '''\
"""The quickstart's training as a plain script: TrainerWidget(...).fit() trains in the foreground here."""
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from nbtrainer import TrainerWidget

torch.set_num_threads(1)
torch.manual_seed(0)
x, y = load_digits(return_X_y=True)
x = torch.tensor(x, dtype=torch.float32).reshape(-1, 1, 8, 8) / 16.0
y = torch.tensor(y, dtype=torch.long)
x_tr, x_va, y_tr, y_va = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)
train_loader = DataLoader(TensorDataset(x_tr, y_tr), batch_size=64, shuffle=True,
                          generator=torch.Generator().manual_seed(0))
val_loader = DataLoader(TensorDataset(x_va, y_va), batch_size=256)
model = nn.Sequential(
    nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
    nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
    nn.Flatten(), nn.Dropout(0.2), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10),
)


def accuracy(outputs, targets):
    return (outputs.argmax(dim=1) == targets).float().mean()


w = TrainerWidget(model, nn.CrossEntropyLoss(), torch.optim.AdamW(model.parameters(), lr=3e-3),
                  train_loader, val_loader, metrics={"acc": accuracy}, epochs=3, seed=0)
history = w.fit()  # no notebook here: console progress bars, then the History
history.to_json(sys.argv[1] if len(sys.argv) > 1 else "history.json")
print(history)
'''

SCRIPTS = [
    md("""
    # The same training in a script

    **Usage:** run all cells (*Run → Run All Cells*); about 20 s on 2 CPU cores. Nothing in nbtrainer needs a
    notebook: the cells below run Python scripts as you would in a terminal (`!` runs a shell command; in a
    terminal, drop the `!` and write `python` instead of `{sys.executable}`). `Trainer.fit` shows console progress
    bars there, and the very same `TrainerWidget(...).fit()` code that shows the panel in a notebook trains in the
    foreground with console bars in a plain script. Long runs then come back to the notebook as a saved `History`.
    """),
    code("""
    import sys
    import tempfile
    from pathlib import Path

    import os

    os.environ["OMP_NUM_THREADS"] = "1"  # for the scripts below: small models run fastest on one thread
    workdir = Path(tempfile.mkdtemp(prefix="nbtrainer-scripts-"))
    sys.executable
    """),
    md("""
    ## The repository's headless demo

    `examples/train_digits.py` is a small CNN on scikit-learn's digits with a OneCycle schedule and early stopping;
    `--precision`, `--accum` and `--epochs` are options (`--help` lists them). The bars are tqdm's console bars.
    """),
    code("""
    !{sys.executable} ../examples/train_digits.py --epochs 3
    """),
    md("""
    ## A notebook's code as a script

    The quickstart's cells, pasted into a file. `TrainerWidget(...).fit()` sees there is no notebook front end,
    says so once, trains in the foreground with console bars and returns the `History`, which the script saves.
    """),
    code("""
    script = workdir / "train_quickstart.py"  # %%writefile below expands {script}
    """),
    ("code", "%%writefile {script}\n" + SCRIPT_WIDGET.rstrip("\n")),
    code("""
    history_file = workdir / "history.json"
    !{sys.executable} {script} {history_file}
    """),
    md("## Back in the notebook: load the script's History"),
    code("""
    from nbtrainer import History

    history = History.from_json(str(history_file))
    history.to_pandas()[["loss", "acc", "val_loss", "val_acc", "time"]].round(4)
    """),
    code("""
    assert history.status == "finished" and len(history) == 3, history
    history.last["val_acc"]
    """),
]


# -- browser tests: the panel, left for the Start button ----------------------------------------------

PANEL_LIVE = [
    md("""
    # Panel for the real-browser tests (not a demo)

    The quickstart's panel, but nothing starts training: the test presses **Start** and **Stop** in the browser.
    Each forward pass sleeps a little so that a run lasts long enough to watch the charts grow.
    """),
    SETUP,
    DIGITS,
    CNN,
    code("""
    import time

    from nbtrainer import TrainerWidget


    class Slow(nn.Module):
        \"\"\"Wraps a model and sleeps in each forward: about 40 steps/s, so the browser can watch the run.\"\"\"

        def __init__(self, inner: nn.Module, delay: float = 0.02) -> None:
            super().__init__()
            self.inner, self.delay = inner, delay

        def forward(self, x):
            time.sleep(self.delay)
            return self.inner(x)


    model = Slow(small_cnn())
    w = TrainerWidget(model, nn.CrossEntropyLoss(), torch.optim.AdamW(model.parameters(), lr=3e-3),
                      train_loader, val_loader, metrics={"acc": accuracy}, epochs=40, seed=0)
    w
    """),
]


NOTEBOOKS: dict[Path, list[tuple[str, str]]] = {
    HERE / "01_quickstart.ipynb": QUICKSTART,
    HERE / "02_precision_and_accumulation.ipynb": PRECISION,
    HERE / "03_profiling.ipynb": PROFILING,
    HERE / "04_multi_input_output.ipynb": MULTI,
    HERE / "05_scripts.ipynb": SCRIPTS,
    BROWSER_NB_DIR / "panel_live.ipynb": PANEL_LIVE,
}


def build(cells: list[tuple[str, str]], stem: str) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nb.metadata["language_info"] = {"name": "python", "pygments_lexer": "ipython3"}
    for i, (kind, source) in enumerate(cells):
        cell = nbformat.v4.new_markdown_cell(source) if kind == "markdown" else nbformat.v4.new_code_cell(source)
        cell["id"] = f"{stem.replace('_', '-')}-{i:02d}"  # fixed ids: rebuilds are byte-identical
        nb.cells.append(cell)
    nbformat.validate(nb)
    return nb


def render(path: Path) -> str:
    return nbformat.writes(build(NOTEBOOKS[path], path.stem)) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check that the files are up to date")
    args = parser.parse_args(argv)
    stale = []
    for path in NOTEBOOKS:
        text = render(path)
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            continue
        stale.append(path)
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path.relative_to(REPO)}")
    if args.check and stale:
        print("out of date (run python notebooks/_build.py):", *(str(p.relative_to(REPO)) for p in stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
