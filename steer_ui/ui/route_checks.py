"""What a request to one of gradio's own routes names, checked before gradio reads it.

Gradio trusts the names and numbers a client sends beside an event's inputs.  A hostile probe found each of
these a 500 with a traceback in the log, or worse:

* a session name holding a lone surrogate: gradio keeps it in its event records, and from then on the summary
  it computes after every event raised, a traceback per event for everyone; one with a NUL: gradio built a URL
  of it when the heartbeat closed;
* a function number out of range (a KeyError), NaN or 1e999, a trigger id with a lone surrogate: the 422 that
  echoes the value back could not be encoded;
* ``/call/<name>`` (also ``/run``, ``/api``) for a name no endpoint has, ``/call/v2`` without one; the results
  stream of ``/call/<name>/<event>`` for an event nobody queued, and ``/queue/data`` for a session with nothing
  queued: gradio started the stream before it looked, so the client read a cut answer.

:func:`refusal` says why such a request is refused (a status, a message key and its values) or ``None``.  The
event's inputs themselves (``data``) are not looked at here: :mod:`.request_guard` checks them against their
fields and names the field in its refusal.
"""
from __future__ import annotations

import json
import math
import re
from urllib.parse import parse_qs

from ..messages import Said

# What gradio's clients make: the page a base-36 random string, gradio_client a UUID; a proxy, or a hand-written
# client, anything of these characters.
SESSION_NAME = re.compile(r"[A-Za-z0-9_-]{1,128}\Z")
EVENT_ID = SESSION_NAME  # gradio's event ids are hex UUIDs
MAX_API_NAME = 200

# Routes whose JSON body names an event: the part of the path after gradio's prefix.
_JOIN, _CANCEL = "queue/join", "cancel"
_NAMED = ("call/v2/", "call/", "run/", "api/")  # followed by an endpoint's name; v2 first: "call/" is its prefix
_PREFIX = "/gradio_api/"


def route(scope) -> str | None:
    """The part of the request's path after gradio's API prefix, or ``None`` outside it."""
    path = scope.get("path", "")
    at = path.find(_PREFIX)
    return path[at + len(_PREFIX):].rstrip("/") if at >= 0 else None


def is_stream(scope) -> bool:
    """Whether the request opens one of gradio's event streams (GET, held open until it ends)."""
    tail = route(scope)
    if scope.get("method") != "GET" or tail is None:
        return False
    return tail.startswith("heartbeat/") or tail == "queue/data" or _results_stream(tail) is not None


def _results_stream(tail: str) -> tuple[str, str] | None:
    """(endpoint name, event id) where ``tail`` is ``call/[v2/]<name>/<event>``, the results stream of one event."""
    if not tail.startswith("call/"):
        return None
    parts = tail[len("call/"):].split("/")
    if parts[0] == "v2":
        parts = parts[1:]
    return (parts[0], parts[1]) if len(parts) == 2 else None


def refusal(scope, body: bytes | None = None) -> tuple[int, str, dict] | None:
    """Why this request must not reach gradio: ``(status, message key, values)``, or ``None`` to let it through.
    ``body``: a POST's whole body (already bounded in size)."""
    tail = route(scope)
    if tail is None:
        return None
    blocks = getattr(scope.get("app"), "blocks", None)
    if scope.get("method") == "GET":
        return _get_refusal(tail, scope, blocks)
    if scope.get("method") == "POST" and body is not None and _takes_event(tail):
        return _body_refusal(tail, body, blocks)
    return None


def _takes_event(tail: str) -> bool:
    return tail in (_JOIN, _CANCEL) or any(tail.startswith(p) for p in _NAMED)


def _get_refusal(tail: str, scope, blocks) -> tuple[int, str, dict] | None:
    if tail.startswith("heartbeat/"):
        return _session_refusal(tail[len("heartbeat/"):])
    if tail == "queue/data":
        return _queued_refusal(scope, blocks)
    if (stream := _results_stream(tail)) is not None:
        return _api_refusal(stream[0], blocks) or _event_refusal(stream[1], blocks)
    return None


def _session_refusal(name) -> tuple[int, str, dict] | None:
    if isinstance(name, str) and SESSION_NAME.match(name):
        return None
    return 400, "bad_session_name", {"value": _shown(name)}


def _queued_refusal(scope, blocks) -> tuple[int, str, dict] | None:
    """A results stream needs exactly one session name, one with events in gradio's queue."""
    queue = getattr(blocks, "_queue", None)
    pending = getattr(queue, "pending_messages_per_session", None)
    try:
        named = parse_qs((scope.get("query_string") or b"").decode("latin-1")).get("session_hash", [])
    except ValueError:
        named = []
    if len(named) == 1 and (refused := _session_refusal(named[0])):
        return refused
    if pending is None:  # an app without gradio's queue answers such requests itself
        return None
    # exactly one: this read the first of two and gradio the last, which let an unknown one through
    if len(named) != 1 or named[0] not in pending:
        return 404, "no_queued_events", {}
    return None


def _api_refusal(name: str, blocks) -> tuple[int, str, dict] | None:
    fns = getattr(blocks, "fns", None)
    if fns is None:
        return None
    if name and len(name) <= MAX_API_NAME and any(fn.api_name == name for fn in fns.values()):
        return None
    return 404, "no_such_endpoint", {"name": _shown(name)}


