"""A session's places in the decode batch (policy.generations_per_session): an API or CLI caller over the cap is
refused; the page's Explore generations supersede — the newest cancels every older one, which leaves the batch
and ends without a final frame (a third setting while two generations ran left the panel stale: issue #48's
browser runs found it; an older generation that ended after the newest overwrote its panels: the Chromium test
of the Δlogit limit found it)."""
from __future__ import annotations

import dataclasses
import threading

import pytest

from steer_ui.messages import UserError
from steer_ui.policy import Policy
from steer_ui.service import Service
from steer_ui.tiny import tiny_handle


CAP = Policy().generations_per_session  # the service below runs with the default policy


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    return Service(handle=tiny_handle("llama"), workdir=tmp_path_factory.mktemp("slots"))


def _started(service, session, supersede, alpha=0.1):
    """A long generation, decoding: its first frame has come, so its ticket is in the batch."""
    sampling = dataclasses.replace(service.sampling(max_new_tokens=200), stop_at_eos=False)
    frames = service.stream_generate(session, "Hello there", None, 1, alpha, True, 0, sampling, supersede=supersede)
    next(frames)
    return frames


def test_an_api_caller_over_its_cap_is_refused_and_its_generations_go_on(service):
    running = [_started(service, "api-slots", False) for _ in range(CAP)]
    with pytest.raises(UserError) as info:
        _started(service, "api-slots", False)
    assert info.value.key == "session_busy"
    for frames in running:  # both still decode to their end
        assert frames.__next__() is not None
        last = [f for f in frames][-1]
        assert last.done and len(last.steered_tokens) == 200


def test_the_page_s_newest_generation_cancels_every_older_one(service):
    oldest = _started(service, "page-slots", True, 0.1)
    middle = _started(service, "page-slots", True, 0.2)  # below the cap: the oldest is cancelled all the same
    newest = _started(service, "page-slots", True, 0.3)
    for older in (oldest, middle):  # each ends within a step or two, without a final frame
        rest = list(older)
        assert not any(f.done for f in rest) and len(rest) < 150
    final = [f for f in newest][-1]
    assert final.done and len(final.steered_tokens) == 200
    settings = service.peek_session("page-slots").last_generation["settings"]
    assert settings["alpha"] == 0.3  # Save result keeps the newest, never the superseded one


def test_a_generation_submitted_after_a_newer_one_started_is_cancelled_at_once(service):
    """Two page events at once: the older one's ticket, handed over only after the newer one took its place, is
    cancelled then (without it, it decoded to the end beside the newest and could end last)."""
    from steer_ui.model.generation import Request

    engine = service.models.engine()
    sampling = dataclasses.replace(service.sampling(max_new_tokens=200), stop_at_eos=False)
    session = service.session("page-race")
    slots = service.sessions
    with slots.generation_slot(session, supersede=True, supersedable=True) as hold_older:
        with slots.generation_slot(session, supersede=True, supersedable=True) as hold_newer:
            older = engine.submit(Request.make(engine.handle, "Hello there", [], sampling))
            hold_older(older)
            newer = engine.submit(Request.make(engine.handle, "Hello there", [], sampling))
            hold_newer(newer)
            assert older.superseded and not newer.superseded
            assert session.superseding == [newer]
            newer.cancel()


def test_a_flood_from_one_page_stays_within_twice_the_cap(service):
    started = [_started(service, "flood-slots", True, 0.1 * (i + 1)) for i in range(2 * CAP)]
    # the first ones are cancelled but not unwound (nobody read their generators): they still count
    with pytest.raises(UserError) as info:
        _started(service, "flood-slots", True, 0.9)
    assert info.value.key == "session_busy"
    for frames in started:
        frames.close()
    assert service.peek_session("flood-slots").generating == 0



