"""What a stranger sends beside an event's inputs, on gradio's own routes: session names, function numbers, trigger
ids, endpoint names, event ids, parameter names.  A hostile probe found each case below a 500 with a traceback in
the log; the worst, a session name with a lone surrogate, made every later event of every visitor log one.  Now
each is one line naming what was wrong (in the language the client asks for), the log stays clean, and the honest
session's numbers and generation are exactly what they were.  Against ``python app.py`` on the embedded model."""
from __future__ import annotations

import json
import time

import httpx
import pytest

from hostile_kit import LEAKS, PROMPT, RANDOM, client


def _post(server, path: str, body, headers: dict | None = None) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(server.url + "gradio_api/" + path, content=content, timeout=30,
                      headers={"content-type": "application/json", **(headers or {})})


def _one_line(response: httpx.Response, status: int, *words: str) -> str:
    assert response.status_code == status, (response.status_code, response.text[:300])
    detail = response.json()["detail"]
    assert isinstance(detail, str) and "\n" not in detail, detail
    for word in words:
        assert word.lower() in detail.lower(), (word, detail)
    for leak in LEAKS:
        assert leak not in detail, (leak, detail)
    return detail


def _fn_index(server, api: str) -> int:
    config = httpx.get(server.url + "config", timeout=30).json()
    return next(d["id"] for d in config["dependencies"] if d.get("api_name") == api)


@pytest.mark.parametrize("body, status, words", [
    (b'{"data": [], "fn_index": -1, "session_hash": "probe1"}', 400, ("'-1'", "function numbers")),
    (b'{"data": [], "fn_index": 1000000000, "session_hash": "probe2"}', 400, ("1000000000", "function numbers")),
    (b'{"data": [], "fn_index": NaN, "session_hash": "probe3"}', 400, ("fn_index", "finite")),
    (b'{"data": [], "fn_index": 1e999, "session_hash": "probe4"}', 400, ("fn_index", "finite")),
    (b'{"data": [], "fn_index": true, "session_hash": "probe5"}', 400, ("true", "function numbers")),
    (b'{"data": [], "fn_index": 0, "trigger_id": "\\ud800", "session_hash": "probe6"}', 400,
     ("trigger_id", "surrogate")),
    (b'{"data": [], "fn_index": 0, "trigger_id": 1.5, "session_hash": "probe7"}', 400, ("trigger_id", "whole")),
    (b'{"data": [], "fn_index": 0, "session_hash": "\\ud800"}', 400, ("session_hash", "surrogate")),
    (b'{"data": [], "fn_index": 0, "session_hash": "a b/c"}', 400, ("a b/c", "session name")),
    (b'{"data": [], "fn_index": 0, "session_hash": null}', 400, ("session name",)),
    (b'{"data": [], "fn_index": 0, "session_hash": "probe8", "batched": true}', 400, ("batched",)),
    (b'{"data": [], "fn_index": 0, "session_hash": "probe9", "event_data": {"\\udfff": 1}}', 400,
     ("event_data", "surrogate")),
    (b'[1, 2]', 400, ("JSON object",)),
    (b'{"data": [', 400, ("JSON object",)),
])
def test_a_join_naming_what_no_event_has_is_refused_in_one_line(server, honest, body, status, words):
    _one_line(_post(server, "queue/join", body), status, *words)
    honest(full=False)


@pytest.mark.parametrize("path, body, status, words", [
    ("cancel", b'{"fn_index": 1e999, "session_hash": "probe", "event_id": "x"}', 400, ("fn_index", "finite")),
    ("cancel", b'{"fn_index": 0, "session_hash": "probe", "event_id": "\\u0000"}', 400, ("event_id",)),
    ("call/nope", b'{"data": []}', 404, ("nope", "no endpoint")),
    ("call/v2", b'{"data": []}', 404, ("no endpoint",)),
    ("run/nope", b'{"data": []}', 404, ("nope",)),
    ("api/nope", b'{"data": []}', 404, ("nope",)),
    ("run/predict", b'{"data": [], "fn_index": 1000000000, "session_hash": "probe"}', 400, ("function numbers",)),
    ("call/generate", b'{"data": [], "session_hash": "\\ud800"}', 400, ("session_hash", "surrogate")),
    ("call/v2/generate", b'{"bogus": 1}', 400, ("bogus", "prompt, vector, layer")),
])
def test_other_posts_naming_what_does_not_exist_are_refused_in_one_line(server, honest, path, body, status, words):
    _one_line(_post(server, path, body), status, *words)
    honest(full=False)


