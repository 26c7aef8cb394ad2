"""Crash soak: SIGKILL training runs at random moments, resume each from its last checkpoint, and
check that every resumed run ends bit-identical to the same run left alone.

Each trial is one run of ``tests/resume/_resume_worker.py`` (shuffled data, dropout, Adam + OneCycleLR per
step, grad_accum_steps=2 with a ragged last window, torchmetrics + callable metrics, validation,
EarlyStopping, ModelCheckpoint every 2 optimizer steps + top-k + last) with its own seed. The run is
slowed down a little per micro-batch (``--step-sleep``) so that a kill drawn uniformly over its
length lands anywhere: in a forward/backward, an optimizer step, a validation or a checkpoint save.
After the kill a fresh process resumes with ``resume_from="last"`` (or starts over when the kill
came before the first checkpoint) and runs to the end; its weights, optimizer, scheduler, history
and RNG are compared with the uninterrupted run's (``torch.equal``, exact equality).

Usage::

    python bench/crash_soak.py [--trials 20] [--seed 0] [--json results.json] [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "..", "tests", "resume", "_resume_worker.py")
sys.path[:0] = [os.path.join(HERE, "..", "tests"), os.path.join(HERE, "..", "tests", "resume")]

from test_resume import assert_same_run  # noqa: E402  (the same comparison the tests make)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--step-sleep", type=float, default=0.02)
    ap.add_argument("--json")
    ap.add_argument("--device", default="cpu", help="where the runs train (the worker reads NBT_RESUME_DEVICE)")
    args = ap.parse_args()
    os.environ["NBT_RESUME_DEVICE"] = args.device  # every worker below inherits it
    rng = random.Random(args.seed)
    root = tempfile.mkdtemp(prefix="nbt-soak-")
    t_start = time.time()

    seeds = list(range(100, 100 + args.trials))
    refs = [
        {"seed": s, "dir": os.path.join(root, f"ref-ckpt-{s}"), "out": os.path.join(root, f"ref-{s}.pt")} for s in seeds
    ]
    # each seed's uninterrupted reference runs in the process that resumes its killed run (one interpreter fewer
    # per trial: each spends seconds importing, many more on a loaded machine)
    # how long the training part of one slowed-down run takes (kills are drawn over this span)
    probe = subprocess.Popen(
        [
            sys.executable,
            WORKER,
            "--seed",
            str(seeds[0]),
            "--dir",
            os.path.join(root, "probe"),
            "--out",
            os.path.join(root, "p.pt"),
            "--step-sleep",
            str(args.step_sleep),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    probe.stdout.readline()
    t0 = time.time()
    probe.wait()
    span = time.time() - t0

    rows = []
    for i, seed in enumerate(seeds):
        d = os.path.join(root, f"run-{seed}")
        cmd = [
            sys.executable,
            WORKER,
            "--seed",
            str(seed),
            "--dir",
            d,
            "--out",
            os.path.join(root, "never.pt"),
            "--step-sleep",
            str(args.step_sleep),
        ]
        for attempt in range(4):  # a run that finished before its kill is drawn again (it was not killed)
            shutil.rmtree(d, ignore_errors=True)
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            assert proc.stdout.readline().strip() == "fit-started"
            delay = rng.uniform(0.0, span * 0.9 ** (attempt + 1))
            time.sleep(delay)
            proc.send_signal(signal.SIGKILL)
            rc = proc.wait()
            killed = rc == -signal.SIGKILL
            if killed:
                break
        had_ckpt = os.path.exists(os.path.join(d, "last.ckpt"))
        stray = [f for f in os.listdir(d) if f.endswith(".tmp")] if os.path.isdir(d) else []
        out = os.path.join(root, f"resumed-{seed}.pt")
        resume = {"seed": seed, "dir": d, "out": out, "resume": had_ckpt}
        res = subprocess.run(
            [sys.executable, WORKER, "--jobs", json.dumps([resume, refs[i]])], capture_output=True, text=True
        )
        row = {
            "seed": seed,
            "kill_after_s": round(delay, 3),
            "killed": killed,
            "resumed_from_checkpoint": had_ckpt,
            "temp_files_at_kill": len(stray),
            "resume_ok": res.returncode == 0,
            "identical": False,
            "error": None,
        }
        if res.returncode != 0:
            row["error"] = res.stderr.strip().splitlines()[-1][:300] if res.stderr.strip() else f"rc={res.returncode}"
        else:
            ref = torch.load(os.path.join(root, f"ref-{seed}.pt"), weights_only=True)
            got = torch.load(out, weights_only=True)
            try:
                assert_same_run(ref, got, f"seed {seed}")
                row["identical"] = True
            # RuntimeError: torch.equal across devices (a resumed state on another device than the reference's)
            except (AssertionError, RuntimeError) as exc:
                row["error"] = str(exc)[:300]
            row["temp_files_after_resume"] = len([f for f in os.listdir(d) if f.endswith(".tmp")])
        rows.append(row)
        print(
            f"[{i + 1:2d}/{len(seeds)}] seed={seed} kill@{delay:.2f}s killed={killed} "
            f"from_ckpt={had_ckpt} stray_tmp={len(stray)} resumed={row['resume_ok']} identical={row['identical']}"
            + (f" error={row['error']}" if row["error"] else ""),
            flush=True,
        )

    summary = {
        "trials": len(rows),
        "killed": sum(r["killed"] for r in rows),
        "resumed_from_checkpoint": sum(r["resumed_from_checkpoint"] for r in rows),
        "restarted_before_first_checkpoint": sum(not r["resumed_from_checkpoint"] for r in rows),
        "resume_ok": sum(r["resume_ok"] for r in rows),
        "bit_identical": sum(r["identical"] for r in rows),
        "temp_files_at_kill": sum(r["temp_files_at_kill"] for r in rows),
        "temp_files_after_resume": sum(r.get("temp_files_after_resume", 0) for r in rows),
        "run_span_s": round(span, 2),
        "wall_s": round(time.time() - t_start, 1),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, no GPU"
        if not torch.cuda.is_available()
        else torch.cuda.get_device_name(0),
        "versions": {"python": platform.python_version(), "torch": torch.__version__},
    }
    shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(summary, indent=2))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"summary": summary, "rows": rows}, fh, indent=2)
    return 0 if summary["bit_identical"] == summary["trials"] == summary["killed"] else 1


if __name__ == "__main__":
    sys.exit(main())
