"""Small helpers every tab uses: translated labels, session ids, error conversion."""
from __future__ import annotations

import functools
import html
import inspect
import logging
import math
import threading
import time
import uuid
from collections import OrderedDict

import gradio as gr

from ..messages import encodable
from ..policy import ANONYMOUS_PREFIX, valid_session_id
from ..service import UserError
from . import i18n, panel_keys, relabel

log = logging.getLogger("steer_ui.ui")

# Long jobs (training, probing, comparisons, the Concepts tab's lessons): the service runs them one at a time in
# its own line, which the page shows ("waiting for another job (…) — 2nd in line", ui/job_line.py), so gradio
# lets several in at once to wait there visibly (its own queue would only say "queue: 1/1"); the limit bounds
# how many wait so (a page's job waits without a thread, an API call with one).
MODEL = dict(concurrency_id="model", concurrency_limit=8)
CANCELLED = ("job_cancelled", "job_dequeued")  # a job its owner stopped: told as information, not as an error
# Explore events (slider, generate, sweep) of many sessions run at once: generations join one decode batch
# (steer_ui/model/engine.py) and the slider's passes run side by side, since hooks act only in their own
# thread. The limit bounds the threads and memory they take; long jobs keep the "model" slot above.
EXPLORE = dict(concurrency_id="explore", concurrency_limit=16)  # policy.batch_requests + waiting_generations
# Slider moves get slots of their own, so sixteen long generations never hold up everyone's bars.
SLIDER = dict(concurrency_id="slider", concurrency_limit=8)


def T(key: str):
    """A label translated in the browser (gr.I18n); the key must exist in :mod:`i18n`."""
    if key not in i18n.TRANSLATIONS["en"]:
        raise KeyError(f"no English text for i18n key '{key}'")
    return i18n.GR_I18N(key)


def picker_choices(names) -> list[tuple]:
    """A vector picker's choices for ``names``: each shown as itself but the random direction, shown in the page's
    language (its value stays the name the API and links use)."""
    from ..service import RANDOM

    return [(T("vector.random_direction") if name == RANDOM else name, name) for name in names]


def sid(request: gr.Request | None) -> str | None:
    """The per-tab session id (gradio_client gets its own per Client).

    A call without a usable id (none, or a made-up short one such as
    "default") gets a one-request id of its own, so it never shares a store
    with anybody; the service keeps such stores apart and briefly.
    """
    session = getattr(request, "session_hash", None)
    if valid_session_id(session):
        return session
    if request is None:
        return None
    anon = request.__dict__.get("_steer_ui_anonymous")
    if anon is None:
        anon = request.__dict__["_steer_ui_anonymous"] = ANONYMOUS_PREFIX + uuid.uuid4().hex
    return anon


def lang_of(backend, request: gr.Request | None) -> str:
    return backend.language(sid(request))


def page_url(request) -> str:
    """The page's own address, where a saved result's ``?result=`` link starts."""
    try:
        return str(request.base_url)
    except Exception:  # noqa: BLE001 - a link relative to the page still works
        return "/"


def _find_request(args, kwargs) -> gr.Request | None:
    for value in list(args) + list(kwargs.values()):
        if isinstance(value, gr.Request):
            return value
    return None


def refusal_line(backend, request, exc: BaseException) -> str:
    """One plain line in the session's language: a refusal as written, anything else as "something went wrong"
    (its traceback goes to the server log, never to the visitor: it may name files or internals)."""
    if not isinstance(exc, (gr.Error, UserError)):
        log.error("unexpected error in the app", exc_info=exc)
    return refusal_text(lang_of(backend, request), exc)


def refusal_text(lang: str, exc: BaseException) -> str:
    """:func:`refusal_line`'s words in ``lang`` (pure: a language switch re-words a shown refusal with it)."""
    if isinstance(exc, gr.Error):
        text = str(exc.message)
    elif isinstance(exc, UserError):
        text = i18n.message(lang, exc.key, **exc.params)
    else:
        text = i18n.message(lang, "unexpected")
    # a refusal that echoes the client's value: a lone surrogate in it cut the client's stream with no message
    text = encodable(text)
    return text.splitlines()[0] if text else text


def _status_line(lang: str, exc: BaseException) -> str:
    return i18n.plain(refusal_text(lang, exc))


def as_gr_error(backend, request, exc: BaseException) -> gr.Error:
    """The refusal as a gr.Error: what an API client receives."""
    if isinstance(exc, gr.Error):
        return exc
    # the page's toast renders HTML: user file names and token strings must not become markup there; an API client
    # reads the line as plain text, where "&lt;script&gt;" was noise (a hostile probe)
    line = refusal_line(backend, request, exc)
    return gr.Error(html.escape(line, quote=False) if from_page(request) else line,
                    title=i18n.message(lang_of(backend, request), "error_title"), print_exception=False)


