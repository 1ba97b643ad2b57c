"""A hostile client against ``/v1`` (issue #49): sources it may not use, a path as a source, specs and numbers out of
every bound, a flood of streams from one client, a client that leaves mid-stream, bodies that are not JSON or not
the right types.  Each is one 4xx in OpenAI's error shape with a one-line message, and afterwards an honest API
client's steered answer (tokens, log-probabilities, Δlogits) and the honest page session's numbers are exactly
what they were.  Against ``python app.py`` on the embedded model (the suites' shared ``server``)."""
from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from gradio_client import Client

from hostile_kit import LAYER, LEAKS, PROMPT, client
from same_results import DECODE_TOL

openai = pytest.importorskip("openai", reason="the openai SDK is in requirements-dev.txt")

STEERING = {"vectors": [{"source": "random", "seed": 5, "scale": 0.6, "layers": [LAYER], "normalize": True}]}


def _sdk(server, **kwargs):
    return openai.OpenAI(base_url=server.url + "v1", api_key="unused", max_retries=0, timeout=300, **kwargs)


def _post(server, body, path: str = "completions", headers: dict | None = None) -> httpx.Response:
    """``body``: a dict sent as JSON (Python's, which writes NaN and Infinity as JavaScript does), or bytes as
    they are."""
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(server.url + "v1/" + path, content=content, timeout=300,
                      headers={"content-type": "application/json", **(headers or {})})


def _one_refusal(answer: httpx.Response, status: int | tuple, *words: str) -> dict:
    """One 4xx in OpenAI's shape, its message one line that names what was wrong and leaks nothing."""
    statuses = status if isinstance(status, tuple) else (status,)
    assert answer.status_code in statuses, (answer.status_code, answer.text[:300])
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    message = error["message"]
    assert isinstance(message, str) and message.strip() and "\n" not in message and len(message) < 400, message
    for word in words:
        assert word.lower() in message.lower(), f"{word!r} not in {message!r}"
    for leak in LEAKS:
        assert leak not in message, f"{leak!r} leaks from {message!r}"
    return error


def _rows(server) -> dict:
    return Client(server.url, verbose=False, download_files=False).predict(api_name="/load")


@pytest.fixture(scope="module")
def honest_api(server, honest):
    """An honest API client's greedy steered completion with log-probabilities and its Δlogits; calling the
    fixture checks it is still that (and the honest page session's numbers too)."""
    sdk = _sdk(server)

    def ask():
        answer = sdk.completions.create(model="embedded", prompt=PROMPT, max_tokens=8, temperature=0, logprobs=1,
                                        extra_body={"steering": STEERING})
        c = answer.choices[0]
        return c.text, c.logprobs.tokens, c.logprobs.token_logprobs, c.logprobs.model_extra["delta_logit"]

    first = ask()

    def unchanged() -> None:
        assert server.alive(), "the server stopped answering"
        text, tokens, logprobs, deltas = ask()
        assert (text, tokens) == first[:2]
        assert logprobs == pytest.approx(first[2], abs=DECODE_TOL)
        assert deltas == pytest.approx(first[3], abs=DECODE_TOL)
        honest(full=False)

    return unchanged


def _body(**fields) -> dict:
    return {"model": "embedded", "prompt": PROMPT, "max_tokens": 4, "temperature": 0, **fields}


def _spec(**term) -> dict:
    return {"vectors": [{"source": "random", "seed": 1, "scale": 0.3, **term}]}


# ------------------------------------------------------------------------------------------ sources
def test_an_unknown_source_is_a_404_never_an_unsteered_answer(server, honest_api):
    for source in ("no such vector", "x" * 300, "shared:AAAAAAAAAAAAAAAAAAAAAA"):
        _one_refusal(_post(server, _body(steering={"vectors": [{"source": source, "scale": 0.3}]})), (400, 404))
    honest_api()


def test_another_owner_s_unshared_vector_is_refused_like_an_unknown_one(server, honest_api):
    page = client(server)
    token = page.predict(api_name="/whoami")
    owner = Client(server.url, verbose=False, download_files=False, headers={"X-Steer-Owner": token})
    owner.predict("capitals_statements.csv", "auto", api_name="/bundled_dataset")
    name = owner.predict("mean-diff", LAYER, False, "{}", api_name="/train")["vector"]
    theirs = _body(steering={"vectors": [{"source": name, "scale": 0.3}]})
    assert _post(server, theirs, headers={"X-Steer-Owner": token}).status_code == 200  # the owner may
    stranger = client(server).predict(api_name="/whoami")
    unknown = _one_refusal(_post(server, _body(steering={"vectors": [{"source": "surely-not-a-vector", "scale": 0.3}]})),
                           404)
    for headers in ({}, {"X-Steer-Owner": stranger}, {"X-Steer-Owner": "not-a-token"},
                    {"X-Steer-Owner": token[:-1] + ("A" if token[-1] != "A" else "B")}):
        error = _one_refusal(_post(server, theirs, headers=headers), (400, 401, 403, 404))
        assert error["code"] == unknown["code"] or error["code"] in ("invalid_owner", "bad_owner"), error
    honest_api()


