"""Issue 56 in JupyterLab with the mouse: the learner's run explodes (SGD at lr=50 on digits), Health pauses it, and
one click on the health card's button (its words: restore the weights before step 1, apply LR 0.1 and resume)
brings the run back: it trains on to a loss well below chance, and the card says the fix worked.

The button is clicked by moving Playwright's mouse to the middle of the element and pressing there, as a person
would. Screenshot: ``test-artifacts/health-fix-lab.png`` (the card with its advice and button, before the click).
"""

from __future__ import annotations

import pytest

from ._panel import wait_badge, wait_page
from ._servers import lab_run_all, wait_widgets_rendered, widget_problems

CELLS = [
    "import torch\n"
    "from torch import nn\n"
    "from sklearn.datasets import load_digits\n"
    "from torch.utils.data import DataLoader, TensorDataset\n"
    "from nbtrainer import Health, TrainerWidget\n"
    "torch.set_num_threads(1)\n"
    "x, y = load_digits(return_X_y=True)\n"
    "x = torch.tensor(x, dtype=torch.float32) / 16.0\n"
    "y = torch.tensor(y, dtype=torch.long)\n"
    "order = torch.Generator().manual_seed(0)\n"
    "loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True, generator=order)\n"
    "_ = torch.manual_seed(0)\n"
    "model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))\n"
    "health = Health(every_n_steps=10, on_problem='pause')\n"
    "w = TrainerWidget(model, nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=50.0), loader,\n"
    "                  callbacks=[health], epochs=6, seed=0)\n"
    "w",
]

LIGHT = """(name) => {
    const light = [...document.querySelectorAll('.nbt-health .nbt-health-light')]
        .find(l => l.querySelector('b') && l.querySelector('b').textContent === name);
    return light ? {level: [...light.classList].find(c => /^nbt-health-(ok|warning|problem)$/.test(c)),
                    title: light.getAttribute('title')} : null;
}"""


def _mouse_click(page, selector: str) -> None:
    """Move the mouse to the middle of the element and click there (a person's click, not a dispatched event)."""
    element = page.locator(selector)
    element.scroll_into_view_if_needed()
    box = element.bounding_box()
    assert box is not None and box["width"] > 0, f"{selector} is not on screen"
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.mouse.down()
    page.mouse.up()


@pytest.mark.timeout(240)
def test_one_click_on_the_health_card_restores_lowers_and_the_run_trains(
    lab_server, make_notebook, page, screenshot
) -> None:
    notebook = make_notebook("health_fix", CELLS)
    server = lab_server(notebook.parent)
    page.goto(f"{server.url}/lab/tree/{notebook.name}?reset", wait_until="domcontentloaded", timeout=60_000)
    lab_run_all(page, cpu_s=120)
    wait_widgets_rendered(page, [".nbt-panel", ".nbt-health .nbt-health-lights", "button.nbt-start"], cpu_s=60)

    _mouse_click(page, "button.nbt-start")
    wait_badge(page, "paused", cpu_s=60)  # Health paused it at the step after step 1 wrecked the weights
    wait_page(page, f"() => ({LIGHT})('learning rate').level === 'nbt-health-problem'", cpu_s=30)
    button = "button.nbt-health-apply"
    wait_page(
        page,
        f"() => (document.querySelector('{button}') || {{}}).textContent === "
        "'restore the weights before step 1, apply LR 0.1 and resume'",
        cpu_s=30,
    )
    advice = page.locator(".nbt-health-advice").inner_text()
    assert "Lower the LR to 0.1" in advice and "rounded to 0.1" in advice and "The weights are damaged" in advice
    assert "`" not in advice  # plain text
    screenshot(page, "health-fix-lab", selector=".nbt-health")

    _mouse_click(page, button)
    wait_badge(page, "finished", cpu_s=90)  # resumed, and trained to its end
    wait_page(
        page,
        "() => { const i = document.querySelector('.nbt-lr-exact input'); return i && i.value === '1.00e-1'; }",
        cpu_s=30,
    )
    wait_page(
        page, f"() => ({LIGHT})('learning rate').title.includes('worked')", cpu_s=30
    )  # the next window confirmed the fix
    assert page.locator(button).is_hidden()  # nothing left to apply
    assert widget_problems(page) == []
