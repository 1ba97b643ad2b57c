"""Issue #46, finding 2: no request holds the others out.  A comparison is admitted by its cost (working memory and
time at the engine's measured speed) before any model work; one that is admitted holds at most its share of the
working memory, so slider moves from other visitors keep answering while it runs."""
from __future__ import annotations

import threading
import time

from hostile_kit import LAYER, PROMPT, RANDOM, client, refused

# ~1,000 Gemma tokens each: 250 variation selectors (four byte tokens each) and a few words
HEAVY = "\U000E0100" * 250 + " and then the story goes on"


def test_a_comparison_that_cannot_finish_in_time_is_refused_up_front_saying_what_to_shrink(server, honest):
    c = client(server)
    prompts = "\n".join(f"{i} {HEAVY}" for i in range(64))
    started = time.monotonic()
    message = refused(lambda: c.predict(prompts, False, RANDOM, LAYER, 0.3, True, 0, 1.0, 256, api_name="/compare"),
                      "time limit", "at most", "prompts")
    assert time.monotonic() - started < 60, "refused before any generation (it ran 420 s before)"
    assert "300 s" in message
    honest()


def test_slider_moves_keep_answering_while_a_comparison_runs(server, honest):
    """Eight visitors move sliders while a comparison of 16 prompts runs: every move answers (none is told the
    server is busy), the comparison finishes, and the honest session's numbers are exactly as before."""
    outcome: dict = {}

    def compare():
        try:
            prompts = "\n".join(f"Visitor prompt number {i} is about the weather in town" for i in range(16))
            outcome["compare"] = client(server).predict(prompts, False, RANDOM, LAYER, 0.3, True, 0, 1.0, 24,
                                                        api_name="/compare")
        except Exception as exc:  # noqa: BLE001 - reported below
            outcome["compare"] = exc

    runner = threading.Thread(target=compare)
    runner.start()
    time.sleep(2.0)  # the comparison has started generating
    moves, failures = [], []

    def visitor(i: int):
        c = client(server)
        for k in range(4):
            try:
                *_, numbers = c.predict(PROMPT, RANDOM, LAYER, 0.1 * (k + 1) * (1 if i % 2 else -1), True, 0,
                                        api_name="/next_token")
                moves.append(numbers)
            except Exception as exc:  # noqa: BLE001 - counted below
                failures.append(str(exc))

    visitors = [threading.Thread(target=visitor, args=(i,)) for i in range(8)]
    for t in visitors:
        t.start()
    for t in visitors:
        t.join(timeout=240)
    runner.join(timeout=300)
    assert not failures, failures[:3]
    assert len(moves) == 32
    result = outcome.get("compare")
    assert isinstance(result, dict), result
    assert len(result["rows"]) == 16 and "stopped" not in result["summary"]
    honest()
