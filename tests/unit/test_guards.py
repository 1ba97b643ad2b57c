"""The checks every request passes (issue #34): one number parser, texts counted in tokens, a memory formula the
policy caps, pushes that would overflow, and settings JSON that cannot exhaust the parser."""
from __future__ import annotations

import math

import pytest
import torch

from steer_ui.guards import Guard, settings_json
from steer_ui.messages import UserError
from steer_ui.model.budget import count_tokens, request_bytes
from steer_ui.model.hooks import HeadSteer, Steer
from steer_ui.numbers import NumberError, parse_number
from steer_ui.policy import Policy


@pytest.mark.parametrize("value, kwargs, expected", [
    ("0.5", {}, 0.5), (" 7 ", {"integer": True}, 7), (6.0, {"integer": True}, 6), (3, {}, 3.0),
    (torch.tensor(2.5), {}, 2.5),
])
def test_the_number_parser_reads_numbers_as_numbers(value, kwargs, expected):
    out = parse_number(value, "x", **kwargs)
    assert out == expected and type(out) is type(expected)


@pytest.mark.parametrize("value, kwargs, problem", [
    ("abc", {}, "not_a_number"), (None, {}, "not_a_number"), (True, {}, "not_a_number"), ([1], {}, "not_a_number"),
    ("nan", {}, "not_finite"), (float("inf"), {}, "not_finite"), ("9" * 5000, {}, "not_a_number"),
    (10**5000, {}, "too_large"), (-(10**400), {}, "too_small"), (6.7, {"integer": True}, "not_whole"),
    (5, {"high": 4}, "too_large"), (-1, {"low": 0}, "too_small"), ("\ud800", {}, "not_a_number"),
], ids=lambda v: None if not isinstance(v, int) or abs(v) < 10**20 else "huge-int")
def test_the_number_parser_refuses_in_one_short_line(value, kwargs, problem):
    with pytest.raises(NumberError) as info:
        parse_number(value, "x", **kwargs)
    assert info.value.problem == problem
    text = str(info.value)
    assert text.startswith("x ") and len(text) < 100 and "set_int_max_str_digits" not in text


def test_texts_are_counted_in_tokens_and_the_memory_formula_caps_rows(tiny):
    handle = tiny("llama")  # a byte tokenizer: one token per byte, so U+E0100 is four
    guard = Guard(Policy(max_prompt_chars=4000, max_prompt_tokens=100, max_request_bytes=1 << 30))
    assert guard.prompt(handle, "\U000E0100" * 20).tokens == count_tokens(handle, "\U000E0100" * 20) >= 80
    with pytest.raises(UserError) as info:
        guard.prompt(handle, "\U000E0100" * 30)  # 30 characters, 120+ tokens
    assert info.value.key == "too_many_tokens" and info.value.params["limit"] == 100
    tight = Guard(Policy(max_request_bytes=request_bytes(handle, 50, rows=3)))
    tight.prompt(handle, "a" * 40, rows=3)
    with pytest.raises(UserError) as info:
        tight.prompt(handle, "a" * 40, rows=30)  # the same text, ten times the rows
    assert info.value.key == "request_too_large" and info.value.params["rows"] == 30


def test_the_memory_formula_grows_with_rows_and_quadratically_with_tokens(tiny):
    handle = tiny("llama")
    one = request_bytes(handle, 100, rows=1)
    assert request_bytes(handle, 100, rows=4) == 4 * one
    assert request_bytes(handle, 400, rows=1) > 4 * request_bytes(handle, 100, rows=1)  # attention's tokens²


@pytest.mark.parametrize("text, key", [("\ud800abc", "text_not_unicode"), ("   ", "empty_prompt"),
                                       ("x" * 4001, "prompt_too_long"), (5, "text_not_text")])
def test_a_prompt_that_is_not_usable_text_is_refused(tiny, text, key):
    with pytest.raises(UserError) as info:
        Guard(Policy()).prompt(tiny("llama"), text)
    assert info.value.key == key


