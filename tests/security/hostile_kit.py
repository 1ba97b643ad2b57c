"""What the hostile-client suites share: the app as a stranger meets it, the honest session's view, and what a
refusal must look like."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from gradio_client import Client

from raw_http import joined_calls
from same_results import DECODE_TOL, same

RANDOM = "random direction"
PROMPT = "The weather today is"
LAYER = 6
HIDDEN = 640  # Gemma 3 270M
# the apps whose cases are about addresses and sessions, not the model, run the tiny llama (4 blocks): each
# saves an embedded model's load (~10 s) and its generations in CI's 30 minutes
TINY_APP, TINY_LAYER = ["--model", "tiny:llama"], 2
ROOT = Path(__file__).resolve().parents[2]
MEMORY_CAP = 3 * 2**30  # the app's peak resident memory over the whole suite


def client(server, **kwargs) -> Client:
    return Client(server.url, verbose=False, download_files=False, **kwargs)


def honest_numbers(c: Client, layer: int = LAYER) -> dict:
    """The honest session's next-token numbers."""
    *_, numbers = c.predict(PROMPT, RANDOM, layer, 0.5, True, 0, api_name="/next_token")
    return numbers


def honest_view(c: Client, layer: int = LAYER) -> tuple:
    """The honest session's results: next-token numbers and a greedy side-by-side generation."""
    numbers = honest_numbers(c, layer)
    *_, result = c.predict(PROMPT, RANDOM, layer, 0.5, True, 0, True, 0.8, 0, 1.0, 1.0, 8, 0, api_name="/generate")
    # probabilities of the generated tokens: #17's bar is probabilities within float noise
    return (numbers, result["unsteered"]["text"], result["steered"]["text"],
            [math.exp(t["logprob"]) for t in result["steered"]["tokens"]])


def same_view(view: tuple, solo: tuple) -> str | None:
    """None when an honest view matches its solo run: next-token numbers and texts to TOL; the generated tokens'
    probabilities, decoded beside whatever else is running, to DECODE_TOL."""
    return same(view[:3], solo[:3]) or same(view[3], solo[3], DECODE_TOL, "[3]")


def watch(server, layer: int = LAYER):
    """The honest session: its view now, and a check that it is still exactly that (and the server alive).

    ``unchanged(full=False)`` checks the next-token numbers only (~0.3 s against ~2.4 s with the generation on
    two cores): the parametrized refusals use it, each a one-line refusal of the same kind, and the ``honest``
    fixture runs the full check once more when the module ends, so anything an attack left behind (a hook, a
    changed vector, a stuck row) still fails the suite."""
    c = client(server)
    first = honest_view(c, layer)

    def unchanged(full: bool = True) -> None:
        assert server.alive(), "the server stopped answering"
        if full:
            changed = same(honest_view(c, layer), first)
        else:
            changed = same(honest_numbers(c, layer), first[0])
        assert changed is None, f"another session's output changed: {changed}"

    return unchanged


def refused(call, *words: str) -> str:
    """Run ``call``; it must fail with a one-line message containing every word (case-insensitive)."""
    with pytest.raises(Exception) as info:
        call()
    message = str(info.value)
    assert "Traceback" not in message and len(message.strip().splitlines()) <= 2, message
    for word in words:
        assert word.lower() in message.lower(), f"{word!r} not in {message!r}"
    for leak in LEAKS:
        assert leak not in message, f"{leak!r} leaks from {message!r}"
    return message


# What no message to a visitor may contain: exception types, Python's advice, tracebacks.
LEAKS = ("Traceback", "ValueError", "TypeError", "OverflowError", "RecursionError", "KeyError", "AttributeError",
         "set_int_max_str_digits", "Exception", "File \"")


def save_native(path: Path, directions: dict, extras: dict, meta: dict) -> Path:
    from safetensors.torch import save_file

    tensors = {f"direction.{k}": v for k, v in directions.items()}
    tensors.update({f"extra.{k}": v for k, v in extras.items()})
    base = {"hidden_size": HIDDEN, "method": "unknown", "positions": "all", "name": "crafted"}
    save_file(tensors, str(path), metadata={"steer_ui": json.dumps({**base, **meta})})
    return path




def raw_call(server, api: str, data: list, session: str | None = None, body_text: str | None = None,
             address: str = "127.0.0.1") -> tuple:
    """One event over raw HTTP, as a hand-written client would send it: ``("ok", output)``, ``("error", message)``
    or ``("refused", status, detail)`` when the queue does not take it.  ``body_text`` replaces the JSON body
    (to send what ``json.dumps`` cannot, such as a lone surrogate escape); ``address``: the loopback address
    the call comes from (any of 127.0.0.0/8), so one test can be several clients."""
    import httpx

    transport = httpx.HTTPTransport(local_address=address)
    with httpx.Client(transport=transport, timeout=300) as http:
        return _raw_call(http, server, api, data, session, body_text)


def _raw_call(http, server, api, data, session, body_text) -> tuple:
    return joined_calls(http, server.url, api, data, session, body_text, count=1)[0]


def burst(server, api: str, data: list, count: int) -> list[tuple]:
    """``count`` copies of one event joined by one session back to back, before the first can finish (a join
    answers as soon as the request is queued), then every outcome read from the session's one stream, in
    the order they were sent: what a client that floods the queue with its own requests sees."""
    import httpx

    with httpx.Client(timeout=300) as http:
        return joined_calls(http, server.url, api, data, None, None, count)
