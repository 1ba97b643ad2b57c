"""Every event's inputs checked before gradio touches them, its session admitted, and every failure one line.

Gradio's own preprocessing answers a stranger's odd values with multi-line, English, type-named errors
(``'<' not supported between instances of 'str' and 'int'``), rounds 6.7 to 7 in a whole-number field,
and passes NaN through.  So the app's ``process_api`` is wrapped once (:func:`install`):

* the caller's session is admitted by the service (per client address: :mod:`steer_ui.sessions`);
* each input value is checked against its component (numbers finite, whole where the field is, within the
  field's bounds; a choice among the choices; text as text of bounded length), and a refusal names the
  field, in the session's language;
* whatever still fails becomes one plain line: a :class:`~steer_ui.messages.UserError` in the session's
  language, anything else as "something went wrong" with the traceback in the server log only.
"""
from __future__ import annotations

import logging
import typing
import os
from typing import Any

import gradio as gr
from gradio.exceptions import ComponentProcessingError
from pydantic import ValidationError

from ..guards import flag, number
from ..guards import text as checked_text
from ..messages import UserError
from ..policy import Policy
from . import i18n, route_checks
from .common import AlphaSlider, OptionalNumberBox, as_gr_error, from_page, sid

log = logging.getLogger("steer_ui.ui")

MAX_TEXT_CHARS = 64 * 1024  # any text box (the service holds prompts to much less); JSON settings fit
MAX_CHOICE_CHARS = 200  # a free-text choice (a vector's name: limits.MAX_NAME)
UNREADABLE = "it is not in the form its field takes"


OWNER_HEADER = "x-steer-owner"


def _header(request, name: str) -> str | None:
    headers = getattr(request, "headers", None)
    try:
        value = headers.get(name) if headers is not None else None
    except Exception:  # noqa: BLE001 - a request without headers names no owner
        return None
    return value[:64] if isinstance(value, str) else None


def client_address(request) -> str | None:
    """The address the request came from: the connection's peer, or what X-Forwarded-For says where the peer is
    a proxy the operator named (``--forwarded-allow-ips``; uvicorn rewrites ``request.client`` then, see
    :func:`trust_forwarded`).  Headers are never read here: a client cannot name its own address."""
    client = getattr(request, "client", None)
    return getattr(client, "host", None)


# uvicorn reads this when gradio's launch builds its Config (gradio passes no forwarded_allow_ips of its own), and
# trusts X-Forwarded-For from loopback when it is unset: behind a same-host proxy or tunnel that passes a
# client's header through, every fresh X-Forwarded-For would be a fresh address, past the per-address caps.
FORWARDED_ENV = "FORWARDED_ALLOW_IPS"


def trust_forwarded(addresses) -> None:
    """Before a launch: honour X-Forwarded-For only from ``addresses`` (IP addresses or networks; none: nobody)."""
    os.environ[FORWARDED_ENV] = ",".join(addresses)


def forwarded_trusted(demo) -> str | None:
    """After a launch: the proxies the running server takes X-Forwarded-For from, as uvicorn was told."""
    config = getattr(getattr(demo, "server", None), "config", None)
    return getattr(config, "forwarded_allow_ips", None)


def field_label(block, lang: str) -> str:
    """What the page calls ``block``, in ``lang``."""
    label = getattr(block, "label", None)
    key = getattr(label, "key", None)  # gr.I18nData made by common.T
    if key and key in i18n.TRANSLATIONS["en"]:
        return i18n.label(lang, key)
    if isinstance(label, str) and label:
        return label  # whole: a message names its field as the page does
    return getattr(block, "elem_id", None) or "input"


def _choices(block) -> list:
    return [c[1] if isinstance(c, (tuple, list)) else c for c in (getattr(block, "choices", None) or [])]


def check_value(block, value: Any, what: str) -> None:
    """Refuse ``value`` for ``block`` with one line naming ``what``; values the handler reads as given pass."""
    if isinstance(block, OptionalNumberBox):  # empty, a number or numeric text; the service bounds it
        if isinstance(value, bool) or not (value is None or isinstance(value, (int, float, str))):
            raise UserError("number_not_a_number", what=what, value=str(value)[:40])
        if isinstance(value, str):
            checked_text(value, what, 64, allow_empty=True)
    elif isinstance(block, (gr.Number, gr.Slider)):
        if value is None and isinstance(block, gr.Number):
            return  # an empty number field: the handler's default
        whole = getattr(block, "precision", None) == 0 or (isinstance(block, gr.Slider) and
                                                            not isinstance(block, AlphaSlider) and
                                                            float(block.step or 0).is_integer() and
                                                            float(block.minimum or 0).is_integer())
        low = None if isinstance(block, AlphaSlider) else block.minimum
        high = None if isinstance(block, AlphaSlider) else block.maximum
        number(value, what, integer=whole, low=low, high=high)
    elif isinstance(block, gr.Checkbox):
        flag(value, what)
    elif isinstance(block, (gr.Dropdown, gr.Radio)):
        if value is None or value == []:
            return
        if getattr(block, "allow_custom_value", False):
            checked_text(value, what, MAX_CHOICE_CHARS, allow_empty=True)
        elif getattr(block, "multiselect", False) or value not in _choices(block):
            raise UserError("not_a_choice", what=what, value=str(value)[:40])
    elif isinstance(block, gr.Textbox):
        checked_text(value, what, MAX_TEXT_CHARS, allow_empty=True)


