"""Explore's Chat over HTTP (gradio_client), as a stranger may call it with any arguments (issue #48): a turn and
Save result work by name; bad values get one plain line naming the field; another session's conversation is
untouched (tiny model, a chat template given as --chat-template would give it, a library for saved results)."""
from __future__ import annotations

import pytest

gradio_client = pytest.importorskip("gradio_client")
from gradio_client import Client  # noqa: E402

from app_process import served  # noqa: E402
from steer_ui.service import RANDOM  # noqa: E402

TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")
SAMPLING = (True, 0.8, 0, 1.0, 1.0, 6, 0, "")  # greedy, temperature, top-k, top-p, repetition, max tokens, seed, limit


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    from steer_ui.policy import Policy
    from steer_ui.service import Service
    from steer_ui.store import open_library
    from steer_ui.tiny import tiny_handle

    folder = tmp_path_factory.mktemp("chat_api")
    policy = Policy()
    backend = Service(handle=tiny_handle("llama"), workdir=folder, policy=policy, chat_template=TEMPLATE,
                      library=open_library(str(folder / "library.db"), policy))
    with served(backend) as url:
        yield url, backend


def _turn(c: Client, message, system="", steer_prompt=False, vector=RANDOM, layer=1, alpha=0.5):
    return c.predict(message, system, steer_prompt, vector, layer, alpha, True, 0, *SAMPLING, api_name="/chat_turn")


def _texts(messages) -> list[str]:
    """A Chatbot's messages as their texts (gradio 6 sends each content as a list of text parts)."""
    out = []
    for m in messages:
        content = m["content"]
        out.append(content if isinstance(content, str) else "".join(p.get("text", "") for p in content))
    return out


def _refused(call, *words) -> str:
    with pytest.raises(Exception) as err:
        call()
    message = str(err.value)
    assert "\n" not in message.strip() and "Traceback" not in message, message
    for word in words:
        assert word in message, (word, message)
    return message


def test_a_turn_and_save_by_name_and_bad_values_in_one_line(app):
    url, backend = app
    owner, other = Client(url, verbose=False), Client(url, verbose=False)
    owner.predict(api_name="/whoami")  # an owner, so what this session saves is kept
    unsteered, steered, *_ = _turn(owner, "Hello")
    assert [m["role"] for m in unsteered] == [m["role"] for m in steered] == ["user", "assistant"]
    assert _texts(unsteered)[0] == _texts(steered)[0] == "Hello"
    _turn(other, "Someone else")
    saved = owner.predict(api_name="/chat_save")
    link = saved[1]["value"] if isinstance(saved[1], dict) else saved[1]
    result = backend.result(link.split("?result=")[1], None)
    assert result["kind"] == "chat" and [t["user"] for t in result["chat"]["turns"]] == ["Hello"]
    _refused(lambda: _turn(owner, "x", steer_prompt="yes"), "true or false")
    _refused(lambda: _turn(owner, "x", alpha="nan"), "finite")
    _refused(lambda: _turn(owner, "x", layer=6.7), "Layer", "whole number")
    _refused(lambda: _turn(owner, "x" * 40_000), "characters")
    _refused(lambda: _turn(owner, "x", system="a new system message"), "system message")
    _refused(lambda: _turn(owner, "🙂" * 3000), "tokens")
    # the refusals changed nothing: each session's next turn continues exactly its own one turn
    for c, first in ((owner, "Hello"), (other, "Someone else")):
        unsteered, steered, *_ = _turn(c, "Again")
        assert _texts(steered)[0::2] == [first, "Again"] == _texts(unsteered)[0::2]