def _event_refusal(event_id: str, blocks) -> tuple[int, str, dict] | None:
    queue = getattr(blocks, "_queue", None)
    if queue is None:
        return None
    if EVENT_ID.match(event_id) and (event_id in queue.event_ids_to_events or
                                     any(event_id in ids for ids in queue.pending_event_ids_session.values())):
        return None
    return 404, "no_such_event", {"value": _shown(event_id)}


def _body_refusal(tail: str, body: bytes, blocks) -> tuple[int, str, dict] | None:
    try:
        sent = json.loads(body)
    except (ValueError, RecursionError):
        return 400, "body_not_json", {}
    if not isinstance(sent, dict):
        return 400, "body_not_json", {}
    if tail.startswith("call/v2/"):  # its body's keys are the endpoint's parameters: inputs, checked as such
        return _keywords_refusal(tail[len("call/v2/"):], sent, blocks)
    prefix = next((p for p in _NAMED if tail.startswith(p)), None)
    # /run and /api find the function by its number where the body gives one (the name is then any word:
    # gradio's own clients send "predict"), /call by the endpoint's name
    if prefix is not None and (prefix == "call/" or sent.get("fn_index") is None):
        if (refused := _api_refusal(tail[len(prefix):], blocks)):
            return refused
    for key, value in sent.items():
        if key == "data":
            continue  # each input is checked against its field (request_guard.check_inputs), which it names
        if (bad := _unencodable(value)) is not None:
            return 400, "bad_request_field", {"field": _shown(key), "why": bad}
    if "session_hash" in sent and (sent["session_hash"] is not None or tail in (_JOIN, _CANCEL)):
        if (refused := _session_refusal(sent["session_hash"])):
            return refused
    if tail in (_JOIN, _CANCEL) or (prefix in ("run/", "api/") and sent.get("fn_index") is not None):
        if (refused := _function_refusal(sent.get("fn_index"), blocks)):
            return refused
    trigger = sent.get("trigger_id")
    if trigger is not None and (isinstance(trigger, bool) or not isinstance(trigger, int) or abs(trigger) > 2**53):
        return 400, "bad_request_field", {"field": "trigger_id", "why": Said("why_not_whole")}
    if tail == _CANCEL and not (isinstance(sent.get("event_id"), str) and EVENT_ID.match(sent["event_id"])):
        return 400, "bad_request_field", {"field": "event_id", "why": Said("why_not_an_id")}
    if sent.get("batched"):  # no function of this app takes a batch
        return 400, "bad_request_field", {"field": "batched", "why": Said("why_no_batches")}
    return None


def _keywords_refusal(name: str, sent: dict, blocks) -> tuple[int, str, dict] | None:
    """``/call/v2/<name>`` takes the endpoint's inputs by their parameters' names (gradio's API page lists them);
    gradio raised on a name it does not know or a required one left out."""
    endpoint = _api_info(blocks).get("named_endpoints", {}).get("/" + name)
    if endpoint is None:  # an endpoint kept off the API page has no parameter names
        return 404, "no_such_endpoint", {"name": _shown(name)}
    parameters = endpoint.get("parameters", [])
    known = [p["parameter_name"] for p in parameters if "parameter_name" in p]
    for key in sent:
        if key not in known and key != "oauth_token":
            return 400, "unknown_parameter", {"name": _shown(key), "known": ", ".join(known)}
    for parameter in parameters:
        if not parameter.get("parameter_has_default") and parameter.get("parameter_name") not in sent:
            return 400, "missing_parameter", {"name": parameter.get("parameter_name", "?")}
    return None


def _api_info(blocks) -> dict:
    """Gradio's description of the endpoints (what its API page shows), made once per app."""
    info = getattr(blocks, "_steer_api_info", None)
    if info is None:
        info = blocks.get_api_info() if blocks is not None else {}
        try:
            blocks._steer_api_info = info
        except AttributeError:
            pass
    return info


def _function_refusal(index, blocks) -> tuple[int, str, dict] | None:
    fns = getattr(blocks, "fns", None)
    if isinstance(index, int) and not isinstance(index, bool) and (fns is None or index in fns):
        return None
    return 400, "no_such_function", {"value": _shown(index)}


def _unencodable(value, depth: int = 0) -> Said | None:
    """Why ``value`` could not be written back as JSON text (gradio's 422 answers echo it), or ``None``."""
    if depth > 32:
        return Said("why_too_deep")
    if isinstance(value, float) and not math.isfinite(value):
        return Said("why_not_finite")
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return Said("why_lone_surrogate")
        return None
    if isinstance(value, dict):
        value = [*value.keys(), *value.values()]
    if isinstance(value, list):
        for item in value:
            if (bad := _unencodable(item, depth + 1)) is not None:
                return bad
    return None


def _shown(value) -> str:
    """``value`` as a refusal may show it: short, and text that can be encoded."""
    text = value if isinstance(value, str) else json.dumps(value) if _unencodable(value) is None else repr(value)
    return text[:40].encode("utf-8", "backslashreplace").decode("utf-8")