def test_a_push_that_overflows_the_residual_arithmetic_is_refused(tiny):
    handle = tiny("llama")
    guard = Guard(Policy())
    hidden = handle.arch.hidden_size
    guard.pushes(handle, [Steer(layer=1, vector=torch.ones(hidden), alpha=1e3)])
    for vector, alpha in ((torch.full((hidden,), 3e38), 1.0), (torch.full((hidden,), 1e19), 1.0),
                          (torch.ones(hidden), 1e30)):
        with pytest.raises(UserError) as info:
            guard.pushes(handle, [Steer(layer=1, vector=vector, alpha=alpha)])
        assert info.value.key == "push_overflows"
    with pytest.raises(UserError):
        guard.pushes(handle, [HeadSteer({1: torch.full((hidden,), 1e20)}, alpha=1.0)])
    # below the bound the steered model's logits stay finite: the bound is where the arithmetic breaks
    limit = math.sqrt(torch.finfo(torch.float32).max / hidden) / 2
    steer = Steer(layer=1, vector=torch.full((hidden,), limit), alpha=1.0)
    guard.pushes(handle, [steer])
    from steer_ui.model.analysis import naive_logits

    assert torch.isfinite(naive_logits(handle, "hello", [steer])).all()


@pytest.mark.parametrize("text, key, word", [
    ("[" * 60_000, "nested", "nested"), ('{"a": ' + "9" * 5000 + "}", "long_number", "5000 characters"),
    ('{"a": NaN}', "not_finite", "NaN"), ('{"a": Infinity}', "not_finite", "Infinity"),
    ("x" * 70_000, "too_long", "70000 characters"), ("[1, 2]", "not_object", "object"),
    ("{oops", "unreadable", "line 1, column 2"), (7, "not_text", "JSON text")], ids=lambda v: str(v)[:12])
def test_settings_json_is_bounded_while_it_is_parsed(text, key, word):
    with pytest.raises(UserError) as info:
        settings_json(text)
    assert info.value.key == "settings_json_" + key and word in str(info.value)
    assert "Error" not in str(info.value).replace("UserError", "")
    assert "Expecting" not in str(info.value)  # plain words, not the json module's


def test_settings_json_reads_plain_objects():
    assert settings_json('{"epochs": 3, "lr": 0.01, "compare": false}') == {"epochs": 3, "lr": 0.01, "compare": False}
    assert settings_json({"epochs": 2}) == {"epochs": 2} and settings_json("") == {} and settings_json(None) == {}


def test_requests_in_flight_never_hold_more_than_the_memory_budget_together():
    import threading
    import time

    guard = Guard(Policy(max_inflight_bytes=100, inflight_wait_seconds=0.3))
    with guard.reserve(60):
        with pytest.raises(UserError) as info:  # 60 + 60 > 100: waits, then busy
            with guard.reserve(60):
                pass
        assert info.value.key == "memory_busy"
        with guard.reserve(40):  # fits beside it
            pass
    order = []
    held = threading.Event()

    def first():
        with guard.reserve(80):
            held.set()
            time.sleep(0.1)
            order.append("first done")

    worker = threading.Thread(target=first)
    worker.start()
    held.wait()
    with guard.reserve(80):  # waits for the first to finish, then runs
        order.append("second ran")
    worker.join()
    assert order == ["first done", "second ran"]


def test_the_fair_queue_puts_a_newcomer_before_a_flooding_address_s_backlog():
    from types import SimpleNamespace

    from steer_ui.ui.fair_queue import _reorder

    def event(address, name):
        return SimpleNamespace(request=SimpleNamespace(client=SimpleNamespace(host=address)), name=name)

    line = [event("flood", f"f{i}") for i in range(5)] + [event("other", "o0")]
    newcomer = event("honest", "h0")
    line.append(newcomer)
    _reorder(line, newcomer)
    assert [e.name for e in line] == ["f0", "h0", "f1", "f2", "f3", "f4", "o0"]
    second = event("honest", "h1")
    line.append(second)
    _reorder(line, second)  # the honest address's second request waits behind every address's second
    assert [e.name for e in line].index("h1") == 3


def test_a_request_body_over_the_limit_is_refused_before_the_app_reads_it():
    import asyncio

    from steer_ui.ui.request_guard import RequestLimits

    seen = []

    async def app(scope, receive, send):
        seen.append(await receive())

    async def run(chunks, headers):
        sent = []
        queue = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]

        async def receive():
            return queue.pop(0)

        async def send(message):
            sent.append(message)

        # a route whose body only the size limit reads (gradio's event routes also check what the JSON names)
        scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": headers}
        await RequestLimits(app, limit=10)(scope, receive, send)
        return sent

    sent = asyncio.run(run([b"x" * 4, b"y" * 4], []))  # within the limit: passed on whole
    assert not sent and seen[-1]["body"] == b"xxxxyyyy"
    sent = asyncio.run(run([b"x" * 6, b"y" * 6], []))  # chunked past the limit
    assert sent[0]["status"] == 413 and len(seen) == 1
    sent = asyncio.run(run([b"x"], [(b"content-length", b"999")]))  # declared past the limit
    assert sent[0]["status"] == 413 and len(seen) == 1
