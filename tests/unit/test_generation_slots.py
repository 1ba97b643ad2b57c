"""A session's places in the decode batch (policy.generations_per_session): an API or CLI caller over the cap is
refused; the page's Explore generations supersede — the newest takes the oldest's place, which leaves the batch
and ends without a final frame (a third setting while two generations ran left the panel stale: issue #48's
browser runs found it)."""
from __future__ import annotations

import dataclasses

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


def test_the_page_s_newest_generation_takes_the_oldest_s_place(service):
    oldest, middle = _started(service, "page-slots", True, 0.1), _started(service, "page-slots", True, 0.2)
    newest = _started(service, "page-slots", True, 0.3)  # at the cap: not refused
    rest = list(oldest)  # the oldest was cancelled: it ends within a step or two, without a final frame
    assert not any(f.done for f in rest) and len(rest) < 150
    finals = [[f for f in frames][-1] for frames in (middle, newest)]
    assert all(f.done and len(f.steered_tokens) == 200 for f in finals)
    settings = service.peek_session("page-slots").last_generation["settings"]
    assert settings["alpha"] == 0.3  # Save result keeps the newest, never the superseded one


def test_a_flood_from_one_page_stays_within_twice_the_cap(service):
    started = [_started(service, "flood-slots", True, 0.1 * (i + 1)) for i in range(2 * CAP)]
    # the first ones are cancelled but not unwound (nobody read their generators): they still count
    with pytest.raises(UserError) as info:
        _started(service, "flood-slots", True, 0.9)
    assert info.value.key == "session_busy"
    for frames in started:
        frames.close()
    assert service.peek_session("flood-slots").generating == 0
