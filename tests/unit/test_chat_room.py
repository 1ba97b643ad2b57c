"""The Explore chat (issue #48): the app renders a conversation as the tokenizer's own template does, and each
side (unsteered, steered) keeps its own history, on a tiny random model."""
from __future__ import annotations

import math

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


def _owner_and_stranger(tmp_path):
    """A service with a library (saved results need one) and two claimed sessions: (service, owner, stranger)."""
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
    return service, owner, stranger


def test_a_saved_conversation_runs_live_for_a_stranger_who_goes_on_chatting(tmp_path):
    """Run live on a saved conversation (issue #48): each saved user message asked again under its saved steering,
    both sides answering afresh from their own new histories (greedy: the saved replies again), in the stranger's
    own session, which then goes on."""
    service, owner, stranger = _owner_and_stranger(tmp_path)
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


def _spy_frames(service, monkeypatch) -> list:
    """Every frame the chat room's generations give, as they pass (the last one is the finished turn's)."""
    frames, real = [], service.explore.stream_generate_for

    def spy(*args, **kwargs):
        for frame in real(*args, **kwargs):
            frames.append(frame)
            yield frame

    monkeypatch.setattr(service.explore, "stream_generate_for", spy)
    return frames


@pytest.mark.parametrize("steer_prompt", [False, True])
def test_a_chat_turn_steers_with_every_term_of_the_page(service, monkeypatch, steer_prompt):
    """A chat turn steers with the whole spec the page shows (issue #48): the main row and an added row, each with
    its own layer, α, units and seed, exactly as the spec steers a generation given directly (same greedy tokens,
    probabilities within 1e-5), and not as the main row alone."""
    from steer_ui.service import RANDOM
    from steer_ui.ui import chat_panel, extra_terms

    extra = extra_terms.compose(1, [(RANDOM, 0, -6.0, True, 5)])  # the added row, as the page writes it
    page = chat_panel.turn_spec(RANDOM, 1, 8.0, True, 3, extra, steer_prompt)
    apply = {"phases": ["prompt", "generation"]} if steer_prompt else {"positions": "last"}
    direct = {"vectors": [{"source": "random", "scale": 8.0, "layers": [1], "seed": 3, "apply": apply},
                          {"source": "random", "scale": -6.0, "layers": [0], "seed": 5, "apply": apply}]}
    main_only = {"vectors": direct["vectors"][:1]}
    prompt = service.chat_prompt([{"role": "user", "content": "Hello"}])
    sampling = service.chat._sampling(_sampling(service), prompt)  # the chat's own stops (its turn markers)

    def steered(steering):
        frames = _spy_frames(service, monkeypatch)
        service.chat_reset("chat-terms")
        reply = list(service.chat_turn("chat-terms", "Hello", steering, steer_prompt=steer_prompt,
                                       sampling=_sampling(service)))[-1]
        monkeypatch.undo()
        return reply, frames[-1]

    chat, chat_frame = steered(page)
    alone = list(service.stream_generate_for("chat-direct", prompt, direct, sampling))[-1]
    assert chat["steered"] == alone.steered_text and chat["unsteered"] == alone.unsteered_text
    assert [t.token for t in chat_frame.steered_tokens] == [t.token for t in alone.steered_tokens]
    assert chat_frame.steered_tokens and all(
        abs(math.exp(a.logprob) - math.exp(b.logprob)) < 1e-5
        for a, b in zip(chat_frame.steered_tokens, alone.steered_tokens))
    kept = service.chat_view("chat-terms")["turns"][0]
    assert [(t["source"], t["layers"], t["scale"], t.get("seed"), t["apply"]) for t in kept["steering"]["vectors"]] \
        == [("random", [1], 8.0, 3, apply), ("random", [0], -6.0, 5, apply)]
    assert kept["steer_prompt"] is steer_prompt
    one, one_frame = steered(main_only)
    assert [round(t.logprob, 4) for t in one_frame.steered_tokens] != \
        [round(t.logprob, 4) for t in chat_frame.steered_tokens], "the added row must change the steered side"


def test_a_saved_conversation_keeps_every_terms_own_vector_for_a_stranger(tmp_path):
    """A conversation steered by the owner's own vector and an added row's own vector: its Run live, for a stranger
    who has neither, asks each turn again under both (kept with the result, as the main one is), so the stranger's
    replies are the owner's (greedy)."""
    import dataclasses

    from steer_ui.vector import random_vector

    service, owner, stranger = _owner_and_stranger(tmp_path)
    hidden = service.handle.arch.hidden_size
    main = service.add_vector(owner, dataclasses.replace(random_vector(hidden, 1, seed=41), name="mine"))
    other = service.add_vector(owner, dataclasses.replace(random_vector(hidden, 0, seed=42), name="other"))
    steering = {"vectors": [{"source": main, "scale": 6.0, "layers": [1]},
                            {"source": other, "scale": -6.0, "layers": [0]}]}
    service.chat_reset(owner)
    for text in ("Hello", "More"):
        list(service.chat_turn(owner, text, steering, sampling=_sampling(service)))
    saved = service.chat_view(owner)
    result_id = service.chat_save(owner)
    assert other not in service.vector_names(stranger)
    list(service.chat_rerun(stranger, result_id, None, _sampling(service)))
    live = service.chat_view(stranger)
    assert [(t["unsteered"], t["steered"]) for t in live["turns"]] == \
        [(t["unsteered"], t["steered"]) for t in saved["turns"]]
    first, second = (t["source"] for t in live["turns"][0]["steering"]["vectors"])
    assert first.endswith(" (saved result)") and second == f"{other} (saved result)"


def test_a_conversation_over_the_prompt_bound_says_how_many_turns_to_drop(tmp_path):
    """History counts in tokens against the prompt's bound (issue #48): a conversation over it is refused with
    how many of its earliest messages to drop, a number that does fit, and the system message kept."""
    from steer_ui.policy import Policy

    handle = tiny_handle("llama")
    handle.tokenizer.chat_template = TEMPLATE
    service = Service(handle=handle, workdir=tmp_path, policy=Policy(max_prompt_tokens=200))
    messages = [{"role": "system", "content": "Be brief."}]
    for i in range(6):
        messages += [{"role": "user", "content": f"Question {i} " + "word " * 6},
                     {"role": "assistant", "content": f"Answer {i} " + "word " * 6}]
    messages.append({"role": "user", "content": "And now?"})
    with pytest.raises(UserError) as info:
        service.chat_prompt(messages)
    assert info.value.key == "chat_too_long"
    drop, tokens = info.value.params["drop"], info.value.params["tokens"]
    assert tokens > 200 and 1 <= drop < len(messages) - 1
    kept = messages[:1] + messages[1 + drop:]
    assert len(handle.tokenizer(service.chat_prompt(kept)).input_ids) <= 200  # dropping that many fits
    with pytest.raises(UserError):  # one fewer does not
        service.chat_prompt(messages[:1] + messages[drop:])
    with pytest.raises(UserError) as info:  # one message alone over the bound: no turn to drop helps
        service.chat_prompt([{"role": "user", "content": "word " * 400}])
    assert info.value.key == "too_many_tokens"
