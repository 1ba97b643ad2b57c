"""Long jobs (training, probing, detection, the Concepts lessons): one at a time on the shared model, each
ending on its owner's Cancel or after ``policy.job_seconds``.

Generation and the slider never take the model's job lock, so no job holds them up.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Callable, Iterator

from .messages import UserError, english
from .sessions import Session

Progress = Callable[[float, str], None]


def _noop(_f: float, _m: str = "") -> None:
    pass


@contextmanager
def job(s: Session, handle, seconds: float, progress: Progress | None = None) -> Iterator[Progress]:
    """Run a job of session ``s`` on ``handle``: yields a progress callback that also ends it.

    Long jobs report progress often, so raising from the callback (on Cancel, or past ``seconds``) stops
    them within a step; every hook is removed on the way out, and the session keeps what it had, since
    results are stored only at the end.  While another visitor's job holds the model, the callback says
    so, and Cancel and the time limit reach the waiting job too.  One job per session at a time.
    """
    progress = progress or _noop
    if s.running:
        raise UserError("job_running")
    s.cancel.clear()
    deadline = time.monotonic() + seconds

    def report(fraction: float, message: str = "") -> None:
        s.touched = time.monotonic()  # a session at work is in use, however long the job
        if s.cancel.is_set():
            raise UserError("job_cancelled")
        if time.monotonic() > deadline:
            raise UserError("job_too_long", limit=f"{seconds:g}")
        progress(fraction, message)

    s.running, s.job_end = True, ""
    ended = "failed"
    try:
        if not handle.lock.acquire(blocking=False):
            report(0.0, english("job_queued"))
            while not handle.lock.acquire(timeout=0.5):
                report(0.0, english("job_queued"))
        try:
            yield report
            ended = "finished"
        finally:
            handle.lock.release()
    except UserError as exc:
        if exc.key == "job_cancelled":
            ended = "cancelled"
        raise
    finally:
        s.job_end = ended  # before running drops: whoever waits on running reads how it ended
        s.running = False
