"""Long jobs (training, probing, detection, comparisons, the Concepts lessons): one at a time, in a line the
page can show (who runs, who waits and in what place), each ending on its owner's Cancel or after
``policy.job_seconds``.

Generation and the slider never take the model's job lock, so no job holds them up.
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator

from .messages import Said, UserError
from .sessions import Session

Progress = Callable[[float, str], None]
WAIT_POLL_S = 0.1  # how often a waiting job looks for its turn and its owner's Cancel


def _noop(_f: float, _m: str = "") -> None:
    pass


@dataclass
class Ticket:
    """One job in the line: whose it is, what it is (``kind``, a name the fronts translate, and ``detail``, such
    as the method), and how far it has come."""

    owner: Session = field(repr=False)
    kind: str
    detail: str = ""
    state: str = "waiting"  # "waiting", then "running"
    fraction: float = 0.0
    message: str = ""
    since: float = field(default_factory=time.monotonic)


class JobLine:
    """The server's long jobs: the one that runs and those that wait, first come, first served.

    A job holds the line's one place from its turn to its end, whether it needs the model's lock (training,
    probing, lessons) or only the shared decode batch (a comparison): either way one long job runs at a time, as
    the page says.  :meth:`view` is what a session may know: its own job, where it stands and what it waits for
    (the kind of the job ahead, never whose it is).
    """

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._running: Ticket | None = None
        self._waiting: list[Ticket] = []

    def join(self, ticket: Ticket) -> None:
        with self._mutex:
            self._waiting.append(ticket)

    def try_start(self, ticket: Ticket, lock=None) -> bool:
        """Start ``ticket`` if it is first in line, no job runs and ``lock`` (if any) is free; True if it did."""
        with self._mutex:
            if self._running is not None or not self._waiting or self._waiting[0] is not ticket:
                return False
            if lock is not None and not lock.acquire(blocking=False):
                return False
            self._waiting.pop(0)
            ticket.state, ticket.since, self._running = "running", time.monotonic(), ticket
            return True

    def leave(self, ticket: Ticket) -> None:
        with self._mutex:
            if ticket in self._waiting:
                self._waiting.remove(ticket)
            if self._running is ticket:
                self._running = None

    def view(self, owner: Session | None) -> dict | None:
        """The session's job: ``state``, ``kind``, ``detail``, ``fraction``, ``message``, ``seconds`` (waiting or
        running), and while it waits ``place`` (1: next) and ``waits_for`` ({"kind", "detail"} of the running job,
        None when the model is busy with something that is not a job, such as a model load)."""
        with self._mutex:
            tickets = ([self._running] if self._running is not None else []) + self._waiting
            mine = next((t for t in tickets if t.owner is owner), None) if owner is not None else None
            if mine is None:
                return None
            out = {"state": mine.state, "kind": mine.kind, "detail": mine.detail, "fraction": mine.fraction,
                   "message": mine.message, "seconds": time.monotonic() - mine.since,
                   "cancelling": owner.cancel.is_set()}
            if mine.state == "waiting":
                ahead = self._running
                out["place"] = self._waiting.index(mine) + 1
                out["waits_for"] = {"kind": ahead.kind, "detail": ahead.detail} if ahead is not None else None
            return out


@contextmanager
def job(s: Session, handle, seconds: float, progress: Progress | None = None, line: JobLine | None = None,
        kind: str = "job", detail: str = "", model_lock: bool = True) -> Iterator[Progress]:
    """Run a job of session ``s`` on ``handle``: yields a progress callback that also ends it.

    Long jobs report progress often, so raising from the callback (on Cancel, or past ``seconds``) stops
    them within a step; every hook is removed on the way out, and the session keeps what it had, since
    results are stored only at the end.  The job first waits for its turn in ``line`` (and for the model's
    lock unless ``model_lock`` is False: a comparison shares the decode batch instead); Cancel while it waits
    takes it out of the line ("job_dequeued": nothing ran).  One job per session at a time.
    """
    progress = progress or _noop
    line = line or JobLine()
    if s.running:
        raise UserError("job_running")
    s.cancel.clear()
    deadline = time.monotonic() + seconds
    ticket = Ticket(owner=s, kind=kind, detail=detail)

    def report(fraction: float, message: str = "") -> None:
        s.touched = time.monotonic()  # a session at work is in use, however long the job
        if s.cancel.is_set():
            raise UserError("job_cancelled")
        if time.monotonic() > deadline:
            raise UserError("job_too_long", limit=f"{seconds:g}")
        # a Said message keeps its key, so the page says it in the visitor's language (ui/job_line.py)
        message = message if isinstance(message, Said) else str(message)
        ticket.fraction, ticket.message = max(0.0, min(1.0, float(fraction))), message
        progress(fraction, message)

    s.running, s.job_end = True, ""
    ended = "failed"
    lock = handle.lock if model_lock else None
    line.join(ticket)
    try:
        while not line.try_start(ticket, lock):
            if s.cancel.is_set():
                raise UserError("job_dequeued")
            report(0.0, Said("job_queued"))
            time.sleep(WAIT_POLL_S)
        try:
            yield report
            ended = "finished"
        finally:
            line.leave(ticket)  # before the lock: the next in line may start the moment it is free
            if lock is not None:
                lock.release()
    except UserError as exc:
        if exc.key in ("job_cancelled", "job_dequeued"):
            ended = "cancelled"
        raise
    finally:
        line.leave(ticket)
        s.job_end = ended  # before running drops: whoever waits on running reads how it ended
        s.running = False
