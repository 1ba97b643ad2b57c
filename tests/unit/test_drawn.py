"""What a page shows in a panel (ui/drawn.py): a second request for the same numbers is skipped only while the
first is on its way or is what the page drew last."""
from __future__ import annotations

from steer_ui.ui.drawn import Drawn


def test_a_repeat_is_skipped_while_the_first_runs_and_after_it_reached_the_page():
    d = Drawn()
    assert not d.shown("page", "bars", "α=0.3")
    token = d.start("page", "bars", "α=0.3")
    assert d.shown("page", "bars", "α=0.3")  # the slider's release behind its last input: the answer is coming
    d.finish("page", "bars", "α=0.3", token, ok=True)
    assert d.shown("page", "bars", "α=0.3")
    assert not d.shown("page", "bars", "α=0.4")
    assert not d.shown("other page", "bars", "α=0.3")  # each page its own
    assert not d.shown("page", "delta", "α=0.3")


def test_an_older_request_finishing_last_is_what_the_page_shows():
    d = Drawn()
    old = d.start("page", "bars", "K")
    new = d.start("page", "bars", "K2")
    d.finish("page", "bars", "K2", new, ok=True)
    d.finish("page", "bars", "K", old, ok=True)  # answers reach the page in the order they finish: K is drawn
    assert not d.shown("page", "bars", "K2")  # so K2 must be drawn again
    assert not d.shown("page", "bars", "K")  # and K is not the latest asked for: the page asks again, runs


def test_a_failed_request_is_forgotten():
    d = Drawn()
    ok = d.start("page", "bars", "K")
    d.finish("page", "bars", "K", ok, ok=True)
    failed = d.start("page", "bars", "K2")
    d.finish("page", "bars", "K2", failed, ok=False)
    assert not d.shown("page", "bars", "K2")
    assert not d.shown("page", "bars", "K")  # the page still shows K, but it asked for K2 since: K runs again


def test_no_page_no_memory_and_the_record_is_bounded():
    d = Drawn(pages=2)
    d.finish(None, "bars", "K", d.start(None, "bars", "K"), ok=True)
    assert not d.shown(None, "bars", "K")
    for page in ("a", "b", "c"):
        d.finish(page, "bars", "K", d.start(page, "bars", "K"), ok=True)
    assert not d.shown("a", "bars", "K") and d.shown("c", "bars", "K")  # the oldest page was let go


def test_no_skip_while_an_older_request_may_still_overwrite_the_page():
    """Picking a vector starts the bars for the old α; the person types a new α before they return: the new
    request runs, and its release must not be skipped, as the older answer may reach the page after it."""
    d = Drawn()
    older = d.start("page", "bars", "old α")
    newer = d.start("page", "bars", "new α")
    assert not d.shown("page", "bars", "new α")  # the older one is still on its way
    d.finish("page", "bars", "new α", newer, ok=True)
    assert not d.shown("page", "bars", "new α")
    d.finish("page", "bars", "old α", older, ok=True)  # it reached the page last: the page shows the old α
    assert not d.shown("page", "bars", "new α")
    again = d.start("page", "bars", "new α")
    assert d.shown("page", "bars", "new α")  # now only its own answer is on the way
    d.finish("page", "bars", "new α", again, ok=True)
    assert d.shown("page", "bars", "new α")