def test_the_page_s_newest_waits_for_the_cancelled_to_unwind(service):
    """A page's quick settings under load: the generations it cancelled still count until their readers see them
    end, so at twice the cap the newest waits for that (policy.page_wait_s) instead of being refused, which left
    the panel stale under the controls (a Chromium run at load average 20 found it)."""
    started = [_started(service, "unwind-slots", True, 0.1 * (i + 1)) for i in range(2 * CAP)]
    reader = threading.Thread(target=lambda: [list(frames) for frames in started])  # the page's own threads
    reader.start()
    newest = _started(service, "unwind-slots", True, 0.9)
    last = [f for f in newest][-1]
    reader.join(timeout=60)
    assert last.done and len(last.steered_tokens) == 200
    assert service.peek_session("unwind-slots").last_generation["settings"]["alpha"] == 0.9
    assert service.peek_session("unwind-slots").generating == 0

TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")
STEERING = {"vectors": [{"source": "random", "scale": 8.0, "layers": [1], "seed": 3}]}


@pytest.fixture(scope="module")
def chatting(tmp_path_factory):
    handle = tiny_handle("llama")  # its own: the tokenizer gets a chat template
    handle.tokenizer.chat_template = TEMPLATE
    return Service(handle=handle, workdir=tmp_path_factory.mktemp("chat-slots"))


def _turn(service, session):
    frames = service.chat_turn(session, "Hello", STEERING, sampling=service.sampling(max_new_tokens=4, greedy=True))
    return list(frames)[-1]


def test_a_chat_turn_takes_the_place_of_the_page_s_explore_generations(chatting):
    """Chat hides Explore's panels: a turn sent while the page's two Explore generations decode is answered (the
    Chromium chat test's turn after an added row's α was refused as the session's third generation)."""
    explore = [_started(chatting, "chat-over-explore", True, 0.1 * (i + 1)) for i in range(CAP)]
    reader = threading.Thread(target=lambda: [list(frames) for frames in explore])  # the page's own threads
    reader.start()
    last = _turn(chatting, "chat-over-explore")
    reader.join(timeout=60)
    assert last["done"] and last["unsteered"] and last["steered"]
    assert len(chatting.peek_session("chat-over-explore").chat["turns"]) == 1
    assert chatting.peek_session("chat-over-explore").generating == 0


def test_an_explore_generation_never_cancels_a_chat_turn(chatting):
    sampling = dataclasses.replace(chatting.sampling(max_new_tokens=60, greedy=True), stop_at_eos=False)
    alone = list(chatting.chat_turn("turn-alone", "Hello", STEERING, sampling=sampling))[-1]
    turn = chatting.chat_turn("turn-kept", "Hello", STEERING, sampling=sampling)
    next(turn)  # its one generation decodes (the first turn: both sides from one request)
    first = _started(chatting, "turn-kept", True, 0.2)  # the page's Explore: a place is free
    second = _started(chatting, "turn-kept", True, 0.3)  # at the cap: it takes the Explore one's place
    assert not any(f.done for f in first)
    last = list(turn)[-1]
    assert (last["unsteered"], last["steered"]) == (alone["unsteered"], alone["steered"])  # whole, not cut
    assert [f for f in second][-1].done


def test_a_chat_turn_waits_for_a_place_an_api_caller_gives_back(chatting):
    """An API caller's generations are not the page's: a turn at the cap waits (policy.page_wait_s) for one to
    end rather than cancelling it, and is refused only when none ends in time."""
    session = "turn-waits"
    running = [_started(chatting, session, False, 0.1 * (i + 1)) for i in range(CAP)]
    reader = threading.Thread(target=lambda: [list(frames) for frames in running])
    reader.start()
    last = _turn(chatting, session)
    reader.join(timeout=60)
    assert last["done"]
    held = [_started(chatting, session, False, 0.1 * (i + 1)) for i in range(CAP)]  # nobody reads them
    with pytest.raises(UserError) as info:
        _turn(chatting, session)
    assert info.value.key == "session_busy"
    for frames in held:
        frames.close()
