"""A flood of fresh sessions (issue #34): 300 raw ``queue/join`` calls to ``/bundled_dataset``, each with a new
``session_hash``, from one address.  Before, they filled the 256-session table, evicted an honest session that
had just trained a vector, and then evicted each other (and every new honest visitor) for four hours.

This suite runs its own app, since a flood uses up its address's share of sessions for the idle lifetime.  Its
share is 16 sessions (``--sessions-per-address``; the default is 64) and the flood 80 calls: the same code
paths as 64 and 300, at a quarter of the calls (the 300 took two minutes of CI's thirty).
"""
from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from app_process import running
from hostile_kit import MEMORY_CAP, PROMPT, TINY_APP, TINY_LAYER, client, raw_call, watch
from same_results import same

FLOOD_ADDRESS = "127.0.0.9"  # the flooding client; the honest ones come from 127.0.0.1
SHARE, FLOOD = 16, 80


@pytest.fixture(scope="module")
def flooded_server(tmp_path_factory):
    with running([*TINY_APP, "--wait", "--sessions-per-address", str(SHARE)],
                 tmp_path_factory.mktemp("flood") / "app.log") as srv:
        yield srv


def test_a_flood_of_fresh_sessions_leaves_every_honest_session_exactly_as_it_was(flooded_server):
    server = flooded_server
    honest = watch(server, TINY_LAYER)  # next-token numbers and a greedy generation, taken now
    trainer = client(server)
    trainer.predict("sentiment_pairs.csv", "auto", api_name="/bundled_dataset")
    trained = trainer.predict("mean-diff", TINY_LAYER, False, "{}", api_name="/train")["vector"]
    numbers = trainer.predict(PROMPT, trained, TINY_LAYER, 0.2, True, 0, api_name="/next_token")[-1]

    with ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(lambda _: raw_call(server, "bundled_dataset", ["capitals_statements.csv", "auto"],
                                                    address=FLOOD_ADDRESS), range(FLOOD)))
    counts = Counter("ok" if o[0] == "ok" else ("busy" if "busy" in str(o[-1]).lower() or
                                                "too many new sessions" in str(o[-1]).lower() else str(o)[:120])
                     for o in outcomes)
    assert set(counts) <= {"ok", "busy"}, counts
    assert counts["ok"] <= SHARE and counts["busy"] >= FLOOD - SHARE, counts  # one address: its share, then "busy"
    newcomer = raw_call(server, "bundled_dataset", ["capitals_statements.csv", "auto"], address="127.0.0.3")
    assert newcomer[0] == "ok", newcomer  # a visitor from elsewhere still gets a session

    honest()
    again = trainer.predict(PROMPT, trained, TINY_LAYER, 0.2, True, 0, api_name="/next_token")[-1]
    assert same(again, numbers) is None  # the trained vector is still there and steers exactly as before
    assert server.peak_rss < MEMORY_CAP, f"peak RSS {server.peak_rss / 2**30:.2f} GB"
