"""The OpenAI-compatible front (issue #49), driven by the real ``openai`` SDK against the running app (tiny model).

Each steered answer is checked against the app's own steered generation through the door (same prompt, spec and
sampling), token for token; a bad steering must be a 4xx in OpenAI's error shape, never an unsteered answer.
"""
from __future__ import annotations

import json
import threading

import httpx
import pytest

from app_process import free_port

openai = pytest.importorskip("openai", reason="the openai SDK is in requirements-dev.txt")

KEY = "test-key-1234"
SESSION = "api-test-session-0001"
# a chat template made here (the tiny model's tokenizer has none), in the shape of Llama 3's
TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    from steer_ui.openai_api.server import install
    from steer_ui.service import Service
    from steer_ui.tiny import tiny_handle
    from steer_ui.ui.app import build_demo, launch_kwargs

    backend = Service(handle=tiny_handle("llama"), workdir=tmp_path_factory.mktemp("api"), chat_template=TEMPLATE)
    demo = build_demo(backend)
    demo.queue()
    port = free_port()
    demo.launch(**launch_kwargs(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True))
    install(demo.app, backend, api_keys=[KEY])
    yield backend, f"http://127.0.0.1:{port}"
    demo.close()


@pytest.fixture(scope="module")
def client(app):
    return openai.OpenAI(base_url=app[1] + "/v1", api_key=KEY, max_retries=0, timeout=120)


def spec(seed: int = 3, scale: float = 6.0, layer: int = 2) -> dict:
    return {"vectors": [{"source": "random", "seed": seed, "scale": scale, "layers": [layer], "normalize": False}]}


def door_generation(backend, prompt: str, steering: dict, max_tokens: int, seed: int = 0, temperature: float = 0.0):
    sampling = backend.sampling(max_new_tokens=max_tokens, temperature=temperature, seed=seed,
                                greedy=temperature == 0)
    return list(backend.stream_generate_for(SESSION, prompt, steering, sampling))[-1]


def test_models_lists_the_served_model(client, app):
    assert [m.id for m in client.models.list().data] == [app[0].handle.model_id]


def test_a_steered_completion_is_the_app_s_own_steered_generation(client, app):
    backend = app[0]
    prompt = "The capital of France is"
    answer = client.completions.create(model="tiny", prompt=prompt, max_tokens=10, temperature=0, logprobs=2,
                                       extra_body={"steering": spec()})
    own = door_generation(backend, prompt, spec(), 10)
    choice = answer.choices[0]
    assert choice.text == own.steered_text and choice.text != own.unsteered_text  # it steered
    assert choice.logprobs.tokens == [t.token for t in own.steered_tokens]
    assert choice.logprobs.token_logprobs == pytest.approx([t.logprob for t in own.steered_tokens], abs=1e-5)
    # each token's Δlogit: steered minus unsteered logit on the same prefix, as the page shows it
    assert choice.model_extra["side"] == "steered"
    assert choice.logprobs.model_extra["delta_logit"] == pytest.approx([t.delta_logit for t in own.steered_tokens],
                                                                       abs=1e-4)
    assert answer.usage.prompt_tokens == own.prompt_tokens and answer.usage.completion_tokens == len(own.steered_tokens)
    echoed = answer.model_extra["steering"]["vectors"][0]
    assert echoed["source"] == "random" and echoed["hooks"][0]["layer"] == 2
    assert echoed["hooks"][0]["raw_alpha"] == pytest.approx(6.0) and echoed["hooks"][0]["relative_alpha"] > 0


def test_streamed_chunks_add_up_to_the_whole_answer(client):
    kwargs = dict(model="tiny", prompt="Once upon a time", max_tokens=12, temperature=0,
                  extra_body={"steering": spec(seed=5)})
    whole = client.completions.create(**kwargs).choices[0].text
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole
    assert chunks[-1].usage.completion_tokens > 0 and chunks[-2].choices[0].finish_reason in ("length", "stop")


