"""OpenAI's request bodies, read and bounded (issue #49): what ``/v1/completions`` and ``/v1/chat/completions``
take, as plain values, before anything reaches the door.

Fields follow OpenAI's API (and vLLM's extensions ``top_k``, ``repetition_penalty``); steering follows EasySteer's
OpenAI server: a top-level ``steering`` object (the SDK sends it with ``extra_body``), or the same spec as a JSON
string under ``vllm_xargs.steering`` for clients that can send only scalars.  ``compare: true`` asks for the
unsteered side as well.  Anything malformed is an :class:`ApiError` naming the field; a field this server does
not take is refused rather than silently ignored, except those whose value changes nothing here.
"""
from __future__ import annotations

import json
import math
import secrets
from dataclasses import dataclass
from typing import Any

from ..messages import encodable

MAX_CHOICES = 8  # n: each choice is one more request in the decode batch
MAX_LOGPROBS_COMPLETIONS = 5  # OpenAI's bound for /v1/completions' logprobs
MAX_TOP_LOGPROBS = 20  # ... and for chat's top_logprobs
MAX_MODEL_CHARS = 200


class ApiError(Exception):
    """A refusal in OpenAI's error shape: HTTP ``status``, ``message``, ``type``, ``param``, ``code``."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error"):
        # a client's own text echoed back (a key, a value): a lone surrogate in it made the answer fail to encode
        # (a 500 and a traceback)
        message, param = encodable(message), None if param is None else encodable(param)
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclass
class Generation:
    """One request's settings, read: ``prompt`` (completions) or ``messages`` (chat)."""

    model: str
    prompt: str | None
    messages: list | None
    steering: Any  # the spec as sent (the door reads it); None: unsteered
    max_tokens: int | None
    temperature: float
    top_p: float
    top_k: int
    repetition_penalty: float
    n: int
    stream: bool
    include_usage: bool
    stop: list
    seed: int
    logprobs: bool
    top_logprobs: int
    compare: bool


# fields accepted with any value because they change nothing here, and those accepted at their neutral value only
IGNORED = {"user", "metadata", "store", "service_tier", "parallel_tool_calls"}
NEUTRAL = {"presence_penalty": 0, "frequency_penalty": 0, "best_of": 1, "echo": False, "suffix": None,
           "logit_bias": None, "tools": None, "tool_choice": None, "response_format": None}
COMMON = {"model", "steering", "vllm_xargs", "compare", "max_tokens", "temperature", "top_p", "top_k",
          "repetition_penalty", "n", "stream", "stream_options", "stop", "seed", "logprobs"}
COMPLETION_FIELDS = COMMON | {"prompt"}
CHAT_FIELDS = COMMON | {"messages", "max_completion_tokens", "top_logprobs"}


def _number(body: dict, name: str, default, low: float, high: float, integer: bool = False):
    value = body.get(name, default)
    if value is None:
        return default
    # an integer of hundreds of digits is no float (math.isfinite raised OverflowError on it): compared as it is
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or (isinstance(value, float) and (not math.isfinite(value) or (integer and not value.is_integer()))):
        raise ApiError(400, f"'{name}' must be {'an integer' if integer else 'a number'}, got {str(value)[:40]!r}",
                       name)
    if not low <= value <= high:
        raise ApiError(400, f"'{name}' must be between {low:g} and {high:g}, got {str(value)[:40]}", name)
    return int(value) if integer else float(value)


def _flag(body: dict, name: str, default: bool = False) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ApiError(400, f"'{name}' must be true or false", name)
    return value


def _steering(body: dict) -> Any:
    """The spec from ``steering`` or ``vllm_xargs.steering``; None when the request asks for no steering."""
    xargs = body.get("vllm_xargs")
    if xargs is not None and not isinstance(xargs, dict):
        raise ApiError(400, "'vllm_xargs' must be an object", "vllm_xargs")
    from_xargs = (xargs or {}).get("steering")
    if body.get("steering") is not None and from_xargs is not None:
        raise ApiError(400, "give the steering once: 'steering' or 'vllm_xargs.steering'", "steering")
    if from_xargs is not None:
        if not isinstance(from_xargs, str):
            raise ApiError(400, "'vllm_xargs.steering' must be the spec as a JSON string", "vllm_xargs")
        try:
            return json.loads(from_xargs)
        except json.JSONDecodeError as exc:
            raise ApiError(400, f"'vllm_xargs.steering' is not valid JSON (at character {exc.pos})",
                           "vllm_xargs") from None
        except (ValueError, RecursionError):  # a number of thousands of digits, deep nesting (a 500: a hostile probe)
            raise ApiError(400, "'vllm_xargs.steering' is not JSON this server reads (too deep, or a number too "
                                "long)", "vllm_xargs") from None
    return body.get("steering")