# Inputs an API client may leave off the end of its call (the page always sends them): a later feature's input
# added after an endpoint's others, e.g. Explore's added vectors, so calls written before it keep working.
OPTIONAL_TRAILING = "steer_optional_trailing"  # the mark, an attribute of the block itself


def optional_trailing(block):
    """Mark ``block`` as an input a call may leave off the end (its default stands in); returns it."""
    setattr(block, OPTIONAL_TRAILING, True)
    return block


def check_inputs(block_fn, inputs: list, state, lang: str) -> list:
    """``inputs`` checked against the event's blocks, with left-off optional trailing inputs at their defaults."""
    blocks = list(getattr(block_fn, "inputs", []) or [])
    if len(inputs) < len(blocks):
        missing = blocks[len(inputs):]
        if not all(getattr(block, OPTIONAL_TRAILING, False) for block in missing):
            raise UserError("wrong_inputs", needed=len(blocks), got=len(inputs))
        inputs = list(inputs) + [block.value for block in missing]
    for block, value in zip(blocks, inputs):
        try:
            current = state[block._id] if state is not None and block._id in state else block
        except (KeyError, TypeError):
            current = block
        check_value(current, value, field_label(current, lang))
    return inputs


def check_event_data(block_fn, event_data) -> None:
    """Refuse a call of a select handler (a table row, a token) that sends no selection: gradio reads the event's
    index out of nothing, and the client got "something went wrong" (a hostile probe)."""
    fn = getattr(block_fn, "fn", None)
    if fn is None or getattr(event_data, "_data", None) is not None:
        return
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # noqa: BLE001 - an annotation this cannot read: gradio reads it its own way
        return
    if any(isinstance(hint, type) and issubclass(hint, gr.SelectData) for hint in hints.values()):
        raise UserError("bad_input", what="event data", detail="no selection was sent")


def _admit(backend, session: str, request, unseen: bool) -> None:
    """The caller's session admitted.  "Your session expired" is said once, by the first event after the server
    forgot the page's work; a page's unqueued event (``unseen``) could show it only as a wordless red pill (gradio
    sends no toast outside the queue), so that event runs on the new session and its next queued event says it."""
    s = backend.session(session, client_address(request), say_expired=not unseen)
    if s.untold is not None and not unseen:
        told, s.untold = s.untold, None
        raise told


def install(demo: gr.Blocks, backend) -> None:
    """Wrap ``demo.process_api``: admission, input checks, and one plain line for every failure."""
    original = demo.process_api

    async def process_api(block_fn, inputs, state=None, request=None, iterator=None, *args, **kwargs):
        first = request[0] if isinstance(request, list) else request
        try:
            if iterator is None:  # the event's first call (a streaming generator comes back with its iterator)
                session = sid(first)
                if session is not None and first is not None:
                    _admit(backend, session, first, unseen=from_page(first) and kwargs.get("event_id") is None)
                    token = _header(first, OWNER_HEADER)
                    if token:  # an API client names its owner on every call; a token that is none keeps nothing
                        backend.claim_owner(session, token, client_address(first), issue=False)
                lang = backend.language(session) if session is not None else "en"
                if not isinstance(block_fn, int):
                    inputs = check_inputs(block_fn, list(inputs or []), state, lang)
                    check_event_data(block_fn, kwargs.get("event_data"))
            try:
                return await original(block_fn, inputs, state, request, iterator, *args, **kwargs)
            finally:
                forget_stray_blocks(state, demo)
        except gr.Error:
            raise
        except (ComponentProcessingError, ValidationError):  # a payload gradio's own data model refused
            raise as_gr_error(backend, first, UserError("bad_input", what="input", detail=UNREADABLE)) from None
        except Exception as exc:  # noqa: BLE001 - nothing leaves as a traceback or a type name
            raise as_gr_error(backend, first, exc) from None

    demo.process_api = process_api


def forget_stray_blocks(state, demo: gr.Blocks) -> None:
    """Drop what a session's copy of the page holds beyond the page's own blocks.

    Gradio answers ``gr.skip()`` or ``gr.update(...)`` for an output by keeping a new instance of its component in
    the session (under the output's id, the instance itself under a fresh id of its own); the next plain value for
    that output then files the instance under its own id too.  So a generation, whose frames skip the plots and
    tables until its last, left three more components with their values in its session every time: ~0.4 MB a
    64-token generation on the tiny model, for as long as the session lives (hours: the app holds no heartbeat).
    This app renders nothing at run time (no ``gr.render``), so every block a session may have is one of the
    page's."""
    config = getattr(state, "blocks_config", None)
    blocks = getattr(config, "blocks", None)
    if not isinstance(blocks, dict) or len(blocks) <= len(demo.blocks):
        return
    for key in [k for k in blocks if k not in demo.blocks]:
        blocks.pop(key, None)
        getattr(state, "config_values", {}).pop(key, None)