def from_page(request: gr.Request | None) -> bool:
    """Whether a call comes from the page in a browser rather than an API client: gradio's page marks its calls
    ``x-gradio-user: app`` (gradio_client sends ``api``; raw HTTP clients nothing).  A client that pretends to be
    the page only changes how its own refusals are shown to it."""
    headers = getattr(request, "headers", None)
    return headers is not None and headers.get("x-gradio-user") == "app"


# A toast stays this long (gradio's default for a warning); the same refusal again within it is not toasted twice
TOAST_SECONDS = 10.0


class Toasted:
    """Per page (gradio session): the refusal last toasted and when.  One action may fire several events that
    each refuse the same input (Generate asks for the generations and the bars; a prompt's Enter, the bars then
    the generations): the page shows one toast for it, while each event's status line still says it."""

    def __init__(self, pages: int = 4096):
        self._pages, self._last = pages, OrderedDict()
        self._lock = threading.Lock()

    def first(self, page: str | None, line: str, now: float | None = None) -> bool:
        """Whether ``line`` is new on ``page`` (not toasted there in the last TOAST_SECONDS); records it."""
        now = time.monotonic() if now is None else now
        with self._lock:
            last = self._last.get(page)
            if last is not None and last[0] == line and now - last[1] < TOAST_SECONDS:
                return False
            self._last[page] = (line, now)
            self._last.move_to_end(page)
            while len(self._last) > self._pages:
                self._last.popitem(last=False)
            return True


TOASTED = Toasted()


def toast_reaches_page() -> bool:
    """Whether a toast raised now reaches the page: gradio sends ``gr.Warning`` and ``gr.Info`` down the queue's
    stream of a queued event only; an unqueued event's (``queue=False``) is written to the server's log instead.
    Such a refusal is not recorded as toasted, or it would hide the next queued event's toast of the same line."""
    from gradio.context import LocalContext

    return LocalContext.blocks.get(None) is not None and LocalContext.event_id.get(None) is not None


def _refused_on_page(backend, request, exc: BaseException, status, clear=()):
    """A refusal on the page touches one line: a toast (info for a cancelled job, a warning otherwise; one per
    refusal however many events of one action refused it) and the tab's status line; every other output keeps
    what it showed (a raised gr.Error would mark all of them as failed, which is what made unrelated pickers and
    tables turn into red "Error" pills).  gradio titles a toast by its kind; the page's script words the title
    in the page's language (app.JS_TAB_LABELS)."""
    line = refusal_line(backend, request, exc)
    lang = lang_of(backend, request)
    if toast_reaches_page() and TOASTED.first(sid(request), line):
        if isinstance(exc, UserError) and exc.key in CANCELLED:
            gr.Info(html.escape(line, quote=False), title=i18n.message(lang, "cancelled_title"),
                    duration=TOAST_SECONDS)
        else:
            gr.Warning(html.escape(line, quote=False), title=i18n.message(lang, "error_title"),
                       duration=TOAST_SECONDS)
    out = {component: None for component in clear}
    if status is not None:
        out[status] = relabel.keep(backend, sid(request), [status], _status_line, exc)
    return out or gr.skip()


def _held_to_the_slider(args: tuple, kwargs: dict, page: bool) -> tuple[tuple, dict]:
    """The handler's arguments with every :class:`SliderAlpha` as a plain float; on the page, an α outside the
    slider's range is refused (a typed 5 beside a ±0.315 slider once ran at 5 while the box showed 0.315)."""
    def plain(value):
        if not isinstance(value, SliderAlpha):
            return value
        if page and not value.inside():
            raise UserError("alpha_outside_range", low=f"{value.low:g}", high=f"{value.high:g}")
        return float(value)

    return tuple(plain(a) for a in args), {k: plain(v) for k, v in kwargs.items()}


