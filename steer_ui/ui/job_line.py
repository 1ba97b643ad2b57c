"""The page's side of long jobs: one status line per job next to its button, and Cancel.

A long job's event runs the door's call in a thread of its own and, while it waits in the server's line or runs,
writes one line (what it waits for and its place, or its progress; "Stopping…" once Cancel is pressed) into the
job's status element; its other outputs show no progress of their own (``show_progress="hidden"``).  The event's
handler is an async generator, so a job waiting its turn holds no worker thread, and the line is read from the
server's own record of who runs and who waits (:meth:`steer_ui.service.Service.job_view`), not guessed by the page.
"""
from __future__ import annotations

import asyncio
import contextvars
import threading
from typing import Any, AsyncIterator, Callable

import gradio as gr

from ..service import Service
from . import i18n
from .common import from_page, handler, lang_of, sid

POLL_S = 0.25  # how often the line is read: Cancel's "Stopping…" shows within this
CANCEL_WAIT_S = 3.0  # an API client's Cancel waits this long for the job's end, to answer with it
BAR_CELLS = 10
# What each kind of job (steer_ui.jobs.Ticket.kind) is called on the page.
JOB_NAMES = {
    "train": "job_name_train", "probe": "job_name_probe", "detect": "job_name_detect", "compare": "job_name_compare",
    "concepts_lm_head": "job_name_concepts_lm_head", "concepts_sampling": "job_name_concepts_sampling",
    "concepts_sample": "job_name_concepts_sampling", "concepts_explode": "job_name_concepts_explode",
    "concepts_fix": "job_name_concepts_explode", "concepts_kv": "job_name_concepts_kv",
    "concepts_kv_time": "job_name_concepts_kv_time",
}


def ordinal(lang: str, n: int) -> str:
    """A place in line as the language writes it: 1st, 2nd, 3rd, 11th, 22nd in English; the number elsewhere (the
    sentence around it says 第 … 位)."""
    if i18n.normalise_lang(lang) != "en":
        return str(n)
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def job_name(lang: str, kind: str, detail: str = "") -> str:
    name = i18n.message(lang, JOB_NAMES.get(kind, "job_name_other"))
    return f"{name} ({detail})" if detail else name


def bar(fraction: float) -> str:
    filled = max(0, min(BAR_CELLS, round(float(fraction) * BAR_CELLS)))
    return "▰" * filled + "▱" * (BAR_CELLS - filled)


def status_line(lang: str, view: dict | None) -> str:
    """The one line a job shows while it waits or runs (Markdown-safe), from its place in the server's line."""
    if view is None:
        return i18n.message(lang, "job_starting")
    if view.get("cancelling"):
        return i18n.message(lang, "cancel_asked")
    if view["state"] == "waiting":
        place = ordinal(lang, int(view["place"]))
        ahead = view.get("waits_for")
        if ahead is None:  # the model is busy with something that is not a job (a model load)
            return i18n.markdown(lang, "job_waiting_model", place=place)
        return i18n.markdown(lang, "job_waiting", job=job_name(lang, ahead["kind"], ahead.get("detail", "")),
                             place=place)
    fraction = float(view.get("fraction") or 0.0)
    return i18n.markdown(lang, "job_progress", bar=bar(fraction), percent=f"{fraction:.0%}",
                         job=job_name(lang, view["kind"], view.get("detail", "")), seconds=f"{view['seconds']:.0f}",
                         message=view.get("message") or "")


async def follow(backend: Service, request: gr.Request | None, status, work: Callable[[], Any]) -> AsyncIterator:
    """Run ``work()`` (the door's call, and turning its result into the event's outputs) in a thread; meanwhile
    yield ``{status: line}`` whenever the job's line changes, then ``work``'s outputs.  A job that ends within the
    first poll shows no line at all (a quick lesson does not flicker).  ``work``'s refusal is raised here, for
    :func:`~steer_ui.ui.common.handler` to write as the status line."""
    box: dict[str, Any] = {}
    done = threading.Event()
    context = contextvars.copy_context()  # gradio's request context, for toasts raised inside the work

    def run() -> None:
        try:
            box["outputs"] = context.run(work)
        except BaseException as exc:  # noqa: BLE001 - handed to the event below
            box["error"] = exc
        finally:
            done.set()

    threading.Thread(target=run, name="steer-ui-job", daemon=True).start()
    lang, session, shown = lang_of(backend, request), sid(request), None
    while not done.is_set():
        await asyncio.sleep(POLL_S)
        if done.is_set():
            break
        line = status_line(lang, backend.job_view(session))
        if line != shown:
            shown = line
            yield {status: line}
    if "error" in box:
        raise box["error"]
    yield box["outputs"]


def cancel_fn(backend: Service):
    """Cancel, outside the queue: it raises the flag and answers at once.  On the page the job's own line says
    "Stopping…" within a poll and then how it ended (one writer, so the line never ends on a stale "Stopping…");
    a job still waiting leaves the line.  An API client gets one line: the job's end if it comes within
    ``CANCEL_WAIT_S``, else that it is stopping."""

    @handler(backend)
    def cancel(request: gr.Request):
        lang, session = lang_of(backend, request), sid(request)
        waiting = (backend.job_view(session) or {}).get("state") == "waiting"
        if not backend.cancel(session):
            # the line itself, on the page too: this runs outside the queue, where a toast never reached the page
            # (a browser review's Cancel on an idle tab said nothing)
            return i18n.message(lang, "nothing_to_cancel")
        if from_page(request):
            return gr.skip()
        outcome = backend.job_outcome(session, wait=CANCEL_WAIT_S)
        if outcome == "cancelled":
            return i18n.message(lang, "job_dequeued" if waiting else "job_cancelled")
        return i18n.message(lang, "cancel_asked" if outcome == "running" else "nothing_to_cancel")

    return cancel