def test_a_chat_goes_through_the_template_and_compare_adds_the_unsteered_side(client, app):
    backend = app[0]
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
    prompt = backend.chat_prompt(messages)
    ids = backend.handle.tokenizer(prompt).input_ids
    made = backend.handle.tokenizer.apply_chat_template(messages, chat_template=TEMPLATE, tokenize=True,
                                                        add_generation_prompt=True)
    assert ids == list(made.input_ids if hasattr(made, "input_ids") else made)  # the tokenizer's own rendering
    answer = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8, temperature=0,
                                            logprobs=True, top_logprobs=3,
                                            extra_body={"steering": spec(seed=7), "compare": True})
    own = door_generation(backend, prompt, spec(seed=7), 8)
    steered, unsteered = answer.choices
    assert steered.message.content == own.steered_text and unsteered.message.content == own.unsteered_text
    assert (steered.model_extra["side"], unsteered.model_extra["side"]) == ("steered", "unsteered")
    assert len(steered.logprobs.content[0].top_logprobs) == 3
    assert steered.logprobs.content[0].model_extra["delta_logit"] == pytest.approx(own.steered_tokens[0].delta_logit,
                                                                                   abs=1e-4)
    assert unsteered.logprobs.content[0].model_extra["delta_logit"] is None


def test_the_spec_as_a_json_string_in_vllm_xargs_steers_the_same(client):
    kwargs = dict(model="tiny", prompt="I think that", max_tokens=8, temperature=0)
    direct = client.completions.create(extra_body={"steering": spec(seed=9)}, **kwargs).choices[0].text
    xargs = client.completions.create(extra_body={"vllm_xargs": {"steering": json.dumps(spec(seed=9))}},
                                      **kwargs).choices[0].text
    aliases = {"vectors": [{"source": "random", "seed": 9, "alpha": 6.0, "layer": 2, "normalize": False}]}
    aliased = client.completions.create(extra_body={"steering": aliases}, **kwargs).choices[0].text
    assert direct == xargs == aliased


@pytest.mark.parametrize("steering, error, code", [
    ({"vectors": [{"source": "no such vector", "scale": 1}]}, "NotFoundError", "unknown_vector"),
    ({"vectors": [{"source": "/etc/passwd", "scale": 1}]}, "NotFoundError", "unknown_vector"),
    ({"vectors": [{"source": "random", "scale": "big"}]}, "BadRequestError", "number_not_a_number"),
    ({"vectors": [{"source": "random", "scale": 1, "layers": [99]}]}, "BadRequestError", "bad_layer"),
    ({"vectors": []}, "BadRequestError", "steering_shape"),
    ("not an object", "BadRequestError", "steering_not_json"),
])
def test_a_bad_steering_is_a_4xx_in_openai_s_shape_never_an_unsteered_answer(client, steering, error, code):
    with pytest.raises(getattr(openai, error)) as caught:
        client.completions.create(model="tiny", prompt="Hi", max_tokens=4, extra_body={"steering": steering})
    assert caught.value.code == code and caught.value.body["message"]


def test_bad_requests_and_missing_keys_are_refused_in_one_line(app):
    url = app[1] + "/v1/completions"
    no_key = httpx.post(url, json={"model": "tiny", "prompt": "Hi"})
    assert no_key.status_code == 401 and no_key.json()["error"]["type"] == "authentication_error"
    auth = {"Authorization": f"Bearer {KEY}"}
    for body, param in [({"model": "tiny", "prompt": "Hi", "max_tokens": 10 ** 9}, "max_tokens"),
                        ({"model": "tiny", "prompt": "Hi", "temperature": float("nan")}, None),
                        ({"model": "tiny", "prompt": "Hi", "n": 99}, "n"),
                        ({"model": "tiny", "prompt": "Hi", "frequency_penalty": 1.0}, "frequency_penalty"),
                        ({"model": "tiny", "prompt": "Hi", "surprise": 1}, "surprise"),
                        ({"model": "tiny", "prompt": 12}, "prompt")]:
        answer = httpx.post(url, content=json.dumps(body, allow_nan=True), headers=auth)
        assert answer.status_code == 400, body
        error = answer.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and "\n" not in error["message"]
        if param:
            assert error["param"] == param
    chat = httpx.post(app[1] + "/v1/chat/completions", headers=auth,
                      json={"model": "tiny", "messages": [{"role": "wizard", "content": "x"}]})
    assert chat.status_code == 400 and chat.json()["error"]["code"] == "chat_message_role"


def test_eight_clients_with_eight_steerings_at_once_each_get_their_solo_answer(app):
    backend, url = app
    prompts = [f"Story number {i} begins" for i in range(8)]
    solo = [door_generation(backend, p, spec(seed=i, scale=4.0 + i), 10).steered_text for i, p in enumerate(prompts)]
    got: dict[int, str] = {}

    def ask(i: int) -> None:
        c = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=120)
        got[i] = c.completions.create(model="tiny", prompt=prompts[i], max_tokens=10, temperature=0,
                                      extra_body={"steering": spec(seed=i, scale=4.0 + i)}).choices[0].text

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert [got.get(i) for i in range(8)] == solo