def stream_limits(policy: Policy) -> dict:
    """:class:`RequestLimits`' caps on open event streams under ``policy``: a page holds at most two (heartbeat,
    results), for as many pages as an address may keep, and as the server keeps."""
    return {"streams_per_address": 2 * policy.sessions_per_address, "streams": 2 * policy.max_sessions}


MAX_TARGET_CHARS = 16 * 1024  # a request's path and query: the app's own links hold ~2,000 (url_state.MAX_LINK_CHARS)


class RequestLimits:
    """ASGI middleware: what a request is refused for before gradio reads it, each with one line (JSON), in the
    language the client's ``Accept-Language`` asks for first.

    * a POST body over ``limit`` bytes (413): file uploads go through gradio's ``/upload`` route, bounded by
      ``--max-file-size``; every other body is JSON of a few kilobytes, so a multi-gigabyte one is an attack on
      the server's memory;
    * a path and query over :data:`MAX_TARGET_CHARS` (414): gradio parsed a 70,000-character one into a URL of
      its own, which refused it past 65,536 (a 500 and a traceback in the log);
    * names and numbers beside an event's inputs that gradio would trip over (:mod:`.route_checks`);
    * an event stream (heartbeat, results) past ``streams_per_address`` open from one client address, or
      ``streams`` from all (429): gradio holds a heartbeat open for any session name, for as long as the client
      stays, so one address could hold every connection the server has.
    """

    def __init__(self, app, limit: int, streams_per_address: int | None = None, streams: int | None = None):
        self.app, self.limit = app, int(limit)
        default = stream_limits(Policy())
        self.streams_per_address = int(default["streams_per_address"] if streams_per_address is None
                                       else streams_per_address)
        self.streams = int(default["streams"] if streams is None else streams)
        self._open: dict[str, int] = {}  # open event streams by client address (one event loop: no lock)

    async def __call__(self, scope, receive, send):
        if scope.get("type") != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        target = len(scope.get("raw_path") or path.encode()) + len(scope.get("query_string") or b"")
        if target > MAX_TARGET_CHARS:
            return await _refuse(send, scope, 414, "url_too_long", size=target, limit=MAX_TARGET_CHARS)
        if scope.get("method") != "POST":
            if (refused := route_checks.refusal(scope)):
                return await _refuse(send, scope, refused[0], refused[1], **refused[2])
            if route_checks.is_stream(scope):
                return await self._stream(scope, receive, send)
            return await self.app(scope, receive, send)
        if path.endswith("/upload"):
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            return await self._too_large(send, int(declared), scope)
        chunks, size, more = [], 0, True
        while more:  # read the body here, within the limit, and hand gradio a replay of it
            message = await receive()
            if message["type"] != "http.request":
                return await self.app(scope, _replay([], message), send)
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.limit:
                return await self._too_large(send, size, scope)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        if (refused := route_checks.refusal(scope, body)):
            return await _refuse(send, scope, refused[0], refused[1], **refused[2])
        return await self.app(scope, _replay([body], None, receive), send)

    async def _stream(self, scope, receive, send) -> None:
        """An event stream, counted while it is open."""
        address = (scope.get("client") or ("?",))[0]
        if self._open.get(address, 0) >= self.streams_per_address:
            return await _refuse(send, scope, 429, "too_many_streams", limit=self.streams_per_address)
        if sum(self._open.values()) >= self.streams:
            return await _refuse(send, scope, 503, "server_streams_full", limit=self.streams)
        self._open[address] = self._open.get(address, 0) + 1
        try:
            await self.app(scope, receive, send)
        finally:
            self._open[address] -= 1
            if not self._open[address]:
                del self._open[address]

    async def _too_large(self, send, size: int, scope) -> None:
        await _refuse(send, scope, 413, "body_too_large", size=f"{size / 2**20:.1f}", limit=f"{self.limit / 2**20:g}")


async def _refuse(send, scope, status: int, key: str, **params) -> None:
    import json

    accepted = dict(scope.get("headers") or []).get(b"accept-language", b"").decode("latin-1")
    text = i18n.message(i18n.normalise_lang(accepted.split(",")[0].strip()), key, **params)
    # /v1's clients read OpenAI's error object (docs/api.md); gradio's read FastAPI's detail
    body = json.dumps({"error": {"message": text, "type": "invalid_request_error", "param": None, "code": key}}
                      if scope.get("path", "").startswith("/v1/") else {"detail": text}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def _replay(bodies: list[bytes], last, receive=None):
    """A ``receive`` that first returns ``bodies`` as one request body (or ``last``), then the real stream."""
    sent = False

    async def replayed():
        nonlocal sent
        if not sent:
            sent = True
            if last is not None:
                return last
            return {"type": "http.request", "body": bodies[0] if bodies else b"", "more_body": False}
        return await receive() if receive is not None else {"type": "http.disconnect"}

    return replayed