# the spec's numeric fields (and their aliases): JSON numbers only over HTTP, where the page's and the CLI's
# parser also reads numbers typed as text; a client that sends "0.3" has a bug the answer should show
SPEC_NUMBERS = ("scale", "alpha", "coefficient", "seed", "layers", "layer")


def _typed_spec(spec: Any) -> Any:
    """``spec`` unchanged when every numeric field of every term is a JSON number (the shape itself is the
    door's to check); a 400 naming the term and field otherwise."""
    terms = spec.get("vectors") if isinstance(spec, dict) else None
    for n, term in enumerate(terms if isinstance(terms, list) else [], start=1):
        for name in SPEC_NUMBERS if isinstance(term, dict) else ():
            value = term.get(name)
            values = value if name in ("layers", "layer") and isinstance(value, list) else [value]
            bad = [v for v in values if value is not None and (isinstance(v, bool) or not isinstance(v, (int, float)))]
            if bad:
                raise ApiError(400, f"steering term {n}: '{name}' must be a number, not {type(bad[0]).__name__}",
                               "steering", "number_not_a_number")  # the door's code for the same refusal
    return spec


def read(body: Any, chat: bool, max_new_tokens: int) -> Generation:
    """A request body (parsed JSON) as a :class:`Generation`; ``max_new_tokens``: the server's bound."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    allowed = CHAT_FIELDS if chat else COMPLETION_FIELDS
    for key, value in body.items():
        if key in allowed or key in IGNORED:
            continue
        if key in NEUTRAL:
            if value not in (NEUTRAL[key], None, [], {}):
                raise ApiError(400, f"'{key}' is not supported by this server", key, "unsupported_parameter")
            continue
        raise ApiError(400, f"unknown field '{str(key)[:40]}'", str(key)[:40], "unknown_parameter")
    model = body.get("model")
    if not isinstance(model, str) or not model.strip() or len(model) > MAX_MODEL_CHARS:
        raise ApiError(400, "'model' must name the served model (GET /v1/models lists it)", "model")
    prompt = messages = None
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, "'messages' must be a non-empty list of {role, content}", "messages")
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]  # one prompt in a list, as some clients send it
        if not isinstance(prompt, str):
            raise ApiError(400, "'prompt' must be a string (one prompt per request here)", "prompt")
    token_field = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _number(body, token_field, None, 1, max_new_tokens, integer=True)
    if max_tokens is None and not chat:
        max_tokens = 16  # OpenAI's default for completions; chat's is "until the turn ends", bounded by the server
    stop = body.get("stop")
    stop = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or len(stop) > 4 or not all(isinstance(s, str) and 0 < len(s) <= 200 for s in stop):
        raise ApiError(400, "'stop' must be a string or a list of up to 4 non-empty strings", "stop")
    options = body.get("stream_options")
    if options is not None and (not isinstance(options, dict) or set(options) - {"include_usage"}):
        raise ApiError(400, "'stream_options' takes only include_usage", "stream_options")
    if chat:
        logprobs = _flag(body, "logprobs")
        top = _number(body, "top_logprobs", 0, 0, MAX_TOP_LOGPROBS, integer=True)
        if top and not logprobs:
            raise ApiError(400, "'top_logprobs' needs 'logprobs': true", "top_logprobs")
    else:  # completions: logprobs is the number of alternatives (0 = only the sampled token's)
        top = _number(body, "logprobs", None, 0, MAX_LOGPROBS_COMPLETIONS, integer=True)
        logprobs, top = top is not None, top or 0
    seed = _number(body, "seed", None, 0, 2 ** 63 - 1, integer=True)
    return Generation(
        model=model, prompt=prompt, messages=messages, steering=_typed_spec(_steering(body)),
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", 1.0, 0, 2), top_p=_number(body, "top_p", 1.0, 1e-9, 1),
        top_k=max(0, _number(body, "top_k", 0, -1, 1 << 20, integer=True)),  # vLLM's -1 = off, as is 0 here
        repetition_penalty=_number(body, "repetition_penalty", 1.0, 1e-3, 100),
        n=_number(body, "n", 1, 1, MAX_CHOICES, integer=True), stream=_flag(body, "stream"),
        include_usage=_flag(options or {}, "include_usage"), stop=stop,
        seed=seed if seed is not None else secrets.randbelow(2 ** 31), logprobs=logprobs, top_logprobs=top,
        compare=_flag(body, "compare"))