def test_a_client_that_leaves_mid_stream_frees_its_rows(client, app):
    import time

    backend = app[0]
    stream = client.completions.create(model="tiny", prompt="A long tale:", max_tokens=200, temperature=0,
                                       stream=True, extra_body={"steering": spec()})
    for n, _chunk in enumerate(stream):
        if n == 2:
            break
    stream.close()
    deadline = time.monotonic() + 10
    while backend.engine_load()["running"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert backend.engine_load()["running"] == 0


def test_the_page_s_slider_answers_while_api_streams_run(client, app):
    """The API's generations join the decode batch; a slider move (the page's /next_token) pauses the batch at a
    block boundary and answers while the streams are still running."""
    from gradio_client import Client

    backend, url = app
    page = Client(url + "/", verbose=False)
    streams = [client.completions.create(model="tiny", prompt=f"Tale {i}:", max_tokens=200, temperature=0,
                                         stream=True, extra_body={"steering": spec(seed=i)}) for i in range(3)]
    firsts = [next(iter(s)) for s in streams]  # every stream has started
    assert all(f.choices for f in firsts) and backend.engine_load()["running"] == 3
    view = page.predict("The capital of France is", "random direction", 2, 0.5, True, 0, False,
                        api_name="/next_token")
    assert backend.engine_load()["running"] == 3  # answered while all three still decode
    assert view[3] and "KL" in str(view[3])
    for s in streams:
        s.close()


def test_with_auth_a_password_of_the_page_is_a_key_of_the_api(app):
    """``--auth user:password`` guards /v1 too: ``Bearer user:password`` passes, anything else is a 401."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from steer_ui.openai_api.server import router

    api = FastAPI()
    api.include_router(router(app[0], api_keys=(), passwords=[("ann", "s3cret")]))
    client_ = TestClient(api)
    assert client_.get("/v1/models", headers={"Authorization": "Bearer ann:s3cret"}).status_code == 200
    for header in ({}, {"Authorization": "Bearer ann:wrong"}, {"Authorization": "Basic YW5uOnMzY3JldA=="}):
        answer = client_.get("/v1/models", headers=header)
        assert answer.status_code == 401 and answer.json()["error"]["code"] == "invalid_api_key"


def test_two_vectors_streamed_over_chat_are_the_page_s_two_vector_generation(client, app):
    """docs/api.md's two-vector example, on this model: the stream adds up to the door's generation for the same
    spec of two terms (the page's and the CLI's), tokens and log-probabilities, and it is neither term's alone."""
    backend = app[0]
    two = {"vectors": [spec(seed=3, scale=1.0, layer=1)["vectors"][0], spec(seed=8, scale=1.5, layer=2)["vectors"][0]]}
    messages = [{"role": "user", "content": "Describe Monday."}]
    stream = client.chat.completions.create(model="tiny", messages=messages, max_tokens=10, temperature=0,
                                            logprobs=True, stream=True, extra_body={"steering": two})
    text, logprobs = "", []
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            logprobs += [t.logprob for t in (chunk.choices[0].logprobs.content if chunk.choices[0].logprobs else [])]
    prompt = backend.chat_prompt(messages)
    own = door_generation(backend, prompt, two, 10)
    assert text == own.steered_text
    assert logprobs == pytest.approx([t.logprob for t in own.steered_tokens], abs=1e-4)
    for alone in two["vectors"]:  # each term alone gives other numbers (a random model's tokens may not differ)
        other = door_generation(backend, prompt, {"vectors": [alone]}, 10).steered_tokens
        assert max(abs(a.logprob - b.logprob) for a, b in zip(other, own.steered_tokens)) > 1e-3


def test_while_the_model_loads_a_request_is_told_so_with_retry_after_not_that_its_vector_is_unknown(tmp_path):
    """Without --wait the app serves while the model and its bundled vectors load: a request naming the default
    vector then is a 503 to retry, not a 404 for a vector that is about to exist."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from steer_ui.openai_api.server import router
    from steer_ui.service import Service

    api = FastAPI()
    api.include_router(router(Service(workdir=tmp_path)))  # no model yet
    body = {"model": "embedded", "prompt": "Hi", "steering": {"vectors": [
        {"source": "positive sentiment (default)", "scale": 0.1}]}}
    for answer in (TestClient(api).post("/v1/completions", json=body), TestClient(api).get("/v1/models")):
        assert answer.status_code == 503 and answer.headers["retry-after"] == "1"
        assert answer.json()["error"]["code"] == "model_loading"
