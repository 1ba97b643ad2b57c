"""Eight clients at once against the running app: each gets exactly its solo result.

The server is ``python app.py --model embedded`` with room for 8 generations in
the decode batch and 2 waiting (so the "busy" answer can be reached with a
handful of clients).  Every client is a separate ``gradio_client.Client``
(its own session) with its own prompt, α, vector seed and sampling.
"""
from __future__ import annotations

import math
import threading
import time

import pytest

from gradio_client import Client

from app_process import Server

pytestmark = pytest.mark.integration

RANDOM = "random direction"
PROMPTS = ("Hi", "The weather today is", "My favourite food is", "Write a poem about the sea. The waves")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    log = tmp_path_factory.mktemp("many_users") / "app.log"
    srv = Server(["--model", "embedded", "--wait", "--batch-requests", "8", "--waiting-generations", "2"], log)
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


def _client(server) -> Client:
    return Client(server.url, verbose=False, download_files=False)


def _args(i: int, tokens: int = 8) -> tuple:
    """generate's inputs: prompt, vector, layer, α, relative, vector seed, greedy, temperature, top-k, top-p,
    repetition penalty, max new tokens, seed."""
    greedy = i % 2 == 0
    return (PROMPTS[i % 4], RANDOM, 4 + i % 3, 0.1 * (i + 1), True, i % 2, greedy, 0.8, 0, 1.0, 1.0, tokens, i)


def _generate(c: Client, args) -> dict:
    *_, result = c.predict(*args, api_name="/generate")
    return result


def _tokens(result: dict) -> tuple:
    return tuple((side, t["token_id"], t["logprob"]) for side in ("unsteered", "steered")
                 for t in result[side]["tokens"])


def _counts(load: dict) -> dict:
    """Running and waiting generations (``/load`` also names the decode path)."""
    return {"running": load["running"], "waiting": load["waiting"]}


def _wait_idle(c: Client, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    load = c.predict(api_name="/load")
    while (load["running"] or load["waiting"]) and time.monotonic() < deadline:
        time.sleep(0.2)
        load = c.predict(api_name="/load")
    return load


def test_eight_clients_at_once_get_their_solo_results(server):
    clients = [_client(server) for _ in range(8)]
    together: list = [None] * 8
    barrier = threading.Barrier(8)

    def run(i):
        barrier.wait()
        together[i] = _generate(clients[i], _args(i))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    alone = [_generate(clients[i], _args(i)) for i in range(8)]  # the same requests, one at a time
    for i in range(8):
        assert together[i] is not None, f"client {i} got nothing"
        got, want = _tokens(together[i]), _tokens(alone[i])
        assert [t[:2] for t in got] == [t[:2] for t in want], f"client {i}: tokens differ"
        # probabilities to float32 noise: a matrix product on this CPU rounds a row differently depending on
        # how many rows are multiplied with it (~1e-6 relative), which Gemma's deep residual stream amplifies
        assert [math.exp(t[2]) for t in got] == pytest.approx([math.exp(t[2]) for t in want], abs=1e-4), \
            f"client {i}: probabilities"
        assert together[i]["steered"]["text"] == alone[i]["steered"]["text"]
    # the eight differ from each other (different prompts, α, vectors and sampling): nothing leaked across
    assert len({_tokens(r) for r in together}) == 8


def test_a_client_that_leaves_mid_stream_frees_its_rows(server):
    c = _client(server)
    job = c.submit(*_args(1, tokens=200), api_name="/generate")
    deadline = time.monotonic() + 120
    while c.predict(api_name="/load")["running"] == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert c.predict(api_name="/load")["running"] == 1
    job.cancel()
    c.close()
    load = _wait_idle(_client(server))
    assert _counts(load) == {"running": 0, "waiting": 0}
    # the path the batch took, and why: on a CPU the embedded Gemma 3 with int8 weights takes the fused step
    assert load["decode"]["path"] == "fused"
    assert "cpu" in load["decode"]["reason"]


def test_a_full_queue_answers_busy_instead_of_hanging(server):
    """8 long generations fill the batch, 2 more wait; the next one is told the server is busy, at once."""
    clients = [_client(server) for _ in range(11)]
    jobs = [clients[i].submit(*_args(i, tokens=250), api_name="/generate") for i in range(10)]
    probe = clients[10]
    deadline = time.monotonic() + 180
    while _counts(probe.predict(api_name="/load")) != {"running": 8, "waiting": 2} and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _counts(probe.predict(api_name="/load")) == {"running": 8, "waiting": 2}
    start = time.monotonic()
    with pytest.raises(Exception, match="busy") as refused:
        _generate(probe, _args(10, tokens=4))
    assert time.monotonic() - start < 30  # an answer, not a wait for the others
    assert "Try again in a moment" in str(refused.value)
    for job in jobs:
        job.cancel()
    for c in clients:
        c.close()
    assert _counts(_wait_idle(_client(server), timeout=120)) == {"running": 0, "waiting": 0}