@pytest.mark.parametrize("source", ["/etc/passwd", "../../app.py", "app.py", "assets", "~/.cache/steer_ui/library.db",
                                    "file:///etc/hostname", "C:\\Windows\\win.ini"])
def test_a_server_path_as_source_reads_nothing(server, honest_api, source):
    answer = _post(server, _body(steering={"vectors": [{"source": source, "scale": 0.3}]}))
    _one_refusal(answer, (400, 404))
    for content in ("root:x:", "argparse", "SQLite format", "[fonts]", "def "):  # nothing of the file comes back
        assert content not in answer.text
    honest_api()


# ------------------------------------------------------------------------------------- sizes and numbers
@pytest.mark.parametrize("steering, words", [
    ({"vectors": [{"source": "random", "seed": i, "scale": 0.1} for i in range(1000)]}, ["8"]),
    ({"vectors": [{"source": "random", "scale": 0.3, "layers": list(range(1000))}]}, []),
    ({"vectors": [{"source": "random", "scale": 0.3, "layers": [10 ** 9]}]}, ["0 to 17"]),
    # the model's last layer, not int64's bound ("at most 9.22337e+18", a hostile probe)
    ({"vectors": [{"source": "random", "scale": 0.3, "layers": [10 ** 30]}]}, ["0 to 17"]),
    ({"vectors": [{"source": "random", "scale": 0.3, "layers": [1e30]}]}, ["0 to 17"]),
    ({"vectors": [{"source": "random", "scale": 1e300}]}, []),
    ({"vectors": [{"source": "random", "scale": -1e300, "normalize": False}]}, []),
    ({"vectors": [{"source": "random", "scale": "0.3"}]}, ["number"]),
    ({"vectors": [{"source": "random", "scale": True}]}, ["number"]),
    ({"vectors": [{"source": "random", "scale": 0.3, "layers": ["6"]}]}, ["number"]),
    ({"vectors": [{"source": "random", "scale": 0.3, "layer": 6.5}]}, []),
    ({"vectors": [{"source": "random", "scale": 0.3, "normalize": "yes"}]}, []),
    ({"vectors": [{"source": "random", "scale": 0.3, "seed": "1"}]}, ["number"]),
    ({"vectors": [{"source": "random", "scale": 0.3, "seed": 10 ** 30}]}, []),
    ({"vectors": [{"source": 7, "scale": 0.3}]}, []),
    ({"vectors": "random"}, []),
    ({"vectors": []}, []),
    ("random", []),
    ({"vectors": [{"source": "random", "scale": 0.3, "apply": {"phases": ["everything"]}}]}, []),
    ({"vectors": [{"source": "random", "scale": 0.3, "surprise": 1}]}, []),
])
def test_a_spec_out_of_bounds_is_a_400(server, honest_api, steering, words):
    error = _one_refusal(_post(server, _body(steering=steering)), 400, *words)
    assert error["param"] in ("steering", None), error
    honest_api()


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_a_non_finite_scale_is_a_400(server, honest_api, literal):
    body = json.dumps(_body(steering={"vectors": [{"source": "random", "scale": 0.5}]})).replace("0.5", literal)
    _one_refusal(_post(server, body.encode()), 400)
    honest_api()


@pytest.mark.parametrize("field, value", [
    ("max_tokens", 10 ** 9), ("max_tokens", 0), ("max_tokens", -5), ("n", 10 ** 6), ("n", 0), ("logprobs", 10 ** 6),
    ("temperature", 1e300), ("top_p", float("nan")), ("seed", 10 ** 40), ("stop", ["x"] * 1000),
    ("stop", ["x" * 10 ** 5]), ("top_k", 10 ** 12), ("repetition_penalty", float("inf")),
])
def test_numbers_out_of_bounds_are_a_400_naming_the_field(server, honest_api, field, value):
    error = _one_refusal(_post(server, _body(**{field: value})), 400)
    assert error["param"] == field, error
    honest_api()


