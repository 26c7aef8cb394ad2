"""The panel's pushes wait for the page (``widgets/_flow``), with the page's side played by a thread that does what
the page's ``jsdlink`` does: copy ``ping`` to ``pong`` once it has drawn, here after a fixed delay. The real link, in
a real page: ``test_a_page_that_draws_slowly_still_answers_pause_resume_and_stop`` (tests/browser/test_panel_classic).
"""

from __future__ import annotations

import threading
import time

from widget_helpers import make_widget, wait_for

from nbtrainer.widgets._flow import MAX_IN_FLIGHT


def _slow_page(flow, delay: float, stop: threading.Event, seen: list[tuple[int, int | None]]) -> threading.Thread:
    """Answers each push ``delay`` seconds after it came; ``seen``: (push number, answered before it) per push.

    The link's first sync (a page that renders the panel) happens here, before the first push is watched: done on the
    page's thread, it raced the pump's first pushes, which go ungated while no page has answered, and a loaded CI
    machine recorded push 1 as sent with nothing answered (the colab pass of ebf0f23)."""
    flow.pong.value = flow.ping.value

    def on_ping(change) -> None:
        seen.append((change["new"], flow.answered))

    flow.ping.observe(on_ping, "value")

    def page() -> None:
        while not stop.is_set():
            n = flow.ping.value
            if n > (flow.answered or 0):
                time.sleep(delay)  # drawing it
                flow.pong.value = n
            else:
                time.sleep(0.005)

    t = threading.Thread(target=page, daemon=True)
    t.start()
    return t


def test_a_slow_page_has_at_most_one_push_unanswered_and_the_run_is_not_slowed():
    # ~100 steps of ~10 ms, a push every 50 ms: far more often than this page draws
    w = make_widget(n=256, bs=8, epochs=3, slow=0.01)
    w.start()
    flow = w._pump.flow
    stop, seen = threading.Event(), list[tuple[int, int | None]]()
    page = _slow_page(flow, 0.3, stop, seen)
    try:
        h = w.wait()
    finally:
        stop.set()
        page.join(5)
    assert h.status == "finished"
    live = seen[:-1]  # the final push goes whatever the page has drawn
    assert len(live) >= 3, seen
    # each push went only once the one before it had been answered (the first sync answered push 0)
    late = [(n, answered) for n, answered in live if answered is None or n - 1 - answered >= MAX_IN_FLIGHT]
    assert not late, f"pushes sent with {MAX_IN_FLIGHT} or more unanswered: {late}"


def test_without_a_page_or_once_it_stops_answering_the_pushes_go_as_before():
    w = make_widget(n=256, bs=8, epochs=2, slow=0.01)
    w.start()
    flow = w._pump.flow
    w.wait()
    assert flow.answered is None and flow.pushes >= 3  # nobody answered: nothing waited

    w = make_widget(n=512, bs=8, epochs=40, slow=0.01)
    w.start()
    flow = w._pump.flow
    flow.stale_s = stale_s = 0.8  # the default's 3 s, shortened: the same gate, a shorter wait
    wait_for(lambda: flow.pushes >= 1, what="the first push")
    flow.pong.value = 0  # a page drew the first sync, then went away (closed, or its messages not read)
    answered_at = time.monotonic()
    time.sleep(0.2)  # a push the gate let through just before the answer has gone out
    held = flow.pushes
    time.sleep(stale_s / 2)
    if time.monotonic() - answered_at < stale_s:  # (a loaded machine may oversleep)
        assert flow.pushes == held, "pushed with push 1 unanswered"
    # no answer for stale_s: the pushes go again, one per interval
    wait_for(lambda: flow.pushes > held + 2, what="pushes after stale_s without an answer")
    assert time.monotonic() - answered_at >= stale_s
    w.stop()
    w.wait()