def handler(backend, status=None, clear=()):
    """Decorator: turn UserError (and any crash) into one plain line in the session's language.

    An API client gets it as the call's error (gr.Error); the page gets it as a toast and, when ``status`` (a
    component among the event's outputs) is given, in that status line, with every other output untouched but
    those in ``clear`` (emptied: they showed the previous input's result, which beside the refusal reads as
    this input's).
    An API client's answer carries each panel's key as data where the page gets its stale-note element
    (:func:`panel_keys.for_caller`).  Works for plain functions and (async) generators; keeps the signature so
    gradio still injects ``gr.Request`` and ``gr.Progress``.
    """

    def wrap(fn):
        if inspect.isasyncgenfunction(fn):  # a long job's event (ui/job_line.py): its line, then its outputs
            @functools.wraps(fn)
            async def agen(*args, **kwargs):
                request = _find_request(args, kwargs)
                page = from_page(request)
                try:
                    args_, kwargs_ = _held_to_the_slider(args, kwargs, page)
                    async for outputs in fn(*args_, **kwargs_):
                        yield panel_keys.for_caller(outputs, page)
                except Exception as exc:
                    if not page:
                        raise as_gr_error(backend, request, exc) from None
                    yield _refused_on_page(backend, request, exc, status, clear)
            return agen

        if inspect.isgeneratorfunction(fn):
            @functools.wraps(fn)
            def gen(*args, **kwargs):
                request = _find_request(args, kwargs)
                page = from_page(request)
                try:
                    args_, kwargs_ = _held_to_the_slider(args, kwargs, page)
                    for outputs in fn(*args_, **kwargs_):
                        yield panel_keys.for_caller(outputs, page)
                except Exception as exc:
                    if not from_page(request):
                        raise as_gr_error(backend, request, exc) from None
                    yield _refused_on_page(backend, request, exc, status, clear)
            return gen

        @functools.wraps(fn)
        def call(*args, **kwargs):
            request = _find_request(args, kwargs)
            try:
                args_, kwargs_ = _held_to_the_slider(args, kwargs, from_page(request))
                return panel_keys.for_caller(fn(*args_, **kwargs_), from_page(request))
            except Exception as exc:
                if not from_page(request):
                    raise as_gr_error(backend, request, exc) from None
                return _refused_on_page(backend, request, exc, status, clear)
        return call

    return wrap


def progress_adapter(progress):
    """core progress(frac, message) -> gr.Progress."""
    def report(frac: float, message: str = "") -> None:
        try:
            progress(max(0.0, min(1.0, float(frac))), desc=message)
        except Exception:  # progress is cosmetic; never fail the work for it
            pass
    return report


def table(frame, max_rows: int = 200):
    """A DataFrame safe to show: strings for objects, at most ``max_rows`` rows."""
    import pandas as pd

    if frame is None:
        return pd.DataFrame()
    frame = frame.head(max_rows).copy()
    for column in frame.columns:
        if pd.api.types.is_float_dtype(frame[column]):
            frame[column] = frame[column].round(4)
        if frame[column].dtype == object:
            frame[column] = frame[column].map(lambda v: v if isinstance(v, str) or v is None else str(v))
    return frame


class SliderAlpha(float):
    """α as the α slider sent it, with the slider's range on that page at that moment (gradio keeps each
    session's updated range).  :func:`handler` holds the page to the range and hands the function a plain float;
    an API client is not held to it (see :class:`AlphaSlider`)."""

    low: float = -math.inf
    high: float = math.inf

    def inside(self) -> bool:
        slack = 1e-9 * max(1.0, abs(self.low), abs(self.high))  # the page's decimals against the server's floats
        return self.low - slack <= float(self) <= self.high + slack


class AlphaSlider(gr.Slider):
    """A slider whose range is only a UI convenience: the API accepts any finite α.

    gr.Slider refuses values outside [minimum, maximum] per session, so a
    gradio_client caller could not ask for α = 8 while the slider shows ±1.
    The backend checks α is finite and says so in plain words otherwise.
    The page itself is held to the range (:class:`SliderAlpha`, checked in :func:`handler`; the page's script
    refuses a typed value before anything is sent, ``ui/alpha_box.py``).
    Rendered by gradio's own slider (``is_template``).
    """

    is_template = True

    def preprocess(self, payload):
        if payload is None:
            return None
        try:
            alpha = SliderAlpha(float(payload))
        except (TypeError, ValueError):
            return payload  # the backend turns it into a plain "α must be a number" message
        try:
            alpha.low, alpha.high = float(self.minimum), float(self.maximum)
        except (TypeError, ValueError):
            pass
        return alpha


class OptionalNumberBox(gr.Textbox):
    """A number that may be left empty (empty = "the default"), as a text box: gr.Number shows an empty value
    as 0 and sends 0 once anything is edited.  API clients may send a number or numeric text; the service
    reads and bounds it (the request guard only checks that it is one of those).  Rendered by gradio's own
    text box (``is_template``)."""

    is_template = True

    def preprocess(self, payload):
        if isinstance(payload, (int, float)) and not isinstance(payload, bool):
            return payload
        return super().preprocess(payload)