def test_numbers_of_hundreds_of_digits_are_a_400_and_give_their_place_back(server, honest_api):
    """A 400-digit integer is no float: it broke the check (OverflowError) past the point where the request's place
    among its address's 8 is given back, so eight of them shut /v1 for the address until a restart (a hostile
    probe).  Sixteen here, each one 400 naming its field; then the honest client is served, not told it is busy."""
    fields = ("max_tokens", "seed", "n", "top_k", "temperature", "top_p", "repetition_penalty", "logprobs")
    for path in ("completions", "chat/completions"):
        start = b'{"model": "embedded", ' + (b'"prompt": "x", ' if path == "completions" else
                                             b'"messages": [{"role": "user", "content": "x"}], ')
        for field in fields:
            raw = start + b'"' + field.encode() + b'": 1' + b"0" * 400 + b"}"
            error = _one_refusal(_post(server, raw, path), 400, field)
            assert error["param"] == field and len(error["message"]) < 200, error
    honest_api()


def test_a_lone_surrogate_echoed_back_is_written_as_an_escape(server, honest_api):
    error = _one_refusal(_post(server, b'{"model": "embedded", "prompt": "Hi", "max_tokens": 2, "\\ud800": 1}'), 400)
    assert "\\ud800" in error["message"], error  # the key named, its surrogate as an escape
    honest_api()


def test_a_prompt_or_conversation_over_the_token_bound_is_a_400(server, honest_api):
    _one_refusal(_post(server, _body(prompt="\U00013000" * 4000)), 400)
    _one_refusal(_post(server, {"model": "embedded", "max_tokens": 2,
                                "messages": [{"role": "user", "content": "word " * 3000}] * 8},
                       "chat/completions"), 400)
    honest_api()


# ------------------------------------------------------------------------------------ malformed bodies
@pytest.mark.parametrize("raw", [
    b"{not json", b"", b"[]", b"null", b"42", b'"a string"', b"\xff\xfe\x00{", b"[" * 100000 + b"]" * 100000,
    b'{"model": "embedded", "prompt": "x", "max_tokens": ' + b"9" * 5000 + b"}",
    b'{"model": "embedded", "prompt": "\\ud800", "max_tokens": 2}',
])
def test_a_body_that_is_not_a_json_object_is_one_400(server, honest_api, raw):
    for path in ("completions", "chat/completions"):
        _one_refusal(_post(server, raw, path), 400)
    honest_api()


