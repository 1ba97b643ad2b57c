"""The Explore chat (issue #48): the app renders a conversation as the tokenizer's own template does, and each
side (unsteered, steered) keeps its own history, on a tiny random model."""
from __future__ import annotations

import pytest

from steer_ui.messages import UserError
from steer_ui.rooms import chat as chat_room
from steer_ui.service import Service
from steer_ui.tiny import tiny_handle

# A template made here (ChatML-like turns with a BOS), given to the tokenizer itself
TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")
STEERING = {"vectors": [{"source": "random", "scale": 8.0, "layers": [1], "seed": 3}]}
SAMPLING = dict(max_new_tokens=6)


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    handle = tiny_handle("llama")  # its own: the tokenizer gets a template
    handle.tokenizer.chat_template = TEMPLATE
    return Service(handle=handle, workdir=tmp_path_factory.mktemp("chat"))


def test_a_chat_rendered_by_the_app_is_the_tokenizers_own(service):
    tok = service.handle.tokenizer
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"},
                {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "And now?"}]
    theirs = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ours = service.chat_prompt(messages)
    assert service.chat_template()["source"] == "tokenizer"
    assert "<s>" + ours == theirs  # BOS is left to the tokenizer, which adds it when the prompt is encoded
    assert tok(ours).input_ids == tok(theirs, add_special_tokens=False).input_ids
    assert service.chat._markers(ours) == (1, 2)  # BOS and the turns' end: either ends an assistant's turn
    # the room's own messages: system, the earlier turn with this side's reply, the new message
    conv = {"system": "Be brief.", "turns": [{"user": "Hi there", "unsteered": "Hello.", "steered": "Yo."}]}
    assert chat_room.Chat.messages(conv, "unsteered", "And now?") == messages


def _sampling(service):
    return service.sampling(max_new_tokens=SAMPLING["max_new_tokens"], greedy=True)


def _turn(service, sid, message, **kwargs):
    frames = list(service.chat_turn(sid, message, STEERING, sampling=_sampling(service), **kwargs))
    assert frames[-1]["done"]
    return frames[-1]


def test_each_side_keeps_its_own_history(service):
    sid = "chat-histories"
    service.chat_reset(sid)
    first = _turn(service, sid, "Hello", system="You are terse.")
    assert first["prompts"]["unsteered"] == first["prompts"]["steered"]  # one history so far
    assert first["unsteered"] != first["steered"], "α = 8 on a tiny model should change the reply"
    second = _turn(service, sid, "More")
    # the steered side's second prompt holds its own first reply, not the unsteered one (and the other way round)
    assert second["prompts"]["steered"] == service.chat_prompt([
        {"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": first["steered"]}, {"role": "user", "content": "More"}])
    assert second["prompts"]["unsteered"] == service.chat_prompt([
        {"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": first["unsteered"]}, {"role": "user", "content": "More"}])
    view = service.chat_view(sid)
    assert [t["user"] for t in view["turns"]] == ["Hello", "More"]
    assert view["turns"][0]["steered"] == first["steered"] and view["turns"][1]["unsteered"] == second["unsteered"]
    assert view["turns"][0]["steering"]["vectors"][0]["apply"] == {"positions": "last"}  # generated tokens only
    assert service.chat_view("someone else") == {"system": "", "turns": []}  # other sessions see nothing
    assert service.chat_reset(sid) == {"system": "", "turns": []} and service.chat_view(sid)["turns"] == []


def test_bad_chat_input_is_one_line_and_leaves_the_conversation(service):
    sid = "chat-bad"
    service.chat_reset(sid)
    _turn(service, sid, "Hi", system="S")
    before = service.chat_view(sid)
    for message, kwargs, key in (("", {}, "text_empty"), ("  ", {}, "text_empty"), (None, {}, "not_text"),
                                 ("x", {"system": "other"}, "chat_system_fixed"),
                                 ("x", {"steer_prompt": "yes"}, "not_a_flag")):
        with pytest.raises(UserError) as err:
            list(service.chat_turn(sid, message, STEERING, sampling=_sampling(service), **kwargs))
        assert "\n" not in str(err.value)
        if key != "not_text":
            assert err.value.key == key
    with pytest.raises(UserError):
        list(service.chat_turn(sid, "x", {"vectors": []}, sampling=_sampling(service)))
    assert service.chat_view(sid) == before
    with pytest.raises(UserError) as err:
        service.chat_save("nobody chatted here")
    assert err.value.key == "no_chat"


def test_turns_are_bounded(service, monkeypatch):
    monkeypatch.setattr(chat_room, "MAX_TURNS", 2)
    sid = "chat-bounded"
    service.chat_reset(sid)
    _turn(service, sid, "one")
    _turn(service, sid, "two")
    with pytest.raises(UserError) as err:
        list(service.chat_turn(sid, "three", STEERING, sampling=_sampling(service)))
    assert err.value.key == "chat_turns"
    assert len(service.chat_view(sid)["turns"]) == 2


def test_a_saved_conversation_runs_live_for_a_stranger_who_goes_on_chatting(tmp_path):
    """Run live on a saved conversation (issue #48): each saved user message asked again under its saved steering,
    both sides answering afresh from their own new histories (greedy: the saved replies again), in the stranger's
    own session, which then goes on."""
    from steer_ui.policy import Policy
    from steer_ui.store import open_library

    policy = Policy()
    handle = tiny_handle("llama")
    handle.tokenizer.chat_template = TEMPLATE
    service = Service(handle=handle, workdir=tmp_path, policy=policy,
                      library=open_library(str(tmp_path / "library.db"), policy))
    owner, stranger = "chat-owner-aaaaaaaaaaaa", "chat-stranger-aaaaaaaaa"
    service.claim_owner(owner, None)
    service.claim_owner(stranger, None)
    for text in ("Hello", "More", "And then?"):
        _turn(service, owner, text, system="You are terse." if text == "Hello" else None)
    saved = service.chat_view(owner)
    result_id = service.chat_save(owner)
    frames = list(service.chat_rerun(stranger, result_id, None, _sampling(service)))
    assert [f["turn"] for f in frames if f["done"]] == [0, 1, 2] and frames[-1]["done"]
    live = service.chat_view(stranger)
    assert live["system"] == "You are terse."
    assert [(t["user"], t["unsteered"], t["steered"]) for t in live["turns"]] == \
        [(t["user"], t["unsteered"], t["steered"]) for t in saved["turns"]]
    assert live["turns"][0]["unsteered"] != live["turns"][0]["steered"]
    fourth = _turn(service, stranger, "Last one")  # the stranger's conversation now, each side its own history
    assert saved["turns"][2]["steered"] in fourth["prompts"]["steered"]
    assert saved["turns"][2]["unsteered"] in fourth["prompts"]["unsteered"]
    assert len(service.chat_view(owner)["turns"]) == 3  # the owner's conversation is untouched
    with pytest.raises(UserError):
        list(service.chat_rerun(stranger, "not-a-result-id", None, _sampling(service)))
