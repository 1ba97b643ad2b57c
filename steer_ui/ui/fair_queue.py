"""Fair waiting: one client cannot make another wait.

Gradio's queue is first come, first served up to ``max_size``, so one client that sends 80 slider moves at
once makes the next visitor's move wait behind all of them.  :func:`install` wraps the queue's ``push``:

* **coalescing**: a slider move (the ``slider`` concurrency group) replaces the same session's older move
  of the same event that is still waiting; the replaced one is answered at once ("replaced by a newer
  request"), as the page itself only ever wants the newest;
* **caps**: a session may have ``policy.queued_per_session`` requests waiting and
  ``policy.requests_per_session`` waiting or running (Explore runs many at once, so a flood of sweeps would
  otherwise never wait and never meet the first cap; slider moves, coalesced above, count only while they
  wait), a client address ``policy.queued_per_address`` waiting; beyond that the request is answered at once
  with one line saying the server is busy (as an answer to the event, so every client shows the reason, not
  "queue full");
* **order**: within each concurrency group, a request joins the line after every address's requests of
  a lower rank, where its rank is how many requests its address already has waiting there.  A visitor
  with one request waiting is served before a flooding client's second, third, … request.
"""
from __future__ import annotations

from gradio import route_utils, utils
from gradio.data_classes import PredictBodyInternal
from gradio.server_messages import ProcessCompletedMessage

from . import i18n
from .common import SLIDER
from .request_guard import client_address


def _address(event) -> str:
    return client_address(getattr(event, "request", None)) or "?"


def _waiting(queue) -> list:
    return [e for q in queue.event_queue_per_concurrency_id.values() for e in q.queue]


def _running(queue) -> list:
    return [e for job in queue.active_jobs if job is not None for e in job]


def _reorder(line: list, event) -> None:
    """Move ``event`` (last in ``line``) before the first request whose address has more waiting before it."""
    line.remove(event)
    address = _address(event)
    rank = sum(1 for e in line if _address(e) == address)
    seen: dict[str, int] = {}
    for i, other in enumerate(line):
        a = _address(other)
        if seen.get(a, 0) > rank:
            line.insert(i, event)
            return
        seen[a] = seen.get(a, 0) + 1
    line.append(event)


def install(queue, blocks, backend) -> None:
    policy = backend.policy
    original_push = queue.push

    async def push(body: PredictBodyInternal, request, username):
        session = body.session_hash
        address = client_address(request) or "?"
        try:
            fn = route_utils.get_fn(blocks, None, body)
        except Exception:  # noqa: BLE001 - an unknown event: gradio's own push says so
            return await original_push(body, request, username)
        refusal = None
        slider = fn.concurrency_id == SLIDER["concurrency_id"]
        async with queue.delete_lock:
            waiting = _waiting(queue)
            if slider and session:
                for old in [e for e in waiting if e.session_hash == session and e.fn is fn]:
                    _drop(queue, old, i18n.message(backend.language(session), "superseded"))
                waiting = _waiting(queue)
            mine = sum(1 for e in waiting if session and e.session_hash == session)
            # slider moves are not counted against the running cap: the newest replaces the waiting one above,
            # so a page's flood of moves costs at most one waiting move per event
            mine_running = 0 if slider else sum(1 for e in _running(queue) if session and e.session_hash == session)
            from_address = sum(1 for e in waiting if _address(e) == address)
            if mine >= policy.queued_per_session or mine + mine_running >= policy.requests_per_session:
                refusal = i18n.message(backend.language(session), "queue_session_full", count=mine + mine_running)
            elif from_address >= policy.queued_per_address:
                refusal = i18n.message(backend.language(session), "queue_address_full", count=from_address)
        accepted = await original_push(body, request, username)
        event = queue.event_ids_to_events.get(accepted[1]) if accepted[0] else None
        if event is not None:
            async with queue.delete_lock:
                line = queue.event_queue_per_concurrency_id[event.concurrency_id].queue
                if refusal is not None:
                    _drop(queue, event, refusal)  # answered at once: it never runs and holds no place
                elif event in line:
                    _reorder(line, event)
        return accepted

    queue.push = push


def _drop(queue, event, message: str) -> None:
    """Take a waiting ``event`` out of the line and answer it with ``message`` (the caller holds the lock)."""
    line = queue.event_queue_per_concurrency_id[event.concurrency_id].queue
    if event in line:
        line.remove(event)
    queue.event_ids_to_events.pop(event._id, None)
    error = utils.error_payload(_Superseded(message), True)
    queue.send_message(event, ProcessCompletedMessage(output=error, success=False, title=None))


class _Superseded(Exception):
    pass
