"""Many users stay exact with every kind of request in one batch (issue #48).

An unsteered request, a one-term spec, a several-term spec (two vectors at two layers, one in relative α, one raw)
and two chat turns (rendered by the app's chat template path, the prompt steered and not) go to one engine at
once; each must equal its solo run: the same tokens on both sides, every reported probability within 1e-5.  The
steering of each comes through the door as the page's would (``steers_for``; the chat room's own spec and stop
tokens), so the check covers what the terms become, not only how rows are batched.
"""
from __future__ import annotations

import dataclasses
import math
import time

import pytest

from steer_ui.model import generation, static_decode
from steer_ui.model.engine import Engine
from steer_ui.model.generation import Request, side_by_side
from steer_ui.service import Service
from steer_ui.tiny import tiny_handle
from steer_ui.vector import random_vector

from test_chat_room import TEMPLATE

SESSION = "mixed-aaaaaaaaaaaaaaaa"
TOL = 1e-5


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    handle = tiny_handle("llama")  # its own: the tokenizer gets a chat template
    handle.tokenizer.chat_template = TEMPLATE
    return Service(handle=handle, workdir=tmp_path_factory.mktemp("mixed"))


def _mixed_requests(service) -> dict[str, tuple]:
    """name -> (prompt, steers, sampling), each kind of request the page and the API send."""
    hidden = service.handle.arch.hidden_size
    first = service.add_vector(SESSION, dataclasses.replace(random_vector(hidden, 1, seed=31), name="first"))
    second = service.add_vector(SESSION, dataclasses.replace(random_vector(hidden, 3, seed=32), name="second"))
    greedy = service.sampling(max_new_tokens=8, greedy=True)
    sampled = dataclasses.replace(greedy, temperature=0.9, seed=5, top_k=20)
    one = {"vectors": [{"source": first, "scale": 0.6, "layers": [1]}]}
    several = {"vectors": [{"source": first, "scale": 0.5, "layers": [1], "normalize": True},
                           {"source": second, "scale": -3.0, "layers": [3], "normalize": False}]}
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is the weather?"}]
    chat_prompt = service.chat_prompt(messages)
    out = {
        "unsteered": ("Once upon a time", [], greedy),
        "one term": ("The weather today is", service.steers_for(SESSION, one), sampled),
        "several terms": ("Numbers: 1, 2, 3", service.steers_for(SESSION, several), greedy),
    }
    for steer_prompt in (False, True):
        spec = service.chat._spec(several, steer_prompt)  # the chat's positions: "last", or "all"
        out[f"chat, prompt steered: {steer_prompt}"] = (chat_prompt, service.steers_for(SESSION, spec),
                                                        service.chat._sampling(sampled, chat_prompt))
    return out


def _differences(batched, alone) -> list[str]:
    out = []
    for side in ("unsteered", "steered"):
        a, b = getattr(batched, side), getattr(alone, side)
        if [t.token_id for t in a.tokens] != [t.token_id for t in b.tokens] or a.finished != b.finished:
            out.append(f"{side}: tokens {[t.token_id for t in a.tokens]} vs {[t.token_id for t in b.tokens]}")
            continue
        for i, (x, y) in enumerate(zip(a.tokens, b.tokens)):
            gaps = [abs(math.exp(x.logprob) - math.exp(y.logprob))]
            gaps += [abs(p - q) for (_, p), (_, q) in zip(x.alternatives, y.alternatives)]
            if max(gaps) > TOL:
                out.append(f"{side} token {i}: probabilities differ by {max(gaps):.2e}")
    return out


@pytest.mark.parametrize("decode", ["auto", "static"])
def test_unsteered_one_term_several_term_and_chat_requests_in_one_batch_each_get_their_solo_result(
        service, monkeypatch, decode):
    """``auto``: the app's own engine (the dynamic path on a CPU); ``static``: an engine on the static step, the
    GPU's path run eagerly (special tokens masked there too: the chat prompts hold BOS and turn ends)."""
    specs = _mixed_requests(service)
    kinds = {name: [s.positions for s in steers] for name, (_, steers, _) in specs.items()}
    assert kinds["several terms"] == ["all", "all"] and len({s.layer for s in specs["several terms"][1]}) == 2
    assert kinds["chat, prompt steered: False"] == ["last", "last"]
    assert kinds["chat, prompt steered: True"] == ["all", "all"]
    handle = service.handle
    alone = {name: side_by_side(handle, *spec) for name, spec in specs.items()}
    assert all(r.steered.tokens for r in alone.values())

    rows_per_step: list[int] = []
    real_advance = generation.DecodeBatch.advance
    monkeypatch.setattr(generation.DecodeBatch, "advance",
                        lambda self: rows_per_step.append(self.rows) or real_advance(self))  # counts, then steps
    if decode == "static":
        monkeypatch.setenv(static_decode.ENV, "static")
        engine = Engine(handle, max_requests=8)
    else:
        engine = service.engine()
    requests = {name: Request.make(handle, *spec) for name, spec in specs.items()}
    # held by a slider move while they are submitted, the engine takes the five together at its next step
    with engine.interactive():
        tickets = {name: engine.submit(r) for name, r in requests.items()}
    together = {}
    for name, ticket in tickets.items():
        for event in ticket:
            together[name] = event.result
    # three rows a steered request, one for the unsteered one (its sides and Δlogits are its one row's: mirrored)
    assert requests["unsteered"].mirrored and requests["unsteered"].kinds == (generation.STEERED,)
    assert rows_per_step and rows_per_step[0] == sum(len(r.kinds) for r in requests.values()) == 13, rows_per_step
    assert engine.stats.peak_requests >= len(specs)
    assert engine.load["decode"]["path"] == ("static (eager)" if decode == "static" else "dynamic")
    problems = {name: _differences(together[name], alone[name]) for name in specs}
    assert not any(problems.values()), problems
    # the chat turns stop at the template's markers; the steering did something in every steered request
    for name in specs:
        if name != "unsteered":
            assert [t.token_id for t in alone[name].steered.tokens] != \
                [t.token_id for t in alone[name].unsteered.tokens] or alone[name].first_kl > 1e-4, name
    deadline = time.monotonic() + 5
    while engine.load["running"] and time.monotonic() < deadline:
        time.sleep(0.01)
    if decode == "static":
        engine.close(wait=5)