@pytest.mark.parametrize("path, status, words", [
    ("heartbeat/%00", 400, ("session name",)),
    ("heartbeat/" + "x" * 200, 400, ("session name",)),
    ("queue/data?session_hash=%ED%A0%80", 400, ("session name",)),
    ("call/generate/nobody-sent-this", 404, ("nobody-sent-this", "not an event")),
    ("call/generate/%00", 404, ("not an event",)),
    ("call/nope/abc", 404, ("nope",)),
])
def test_streams_for_what_does_not_exist_are_refused_not_started_and_cut(server, honest, path, status, words):
    """Each used to start an event stream and then cut it (or build a URL of a NUL when it closed)."""
    _one_line(httpx.get(server.url + "gradio_api/" + path, timeout=30), status, *words)
    honest(full=False)


def test_a_refusal_speaks_the_language_the_client_asks_for(server, honest):
    detail = _one_line(_post(server, "queue/join", b'[1]', headers={"accept-language": "zh-CN,zh;q=0.9,en;q=0.5"}),
                       400, "JSON")
    assert "请求体" in detail, detail
    _one_line(_post(server, "queue/join", b'[1]', headers={"accept-language": "en-GB"}), 400, "JSON object")
    honest(full=False)


def test_after_a_poisoned_session_name_every_later_event_still_runs_without_a_traceback(server, honest):
    """gradio kept the name in its event records; the summary it computes after every event then raised, for every
    visitor, until the records rolled over (ten thousand events)."""
    before = len(server.log.read_text(errors="replace"))
    _one_line(_post(server, "queue/join", b'{"data": [], "fn_index": 0, "session_hash": "\\ud800"}'), 400)
    c = client(server)
    for _ in range(2):
        assert c.predict(PROMPT, RANDOM, 6, 0.5, True, 0, False, api_name="/next_token")[0] is not None
    time.sleep(0.5)
    assert "Traceback" not in server.log.read_text(errors="replace")[before:]
    honest()


def test_the_documented_routes_still_work_for_an_honest_client(server, honest):
    """The checks refuse only what names nothing: a join by function number, /call by name and its results
    stream, /call/v2 by parameter names, and a cancel all still work."""
    data = [PROMPT, RANDOM, 6, 0.5, True, 0, False]
    joined = _post(server, "queue/join", {"data": data, "fn_index": _fn_index(server, "next_token"),
                                          "session_hash": "honest-raw-1", "event_data": None, "trigger_id": None})
    assert joined.status_code == 200, joined.text
    event = _post(server, "call/next_token", {"data": data}).json()["event_id"]
    with httpx.stream("GET", server.url + f"gradio_api/call/next_token/{event}", timeout=120) as stream:
        events = [line for line in stream.iter_lines() if line.startswith("event:")]
    assert events[-1] == "event: complete", events
    v2 = _post(server, "call/v2/next_token", {"prompt": PROMPT, "vector": RANDOM})
    assert v2.status_code == 200 and "event_id" in v2.json(), v2.text
    cancel = _post(server, "cancel", {"fn_index": _fn_index(server, "next_token"), "session_hash": "honest-raw-1",
                                      "event_id": joined.json()["event_id"]})
    assert cancel.status_code == 200, cancel.text
    honest()


def test_gradio_routes_leave_no_traceback_in_the_server_log(server, honest):
    assert "Traceback" not in server.log.read_text(errors="replace")
    honest()
