"""The health card in a real Chromium (Voila): an LR 100x too high turns its learning-rate light to problem, Health
pauses the run, and its button (the advised action: "... apply LR ... and resume") sets the advised LR in the trainer
and resumes.

Screenshot: ``test-artifacts/panel-health-problem.png``.
"""

from __future__ import annotations

import re

import pytest

from nbtrainer import format_lr

from ._panel import wait_badge, wait_page, wait_shown
from ._servers import wait_widgets_rendered, widget_problems

CELLS = [
    "import time, torch\n"
    "from torch import nn\n"
    "from sklearn.datasets import load_digits\n"
    "from torch.utils.data import DataLoader, TensorDataset\n"
    "from nbtrainer import Health, TrainerWidget\n"
    "torch.set_num_threads(1)\n"
    "_ = torch.manual_seed(0)\n"
    "x, y = load_digits(return_X_y=True)\n"
    "x = torch.tensor(x, dtype=torch.float32) / 16.0\n"
    "y = torch.tensor(y, dtype=torch.long)\n"
    "loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True, generator=torch.Generator().manual_seed(0))",
    "class Slow(nn.Module):\n"
    "    def __init__(self, inner):\n"
    "        super().__init__()\n"
    "        self.inner = inner\n"
    "    def forward(self, x):\n"
    "        time.sleep(0.02)  # about 40 steps a second: the browser can watch\n"
    "        return self.inner(x)\n"
    "model = Slow(nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)))\n"
    "w = TrainerWidget(model, nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=5.0), loader,\n"
    "                  callbacks=[Health(on_problem='pause')], epochs=5, seed=0)  # the LR: 100x too high\n"
    "w",
]

LR_LIGHT = """() => {
    const light = [...document.querySelectorAll('.nbt-health .nbt-health-light')]
        .find(l => l.querySelector('b') && l.querySelector('b').textContent === 'learning rate');
    return light ? [...light.classList].find(c => c.startsWith('nbt-health-') && c !== 'nbt-health-light') : null;
}"""


@pytest.mark.timeout(240)
def test_the_card_turns_to_problem_and_apply_lr_sets_it_and_resumes(voila_server, make_notebook, page, screenshot):
    server = voila_server(make_notebook("panel_health", CELLS))
    page.goto(server.url + "/", wait_until="domcontentloaded", timeout=90_000)
    wait_widgets_rendered(page, [".nbt-panel", ".nbt-health .nbt-health-lights", "button.nbt-start"], cpu_s=60)
    assert page.evaluate(LR_LIGHT) == "nbt-health-ok"

    page.locator("button.nbt-start").click()
    wait_page(page, f"() => ({LR_LIGHT})() === 'nbt-health-problem'", cpu_s=60)
    wait_badge(page, "paused", cpu_s=60)  # on_problem="pause": held at the next step boundary
    button = page.locator("button.nbt-health-apply-lr")
    wait_shown(page, "button.nbt-health-apply-lr", cpu_s=30)
    wait_page(
        page,
        "() => (document.querySelector('button.nbt-health-apply-lr') || {}).textContent.includes('and resume')",
        cpu_s=30,
    )
    # the advised action in words; the LR computed from the measured update ratio (issue 56)
    words = button.inner_text().strip()
    advised = re.search(r"apply LR ([0-9.e-]+) and resume$", words)
    assert advised, words
    advice = page.locator(".nbt-health-advice").inner_text()
    assert "changed the weights by" in advice and f"Lower the LR to {advised.group(1)}" in advice
    screenshot(page, "panel-health-problem", selector=".nbt-health")

    button.click()
    wait_badge(page, "running", cpu_s=60)  # resumed
    # the LR change came back through the event stream: the panel's exact-LR box shows the trainer's new LR
    shown = format_lr(float(advised.group(1)))
    wait_page(
        page,
        f"() => {{ const i = document.querySelector('.nbt-lr-exact input'); return i && i.value === '{shown}'; }}",
        cpu_s=30,
    )
    page.locator("button.nbt-stop").click()
    wait_badge(page, "stopped", cpu_s=60)
    assert not widget_problems(page)
