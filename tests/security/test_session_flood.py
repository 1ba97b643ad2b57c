"""A flood of fresh sessions (issue #34): 300 raw ``queue/join`` calls to ``/bundled_dataset``, each with a new
``session_hash``, from one address.  Before, they filled the 256-session table, evicted an honest session that
had just trained a vector, and then evicted each other (and every new honest visitor) for four hours.

This suite runs its own app, since a flood uses up its address's share of sessions for the idle lifetime.  Its
share is 16 sessions (``--sessions-per-address``; the default is 64) and the flood 80 calls: the same code
paths as 64 and 300, at a quarter of the calls (the 300 took two minutes of CI's thirty).
"""
from __future__ import annotations

import time
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


def _open_heartbeat(server, session: str, address: str):
    """A raw connection holding gradio's heartbeat stream for ``session`` open; returns (socket, status)."""
    import socket
    from urllib.parse import urlsplit

    where = urlsplit(server.url)
    sock = socket.create_connection((where.hostname, where.port), timeout=30, source_address=(address, 0))
    sock.sendall(f"GET /gradio_api/heartbeat/{session} HTTP/1.1\r\nHost: {where.netloc}\r\n\r\n".encode())
    head = b""
    while b"\r\n" not in head:
        head += sock.recv(1024)
    return sock, int(head.split(b" ")[1])


def test_one_address_holds_at_most_two_streams_a_session_open_and_others_still_get_theirs(flooded_server):
    """gradio holds a heartbeat open for any session name, as long as the client stays: one address could hold
    every connection the server has.  Now an address holds at most two a session it may keep (a page's heartbeat
    and results stream); past that one line (429), and a stream from elsewhere, or after some closed, opens."""
    import httpx

    server = flooded_server
    honest = watch(server, TINY_LAYER)
    held = [_open_heartbeat(server, f"held-{i}", FLOOD_ADDRESS) for i in range(2 * SHARE)]
    try:
        assert all(status == 200 for _, status in held), [status for _, status in held]
        sock, status = _open_heartbeat(server, "one-too-many", FLOOD_ADDRESS)
        sock.close()
        assert status == 429
        transport = httpx.HTTPTransport(local_address=FLOOD_ADDRESS)
        with httpx.Client(transport=transport, timeout=30) as http:
            detail = http.get(server.url + "gradio_api/heartbeat/one-too-many").json()["detail"]
        assert f"holds {2 * SHARE} event streams" in detail and "\n" not in detail, detail
        sock, status = _open_heartbeat(server, "from-elsewhere", "127.0.0.4")
        sock.close()
        assert status == 200
        honest()
    finally:
        for sock, _ in held:
            sock.close()
    for _ in range(100):  # the server counts a stream closed when it notices the connection went
        sock, status = _open_heartbeat(server, "after-closing", FLOOD_ADDRESS)
        sock.close()
        if status == 200:
            break
        time.sleep(0.1)
    assert status == 200
