"""plan_memory(..., world_size=2, strategy="ddp" | "fsdp"): each row's per-rank prediction against the peak each of
2 gloo CPU ranks measures (tests/dist/ddp_scripts/plan_scenario.py under torchrun), within 15%; and the bad input
refused before anything runs.

One torchrun launch serves every test (``launched``, module-scoped; the module runs on one pytest-xdist worker,
``tests/conftest.py``): its two ranks run FSDP's scenarios, then DDP's, in one process group. Each launch starts two
ranks that import torch, transformers and nbtrainer, about 15 s of CPU.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable

import pytest
import torch.distributed as dist
from _launch import run_group

from nbtrainer import plan_memory

SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "dist", "ddp_scripts")
sys.path.insert(0, SCRIPTS)
import plan_common as pc  # noqa: E402

STRATEGIES = ("fsdp", "ddp")
# both scenarios under both strategies in one launch: alone 36 s (58 CPU s), beside the whole suite 175 s on the VM of
# 2026-12-01, and a loaded machine stretches that again. The launch has no deadline of its own: at this timeout the
# hang guard (tests/_guard.py) ends it only if its ranks stopped moving, and run_group says what they printed
pytestmark = pytest.mark.timeout(600)


def _launch(out) -> dict[str, dict[str, list]]:
    """One torchrun launch of both scenarios (the rows' peaks, the budget's run) under each strategy in turn:
    ``{strategy: {"rows": [rank 0's, rank 1's], "budget": [...]}}``."""
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([SCRIPTS, env.get("PYTHONPATH", "")]))
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           os.path.join(SCRIPTS, "plan_scenario.py"), ",".join(STRATEGIES), str(out), "both"]  # fmt: skip
    proc = run_group(cmd, what="torchrun", cwd=out, env=env)
    assert proc.returncode == 0, f"torchrun failed\nSTDOUT:\n{proc.stdout[-3000:]}\nSTDERR:\n{proc.stderr[-6000:]}"
    return {
        strategy: {
            what: [json.load(open(out / f"{name}.rank{r}.json")) for r in (0, 1)]
            for what, name in (("rows", strategy), ("budget", f"{strategy}-budget"))
        }
        for strategy in STRATEGIES
    }


@pytest.fixture(scope="module")
def launched(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], dict[str, list]]:
    """``launched(strategy)``: that strategy's results from the module's one launch (run at the first test)."""
    done: dict[str, dict[str, list]] = {}

    def get(strategy: str) -> dict[str, list]:
        if not done:
            done.update(_launch(tmp_path_factory.mktemp("ranks")))
        return done[strategy]

    return get


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()), reason="needs torch.distributed + gloo")
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_each_ranks_predicted_peak_is_within_15_percent_of_its_measured_peak(launched, strategy: str) -> None:
    measured = launched(strategy)["rows"]
    plan = plan_memory(pc.llama(), pc.example(), budget_gb=16, device="cpu", world_size=2, strategy=strategy)
    single = plan_memory(pc.llama(), pc.example(), budget_gb=16, device="cpu")
    for i, switches in enumerate(pc.ROWS):
        predicted = plan.predict(optimizer="adamw", **switches).peak_bytes
        for rank in (0, 1):
            assert abs(predicted / measured[rank][i] - 1) <= 0.15, (strategy, switches, rank, predicted, measured)
        alone = single.predict(optimizer="adamw", **switches).peak_bytes
        # FSDP: a rank holds less than one device would; DDP: more (its gradient buckets)
        assert predicted < alone if strategy == "fsdp" else predicted > alone


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()), reason="needs torch.distributed + gloo")
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_budget_under_ddp_and_fsdp_plans_one_rank_and_every_rank_applies_the_same_row(launched, strategy) -> None:
    ranks = launched(strategy)["budget"]
    assert ranks[0]["row"] == ranks[1]["row"] and ranks[0]["split"] == ranks[1]["split"], ranks
    assert ranks[0]["row"] != ranks[0]["plain"], ranks  # the budget excludes the plain whole-batch row
    for r in ranks:
        assert r["steps"] == 2 and r["peak"] <= r["budget"], r


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"world_size": 0}, r"world_size=0.*int >= 1"),
        ({"world_size": 2.0, "strategy": "ddp"}, r"world_size=2.0.*int >= 1"),
        ({"world_size": 1, "strategy": "fsdp"}, r"one rank shards nothing.*world_size=8"),
        ({"world_size": 4}, r"strategy='ddp'.*strategy='fsdp'"),
        ({"world_size": 2, "strategy": "deepspeed"}, r"'ddp' or 'fsdp'"),
    ],
)
def test_bad_ranks_and_strategies_are_refused_before_anything_runs(kwargs, message) -> None:
    import torch

    # any model: the refusal comes before the model is looked at (a Llama here cost its worker transformers' import)
    with pytest.raises(ValueError, match=message):
        plan_memory(torch.nn.Linear(8, 4), torch.randn(2, 8), budget_gb=1, device="cpu", **kwargs)
