"""Who gets a session, and what eviction may take: a flood of fresh ids never costs an honest visitor their work."""
from __future__ import annotations

import time

import pytest

from steer_ui.messages import UserError
from steer_ui.policy import Policy
from steer_ui.sessions import Sessions


def _with_work(sessions: Sessions, sid: str, client: str | None = None):
    s = sessions.get(sid, client)
    s.vectors["v"] = object.__new__(type("V", (), {"directions": {}, "extras": {}}))
    return s


def test_an_address_opens_its_burst_then_waits_while_other_addresses_are_untouched():
    sessions = Sessions(Policy(new_sessions_burst=5, new_sessions_per_minute=60, session_grace_seconds=0))
    for k in range(5):
        sessions.get(f"flood-{k:04d}", "10.0.0.9")
    with pytest.raises(UserError) as info:
        sessions.get("flood-0005", "10.0.0.9")
    assert info.value.key == "too_many_new_sessions" and "60" in str(info.value)
    sessions.get("honest-000", "10.0.0.1")  # another address has its own bucket
    sessions.get("flood-0000", "10.0.0.9")  # sessions already open are not affected
    time.sleep(1.1)  # one token a second comes back
    sessions.get("flood-0006", "10.0.0.9")


def test_one_address_never_holds_more_than_its_share_and_eviction_never_takes_work():
    policy = Policy(max_sessions=10, sessions_per_address=3, new_sessions_burst=100, session_grace_seconds=0)
    sessions = Sessions(policy)
    honest = _with_work(sessions, "honest-work", "10.0.0.1")
    for k in range(3):
        _with_work(sessions, f"flood-{k:04d}", "10.0.0.9")
    with pytest.raises(UserError) as info:
        sessions.get("flood-0003", "10.0.0.9")
    assert info.value.key == "address_sessions_full"
    assert sessions.get("honest-work", "10.0.0.1") is honest and "v" in honest.vectors
    # empty sessions of an address make room for its newcomers, silently
    sessions.get("empty-a", "10.0.0.2")
    sessions.get("empty-b", "10.0.0.2")
    sessions.get("empty-c", "10.0.0.2")
    sessions.get("empty-d", "10.0.0.2")
    assert sessions.peek("empty-a") is None and sessions.peek("empty-d") is not None
    assert sessions.get("empty-a", "10.0.0.2").vectors == {}  # its owner comes back to a new session, no error


def test_a_full_server_refuses_newcomers_rather_than_evict_anybody_s_work():
    sessions = Sessions(Policy(max_sessions=4, sessions_per_address=4, new_sessions_burst=100,
                               session_grace_seconds=0))
    kept = [_with_work(sessions, f"owner-{k:04d}", f"10.0.0.{k}") for k in range(4)]
    for k in range(20):
        with pytest.raises(UserError) as info:
            sessions.get(f"newcomer-{k:04d}", f"10.1.0.{k}")
        assert info.value.key == "sessions_full"
    assert all(sessions.get(f"owner-{k:04d}") is kept[k] for k in range(4))


def test_a_recently_used_empty_session_is_not_evicted_for_a_newcomer():
    sessions = Sessions(Policy(max_sessions=2, new_sessions_burst=100, session_grace_seconds=60))
    first = sessions.get("just-opened-1", "10.0.0.1")
    sessions.get("just-opened-2", "10.0.0.2")
    with pytest.raises(UserError):
        sessions.get("newcomer-0001", "10.0.0.3")
    assert sessions.peek("just-opened-1") is first


def test_work_is_forgotten_only_after_the_idle_lifetime_and_its_owner_is_told_once():
    sessions = Sessions(Policy(session_idle_seconds=3600))
    s = _with_work(sessions, "owner-idle")
    s.touched -= 3601
    with pytest.raises(UserError) as info:
        sessions.get("owner-idle")
    assert info.value.key == "session_expired" and "1 h" in str(info.value)
    assert sessions.get("owner-idle").vectors == {}  # told once; then a fresh session
    running = _with_work(sessions, "owner-running")
    running.running, running.touched = True, running.touched - 7200
    assert sessions.get("owner-running") is running  # a job under way is never idle


def test_a_refused_newcomer_costs_its_address_no_admission_token():
    sessions = Sessions(Policy(max_sessions=1, new_sessions_burst=2, new_sessions_per_minute=1,
                               session_grace_seconds=0))
    _with_work(sessions, "owner-0001", "10.0.0.1")
    for k in range(5):
        with pytest.raises(UserError) as info:
            sessions.get(f"newcomer-{k:04d}", "10.0.0.2")
        assert info.value.key == "sessions_full"


def test_a_second_wait_for_one_sessions_generation_and_waits_past_the_cap_are_answered_at_once():
    """Save result waits for its page's generation on one of the server's threads: one waiter per session, and
    ``generation_waiters`` over all, so a flood of saves cannot hold every thread (each would wait seconds)."""
    import threading

    sessions = Sessions(Policy(generation_waiters=2))
    pages = [sessions.get(f"{i:032x}") for i in range(3)]
    for page in pages:
        page.generating = 1  # a generation of each page still decodes
    release = threading.Event()
    waited = []
    threads = [threading.Thread(target=lambda p=p: waited.append(sessions.wait_for_generation(p, release.is_set, 5)))
               for p in pages[:2]]
    for t in threads:
        t.start()
    time.sleep(0.2)  # both wait now
    started = time.monotonic()
    assert sessions.wait_for_generation(pages[0], release.is_set, 5) is False  # the same page again
    assert sessions.wait_for_generation(pages[2], release.is_set, 5) is False  # a third page, past the cap
    assert time.monotonic() - started < 0.5
    assert sessions.wait_for_generation(pages[2], lambda: True, 5) is True  # nothing to wait for: answered
    with sessions._freed:
        release.set()
        sessions._freed.notify_all()
    for t in threads:
        t.join(5)
    assert waited == [True, True]
    assert sessions.wait_for_generation(pages[2], release.is_set, 5) is True  # the places are free again


def test_a_caller_that_cannot_show_the_expired_line_gets_the_new_session_and_the_line_waits():
    """A page's unqueued event could show "your session expired" only as a wordless pill (ui/request_guard.py):
    it gets the new session holding the line for the next call; where the new session is refused, the line stays
    for the next call too (a review: it was taken off before the refusal and never said)."""
    sessions = Sessions(Policy(session_idle_seconds=3600, max_sessions=2, session_grace_seconds=0))
    s = _with_work(sessions, "owner-idle-1")
    s.touched -= 3601
    _with_work(sessions, "owner-busy-1")
    _with_work(sessions, "owner-busy-2")  # the old one is forgotten: the server is full of sessions with work
    with pytest.raises(UserError) as full:
        sessions.get("owner-idle-1", say_expired=False)
    assert full.value.key == "sessions_full"
    with pytest.raises(UserError) as told:  # the line was kept
        sessions.get("owner-idle-1")
    assert told.value.key == "session_expired"

    roomy = Sessions(Policy(session_idle_seconds=3600))
    s = _with_work(roomy, "owner-idle-2")
    s.touched -= 3601
    new = roomy.get("owner-idle-2", say_expired=False)
    assert new is not s and new.vectors == {} and new.untold.key == "session_expired"
    assert roomy.get("owner-idle-2") is new  # said by whoever reads ``untold``, not raised again here
