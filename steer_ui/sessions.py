"""Visitors' sessions: what each browser tab or API client holds while it works, and who may get a new one.

A session is keyed by gradio's random per-tab id (``session_hash``; one per ``gradio_client.Client``).
These rules hold whatever a stranger sends:

* **Admission.** A new session costs a token from its client address's bucket
  (``policy.new_sessions_burst`` at once, refilled at ``policy.new_sessions_per_minute``), so a flood
  of fresh ids from one address is refused "busy" after the burst, and honest sessions are untouched.
* **Owners' work is in the library** (steer_ui/keeping.py): a session bound to an owner holds nothing that
  eviction could lose, so it is let go like an empty one, and the same tab's next call is bound to its owner
  again (its token is remembered).
* **Eviction never takes work.** When ``policy.max_sessions`` are kept (or ``policy.sessions_per_address``
  from the newcomer's address), a newcomer takes the place of the least recently used *empty* session
  (no dataset, no vectors, no job or generation running, no call for ``policy.session_grace_seconds``)
  of the whole server (of that address); when
  every such session holds work, the newcomer is refused "busy".  One address therefore never holds
  more than its share of the server, whatever it loads.  Work is forgotten only after
  ``policy.session_idle_seconds`` without a call, and its owner is told so once.
* **Calls without a usable id** (none, or a made-up short one) get a store of their own that lives
  briefly, apart from the real sessions, so they share nothing with anybody.
* **Memory.** A session holds at most ``policy.max_session_bytes`` of tensors and data, all sessions
  together ``policy.max_total_session_bytes``.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from .messages import UserError
from .policy import ANONYMOUS_PREFIX, MAX_ANONYMOUS, Policy

MAX_ADDRESSES = 4096  # client addresses whose admission buckets are remembered (the fullest are dropped)
MAX_REMEMBERED = 16384  # owner tokens of sessions let go, so a returning tab finds its owner (oldest dropped)


def vector_bytes(vector) -> int:
    tensors = list(vector.directions.values()) + list(vector.extras.values())
    return sum(t.numel() * t.element_size() for t in tensors)


def frame_bytes(dataset) -> int:
    frame = getattr(dataset, "frame", None)
    return int(frame.memory_usage(deep=True).sum()) if frame is not None else 0


@dataclass
class Session:
    """What one browser tab (or one gradio_client) owns."""

    dataset: Any = None
    dataset_name: str = ""
    vectors: "OrderedDict[str, Any]" = field(default_factory=OrderedDict)
    reports: dict[str, dict] = field(default_factory=dict)
    probe: dict | None = None
    last_generation: dict | None = None
    chat: dict | None = None  # the Explore chat's conversation, both sides (steer_ui/rooms/chat.py), bounded there
    cache: dict = field(default_factory=dict)  # UI-side memo (e.g. the last sweep), safe to drop
    lang: str = "en"
    touched: float = field(default_factory=time.monotonic)
    cancel: threading.Event = field(default_factory=threading.Event, repr=False)
    running: bool = False  # a long job (training, probing, a lesson) is under way
    job_end: str = ""  # how the last job ended: "finished", "cancelled" or "failed" ("" while one runs)
    generating: int = 0  # this session's generations in the decode batch or waiting for it
    superseding: list = field(default_factory=list, repr=False)  # its page generations' tickets, oldest first
    page_generations: int = 0  # how many superseding generations it has started: the newest holds the panels
    client: str | None = None  # the address it was admitted from (None: a Python or CLI caller)
    owner: str | None = None  # the library owner it is bound to (steer_ui/keeping.py); None: nothing is kept
    owner_token: str = field(default="", repr=False)  # that owner's token, as its browser or client holds it
    stored: dict = field(default_factory=dict)  # the owner's kept vectors by name, read on first use
    shared: dict = field(default_factory=dict)  # vectors opened by a share link: name in this session -> share id
    untold: Any = None  # a line its page could not be shown yet (Sessions.get): its next queued event says it

    @property
    def holds_work(self) -> bool:
        """Something its visitor would lose: a job or generation under way, or (when no library keeps them for an
        owner) data or vectors."""
        unkept = self.owner is None and (self.dataset is not None or bool(self.vectors))
        return unkept or self.running or self.generating > 0

    @property
    def held_bytes(self) -> int:
        return sum(vector_bytes(v) for v in self.vectors.values()) + frame_bytes(self.dataset)


class _Bucket:
    """Admission tokens of one client address: ``burst`` at most, refilled at ``rate`` per second."""

    __slots__ = ("tokens", "stamp")

    def __init__(self, burst: float, now: float):
        self.tokens, self.stamp = float(burst), now

    def take(self, burst: float, rate: float, now: float) -> float:
        """0 when a token was taken, else the seconds until one is there."""
        self.tokens = min(float(burst), self.tokens + (now - self.stamp) * rate)
        self.stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / rate if rate > 0 else float("inf")


class Sessions:
    """Every kept session, by id; thread-safe."""

    def __init__(self, policy: Policy):
        self.policy = policy
        self._kept: "OrderedDict[str, Session]" = OrderedDict()  # least recently used first
        self._evicted: "OrderedDict[str, None]" = OrderedDict()  # ids whose owner is told once that work is gone
        self._anonymous: "OrderedDict[str, Session]" = OrderedDict()
        self._buckets: "OrderedDict[str, _Bucket]" = OrderedDict()
        # the owner tokens of sessions no longer kept, so the same tab comes back to its owner's work
        self._tokens: "OrderedDict[str, str]" = OrderedDict()
        self._lock = threading.Lock()
        self._freed = threading.Condition(self._lock)  # a generation's place given back (generation_slot)
        self._waiters: set[int] = set()  # sessions (by id()) with a call waiting in wait_for_generation

    # ------------------------------------------------------------------ lookup
    def get(self, session: str | None, client: str | None = None, say_expired: bool = True) -> Session:
        """The session ``session`` (made if new); ``None`` gets a fresh one that is not kept.

        ``client`` is the caller's address where it is known (the app's HTTP requests): a new session
        from it is admitted only within its address's rate.  Raises :class:`UserError` ``busy`` (not
        admitted) or ``session_expired`` (its work was forgotten after the idle lifetime; said once).
        ``say_expired=False`` (a caller that could not show that line): the new session instead, holding the
        line in ``untold`` for a later call to say; the line is kept for the next call if the new one is refused.
        """
        if session is None:
            return Session()
        now = time.monotonic()
        with self._lock:
            if session.startswith(ANONYMOUS_PREFIX):  # one request's store: never evicts a real session
                s = self._anonymous.setdefault(session, Session())
                self._anonymous.move_to_end(session)
                while len(self._anonymous) > MAX_ANONYMOUS:
                    self._anonymous.popitem(last=False)
                return s
            s = self._kept.get(session)
            if s is not None and not s.running and not s.generating and \
                    now - s.touched > self.policy.session_idle_seconds:
                self._forget(session, s)
                s = None
            told = UserError("session_expired", hours=f"{self.policy.session_idle_seconds / 3600:g}") \
                if session in self._evicted else None
            if told is not None and say_expired:
                del self._evicted[session]
                raise told
            if s is None:
                s = self._admit(session, client, now)  # refused: the line stays for the next call
            else:
                self._kept.move_to_end(session)
            if told is not None:
                del self._evicted[session]
                s.untold = told
            s.touched = now
            return s

    def token_of(self, session: str | None) -> str:
        """The owner token a session had before it was let go (its next session is bound to it again)."""
        with self._lock:
            return self._tokens.get(session or "", "")

    def _remember(self, session: str, s: Session) -> None:
        if s.owner_token:
            self._tokens[session] = s.owner_token
            self._tokens.move_to_end(session)
            while len(self._tokens) > MAX_REMEMBERED:
                self._tokens.popitem(last=False)

    def peek(self, session: str | None) -> Session | None:
        """The kept session ``session`` if there is one; never makes or admits one."""
        if session is None:
            return None
        with self._lock:
            return self._anonymous.get(session) if session.startswith(ANONYMOUS_PREFIX) else self._kept.get(session)

    def __len__(self) -> int:
        return len(self._kept)

    # --------------------------------------------------------------- admission
    def _admit(self, session: str, client: str | None, now: float) -> Session:
        p = self.policy
        if client is not None:
            bucket = self._buckets.pop(client, None) or _Bucket(p.new_sessions_burst, now)
            self._buckets[client] = bucket  # most recently seen last
            while len(self._buckets) > MAX_ADDRESSES:
                self._buckets.popitem(last=False)
            wait = bucket.take(p.new_sessions_burst, p.new_sessions_per_minute / 60.0, now)
            if wait > 0:
                raise UserError("too_many_new_sessions", limit=p.new_sessions_per_minute, wait=f"{wait:.0f}")
        self._expire_idle(now)
        if client is not None:
            self._make_room(lambda v: v.client == client, p.sessions_per_address, client, "address_sessions_full")
        self._make_room(lambda v: True, p.max_sessions, client, "sessions_full")
        s = self._kept[session] = Session(client=client)
        return s

    def _make_room(self, among, limit: int, client: str | None, refusal: str) -> None:
        """Keep fewer than ``limit`` of the sessions ``among`` picks by dropping their least recently used
        empty ones; refuse the newcomer when all of them hold work.  A session used in the last
        ``policy.session_grace_seconds`` counts as holding work: its request may be about to store some."""
        quiet_since = time.monotonic() - self.policy.session_grace_seconds
        while sum(1 for v in self._kept.values() if among(v)) >= limit:
            victim = next((k for k, v in self._kept.items()
                           if among(v) and not v.holds_work and v.touched < quiet_since), None)
            if victim is None:  # every one holds someone's work: the newcomer waits, nobody loses anything
                if client is not None:
                    self._buckets[client].tokens += 1.0  # not admitted: the attempt costs no admission token
                raise UserError(refusal, limit=limit)
            self._remember(victim, self._kept.pop(victim))  # nothing of its owner's is lost, so nobody is told

    def _expire_idle(self, now: float) -> None:
        idle = [k for k, v in self._kept.items() if not v.running and not v.generating
                and now - v.touched > self.policy.session_idle_seconds]
        for k in idle:
            self._forget(k, self._kept[k])

    def _forget(self, session: str, s: Session) -> None:
        self._kept.pop(session, None)
        self._remember(session, s)
        if s.holds_work:
            self._evicted[session] = None
            while len(self._evicted) > 4 * self.policy.max_sessions:
                self._evicted.popitem(last=False)

    # ------------------------------------------------------------------ budgets
    def check_bytes(self, s: Session, extra: int) -> None:
        """Refuse ``extra`` bytes that would take ``s``, or all sessions together, over their budget."""
        if s.held_bytes + extra > self.policy.max_session_bytes:
            raise UserError("session_full", limit=self.policy.max_session_bytes >> 20)
        with self._lock:
            everyone = list(self._kept.values()) + list(self._anonymous.values())
        if sum(x.held_bytes for x in everyone) + extra > self.policy.max_total_session_bytes:
            raise UserError("server_full", limit=self.policy.max_total_session_bytes >> 20)

    def wait_for_generation(self, s: Session, done: Callable[[], bool], timeout: float) -> bool:
        """Until ``done()`` or ``s`` has no generation left (each one's end wakes this), at most ``timeout`` s;
        False, at once, where that would mean waiting beside another call of the same session or beside
        ``policy.generation_waiters`` calls of any.

        The callers (Save result) are answered outside the queue, on the server's own threads: each waiting
        call holds one, and eighty saves sent at once by one page whose generation ran held all of them, so a
        stranger's /whoami took 8.7 s (tests/security/test_limits_and_floods.py)."""
        key = id(s)
        with self._freed:
            if done() or not s.generating:
                return True
            if key in self._waiters or len(self._waiters) >= self.policy.generation_waiters:
                return False
            self._waiters.add(key)
            try:
                self._freed.wait_for(lambda: done() or not s.generating, timeout)
            finally:
                self._waiters.discard(key)
        return True

    @contextmanager
    def generation_slot(self, s: Session, supersede: bool = False, supersedable: bool = False,
                        wait_s: float = 0.0) -> Iterator[Callable]:
        """One of the session's ``policy.generations_per_session`` places, held for one generation; yields
        ``hold(ticket)``, which makes a submitted ticket one that a later superseding generation may cancel.

        ``supersede``: the page's generations (a slider release, a vector picked, a button) all write the same
        panels, so the newest cancels every older one still running (each leaves the batch at its next step, and
        ends without a final frame).  Two left running, the older one, when it ended last (a page load's
        generation beside a Generate click with a longer answer), overwrote the newest's panels: the Chromium test
        of the Δlogit limit found it.  Those cancelled but not yet unwound still count, up to twice the cap: a
        flood from one page stays bounded.  ``supersedable``: whether this one's ticket may be cancelled so (the
        page's Explore generations); a chat turn takes the place of the page's Explore generations but is never
        cancelled by one.  ``wait_s``: how long to wait for a place (one freed or unwound by another thread)
        before refusing."""
        cap = self.policy.generations_per_session
        deadline = time.monotonic() + wait_s
        with self._freed:  # one visitor cannot take every place in the batch
            cancelled = 0
            if supersede:
                s.page_generations += 1
                cancelled = len(s.superseding)
                for older in s.superseding:
                    older.superseded = True
                    older.cancel()
                s.superseding.clear()
            serial = s.page_generations
            while s.generating >= cap and not (cancelled and s.generating < 2 * cap):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise UserError("session_busy", count=s.generating)
                self._freed.wait(left)
            s.generating += 1
        held = []

        def hold(ticket) -> None:
            if supersedable:
                with self._freed:
                    if s.page_generations != serial:  # a newer one started while this one was being submitted
                        ticket.superseded = True
                        ticket.cancel()
                        return
                    s.superseding.append(ticket)
                    held.append(ticket)

        try:
            yield hold
        finally:
            with self._freed:
                s.generating -= 1
                for ticket in held:
                    if ticket in s.superseding:
                        s.superseding.remove(ticket)
                self._freed.notify_all()
