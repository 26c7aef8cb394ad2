"""``nbtrainer.quiet_imports`` (issue 38): torchao's CPU-build import noise is dropped while the block runs, only
those known messages, and the library alone (no nbtrainer) still prints them: nothing is silenced globally.

Each case is a fresh interpreter: the noise is printed once per process, at torchao's first import.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import needs

pytestmark = needs("torchao")

NOISE = ("Failed to load", "register_constant()")


def _stderr(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stderr


@pytest.mark.slow
def test_torchao_alone_prints_its_noise_nbtrainer_drops_only_that_and_only_while_it_imports() -> None:
    alone = _stderr("import torchao.quantization")
    if not any(n in alone for n in NOISE):
        pytest.skip("this torchao build loads its kernel libraries quietly: no noise to drop")
    used = _stderr(
        "import logging, torch\n"
        "from nbtrainer import quiet_imports\n"
        "from nbtrainer.inference import quantize_model\n"
        "quantize_model(torch.nn.Sequential(torch.nn.Linear(64, 64)), 'int8-weight')  # imports torchao\n"
        "log = logging.getLogger('torchao')\n"
        "with quiet_imports():\n"
        "    log.warning('Failed to load /x/torchao/_C_known.so: inside the block')\n"
        "    log.warning('a torchao message nbtrainer does not know')\n"
        "log.warning('Failed to load /x/torchao/_C_late.so: after the block')\n"
    )
    lines = used.splitlines()
    assert not [line for line in lines if any(n in line for n in NOISE) and "after the block" not in line], used
    assert "a torchao message nbtrainer does not know" in used  # only the known messages are dropped
    assert "after the block" in used  # and only while the block runs: nothing is silenced for good