@pytest.mark.parametrize("path, fields", [
    ("completions", {"prompt": 5}), ("completions", {"prompt": ["a", "b"]}), ("completions", {"prompt": None}),
    ("completions", {"max_tokens": "10"}), ("completions", {"temperature": "hot"}), ("completions", {"stream": "yes"}),
    ("completions", {"n": 2.5}), ("completions", {"stop": [1]}), ("completions", {"seed": True}),
    ("completions", {"compare": "true"}), ("completions", {"model": ["embedded"]}), ("completions", {"model": ""}),
    ("completions", {"steering": 3}), ("completions", {"vllm_xargs": {"steering": "{not json"}}),
    # too deep for the parser, a number past Python's digits: each a 500 and a traceback (a hostile probe)
    ("completions", {"vllm_xargs": {"steering": "[" * 5000}}),
    ("completions", {"vllm_xargs": {"steering": "[" + "9" * 5000 + "]"}}),
    ("completions", {"stream_options": {"include_usage": 1}}), ("completions", {"logit_bias": {"5": 100}}),
    ("completions", {"surprise": 1}),
    ("chat/completions", {"messages": "hi"}), ("chat/completions", {"messages": []}),
    ("chat/completions", {"messages": [5]}), ("chat/completions", {"messages": [{"role": "user"}]}),
    ("chat/completions", {"messages": [{"role": "user", "content": 5}]}),
    ("chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}]}),
    ("chat/completions", {"messages": [{"role": "user", "content": "x"}] * 100000}),
    ("chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 5}),
])
def test_wrong_types_are_one_400(server, honest_api, path, fields):
    body = _body(**fields)
    if path.startswith("chat"):
        body.pop("prompt")
        body.setdefault("messages", [{"role": "user", "content": "Hello"}])
    if "prompt" in fields and fields["prompt"] is None:
        body.pop("prompt")
    _one_refusal(_post(server, body, path), 400)
    honest_api()


def test_a_stop_string_of_white_space_is_a_stop_string(server, honest_api):
    """OpenAI clients' commonest stop string, "\n", was refused as empty (a hostile probe); only "" is none."""
    response = _post(server, _body(stop=["\n", " "], max_tokens=3))
    assert response.status_code == 200, response.text
    _one_refusal(_post(server, _body(stop=[""], max_tokens=3)), 400)
    honest_api()


def test_a_client_that_hangs_up_mid_body_leaves_no_traceback(server, honest_api):
    """It was logged with a ClientDisconnect traceback each time: a log flood for the price of a socket."""
    import socket
    from urllib.parse import urlsplit

    where = urlsplit(server.url)
    before = server.log.read_text(errors="replace").count("Traceback")
    for _ in range(3):
        with socket.create_connection((where.hostname, where.port), timeout=10) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 1000\r\n\r\n{\"model\": \"x\",")
    time.sleep(1.5)
    assert server.log.read_text(errors="replace").count("Traceback") == before
    honest_api()


def test_a_body_of_many_megabytes_is_refused_before_it_is_read_whole(server, honest_api):
    huge = b'{"model": "embedded", "prompt": "' + b"a" * (64 * 2 ** 20) + b'"}'
    rss = server.ps.memory_info().rss
    _one_refusal(_post(server, huge), 413)
    assert server.ps.memory_info().rss - rss < 48 * 2 ** 20
    honest_api()


# ---------------------------------------------------------------------------------------------- floods
def test_five_hundred_streams_at_once_from_one_client_are_capped_and_the_server_stays_responsive(server, honest_api):
    body = _body(stream=True, max_tokens=24, steering=STEERING)

    async def flood() -> list:
        limits = httpx.Limits(max_connections=500, max_keepalive_connections=0)
        async with httpx.AsyncClient(timeout=300, limits=limits) as http:
            async def one(i: int):
                async with http.stream("POST", server.url + "v1/completions", json={**body, "seed": i}) as answer:
                    raw = await answer.aread()
                    return answer.status_code, dict(answer.headers), raw

            return await asyncio.gather(*(one(i) for i in range(500)))

    started = time.monotonic()
    outcomes = asyncio.run(flood())
    served = [raw for status, _, raw in outcomes if status == 200]
    refused = [(status, headers, raw) for status, headers, raw in outcomes if status != 200]
    assert 1 <= len(served) <= 16, len(served)  # the per-address cap (8) and the batch's queue bound the rest
    for raw in served:
        assert raw.rstrip().endswith(b"data: [DONE]")
    for status, headers, raw in refused:
        assert status == 429 and int(headers["retry-after"]) >= 1, (status, raw[:200])
        error = json.loads(raw)["error"]
        assert set(error) == {"message", "type", "param", "code"} and "\n" not in error["message"]
    assert time.monotonic() - started < 240
    deadline = time.monotonic() + 30
    while _rows(server)["running"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _rows(server)["running"] == 0 and _rows(server)["rows"] == 0
    honest_api()


@pytest.mark.parametrize("logprobs, compare, rows", [(None, False, 1), (1, False, 2), (1, True, 3)])
def test_a_client_that_leaves_mid_stream_frees_its_rows_at_the_next_step(server, honest_api, logprobs, compare, rows):
    sdk = _sdk(server)
    stream = sdk.completions.create(model="embedded", prompt=PROMPT, max_tokens=200, temperature=0, stream=True,
                                    logprobs=logprobs, extra_body={"steering": STEERING, "compare": compare})
    for n, _chunk in enumerate(stream):
        if n == 2:
            break
    load = _rows(server)
    assert (load["running"], load["rows"]) == (1, rows), load  # only the rows the answer shows
    stream.close()
    deadline = time.monotonic() + 10
    while _rows(server)["rows"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _rows(server)["running"] == 0 and _rows(server)["rows"] == 0
    honest_api()


def test_one_owner_s_streams_from_many_addresses_are_capped_as_one_owner(server, honest_api):
    """An owner token is one stranger wherever it calls from: 24 streams from 24 loopback addresses, one owner."""
    token = client(server).predict(api_name="/whoami")
    body = _body(stream=True, max_tokens=24, steering=STEERING)

    def one(i: int):
        transport = httpx.HTTPTransport(local_address=f"127.0.0.{i + 2}")
        with httpx.Client(transport=transport, timeout=300) as http, \
                http.stream("POST", server.url + "v1/completions", json={**body, "seed": i},
                            headers={"X-Steer-Owner": token}) as answer:
            return answer.status_code, answer.read()

    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(24) as pool:
        outcomes = list(pool.map(one, range(24)))
    served = [raw for status, raw in outcomes if status == 200]
    assert 1 <= len(served) <= 8, len(served)
    for status, raw in outcomes:
        if status != 200:
            assert status == 429 and "one owner" in json.loads(raw)["error"]["message"], (status, raw[:200])
    honest_api()
