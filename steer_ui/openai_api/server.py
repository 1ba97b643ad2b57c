"""``/v1`` on the app's own server, in OpenAI's shape (issue #49): a front over the door, like the page and the CLI.

* ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions`` (chat through the model's chat
  template, :mod:`steer_ui.chat`), whole or streamed (server-sent events ending ``data: [DONE]``);
* each request steers with its own spec (``steering``, EasySteer's vocabulary) and joins the one decode batch the
  page's generations share, so eight clients with eight steerings decode together and each gets its solo answer;
* ``compare: true`` adds the unsteered side from the same batched steps; log-probabilities carry each steered
  token's Δlogit;
* refusals are OpenAI's error object with a 4xx status (never a silently unsteered answer); a client that goes
  away mid-stream frees its rows at the next step.

Who may call: with ``--api-key`` or ``--auth`` set, a request needs ``Authorization: Bearer <key>`` (a key, or
``user:password`` of ``--auth``); without either, anyone who reaches the server, as for the page.  A request may
name its owner with ``X-Steer-Owner`` to steer with that owner's vectors; share ids work for anyone.
"""
from __future__ import annotations

import dataclasses
import hmac
import json
import logging
import threading
import time
import uuid
from collections import Counter
from typing import Any, Iterator

from fastapi import Request  # at module level: the routes' annotations are read from here (postponed evaluation)

from ..policy import ANONYMOUS_PREFIX
from ..service import Service, UserError  # the door: this front calls nothing behind it
from . import answers
from .requests import ApiError, Generation, read

log = logging.getLogger(__name__)

OWNER_HEADER = "x-steer-owner"
# a refusal's status by the door's message key (the rest are 400): unknown things 404, a full house 429/503
STATUS = {"unknown_vector": 404, "busy": 429, "session_busy": 429, "too_many_sessions": 429, "no_model": 503,
          "model_load_failed": 503, "generation_timeout": 503}
RETRY_AFTER_SECONDS = 1  # a place in the batch frees at the next decode step; a second is ample


def install(app, backend: Service, api_keys=(), passwords=()) -> None:
    """Add ``/v1`` to a running server's app (gradio's FastAPI app after ``launch``)."""
    app.include_router(router(backend, api_keys, passwords))


def router(backend: Service, api_keys=(), passwords=()):
    from fastapi import APIRouter
    from fastapi.responses import JSONResponse, StreamingResponse

    api = APIRouter(prefix="/v1")
    keys = [k for k in api_keys if k] + [f"{user}:{password}" for user, password in passwords or ()]
    in_flight: Counter = Counter()
    lock = threading.Lock()
    limit = max(8, backend.policy.requests_per_session)  # requests one address, or one owner, may have at once

    def error(exc: ApiError) -> JSONResponse:
        # a busy server says when to come back, as OpenAI's does; clients (the SDK) wait that long and retry
        retry = {"Retry-After": str(RETRY_AFTER_SECONDS)} if exc.status in (429, 503) else None
        return JSONResponse(exc.body(), status_code=exc.status, headers=retry)

    def check_key(request: Request) -> None:
        if not keys:
            return
        given = request.headers.get("authorization", "")
        token = given[7:].strip() if given.lower().startswith("bearer ") else ""
        if not any(hmac.compare_digest(token.encode(), key.encode()) for key in keys):
            raise ApiError(401, "a valid API key is needed: Authorization: Bearer <key>", code="invalid_api_key",
                           kind="authentication_error")

    async def body_of(request: Request) -> Any:
        from starlette.requests import ClientDisconnect

        try:  # the body's size is bounded before this (ui.request_guard.RequestLimits, policy.max_body_bytes)
            raw = await request.body()
        except ClientDisconnect:  # gone mid-body: nobody reads the answer, and it is no server error to log (a
            # traceback per such request was a cheap log flood: a hostile probe)
            raise ApiError(400, "the client closed the connection before the request's body ended") from None
        try:
            return json.loads(raw)
        except (ValueError, RecursionError):  # not JSON, not UTF-8, a number of thousands of digits, deep nesting
            raise ApiError(400, "the request body is not valid JSON") from None

    def refusal(exc: UserError) -> ApiError:
        status = STATUS.get(exc.key, 400)
        return ApiError(status, str(exc).splitlines()[0], "steering" if exc.key.startswith("steering") or
                        exc.key == "unknown_vector" else None, exc.key,
                        "rate_limit_error" if status == 429 else "invalid_request_error")

    def check_ready() -> None:
        # while the model loads (the bundled vectors with it) a named source would read as unknown: say why
        if not backend.model_ready:
            raise ApiError(503, "the model is still loading: try again shortly", code="model_loading",
                           kind="server_error")

    @api.get("/models")
    def models(request: Request):
        try:
            check_key(request)
            check_ready()
        except ApiError as exc:
            return error(exc)
        return {"object": "list", "data": [{"id": backend.handle.model_id, "object": "model", "created": 0,
                                            "owned_by": "steer_ui"}]}

    async def generation(request: Request, chat: bool):
        from starlette.concurrency import run_in_threadpool

        address = getattr(request.client, "host", None)
        try:
            check_key(request)
            check_ready()
            # an owner token sent from many addresses is still one owner: both are capped
            owner = request.headers.get(OWNER_HEADER)
            holders = [("address", address)] + ([("owner", owner[:200])] if owner else [])
            with lock:
                full = [kind for kind, key in holders if in_flight[(kind, key)] >= limit]
                if full:
                    raise ApiError(429, f"at most {limit} requests at once from one {full[0]}", code="busy",
                                   kind="rate_limit_error")
                for holder in holders:
                    in_flight[holder] += 1
        except ApiError as exc:
            return error(exc)
        release = _once(lambda: _release(lock, in_flight, holders))
        try:
            gen = read(await body_of(request), chat, backend.policy.max_new_tokens)
            job = await run_in_threadpool(_start, backend, gen, chat, address, request.headers.get(OWNER_HEADER))
        except ApiError as exc:
            release()
            return error(exc)
        except UserError as exc:
            release()
            return error(refusal(exc))
        except Exception as exc:  # noqa: BLE001 - a request that broke something unforeseen still frees its place
            release()  # (before this, eight such requests held an address's places until a restart)
            log.error("unexpected error in an API request", exc_info=exc)
            return error(ApiError(500, "something went wrong on the server (it is logged there)",
                                  code="internal_error", kind="server_error"))
        if gen.stream:
            return StreamingResponse(_sse(job, release, refusal), media_type="text/event-stream")
        try:
            return await run_in_threadpool(job.whole)
        except UserError as exc:
            return error(refusal(exc))
        except Exception as exc:  # noqa: BLE001 - one line in OpenAI's shape, the traceback in the log
            log.error("unexpected error in an API request", exc_info=exc)
            return error(ApiError(500, "something went wrong on the server (it is logged there)",
                                  code="internal_error", kind="server_error"))
        finally:
            job.close()
            release()

    @api.post("/completions")
    async def completions(request: Request):
        return await generation(request, chat=False)

    @api.post("/chat/completions")
    async def chat_completions(request: Request):
        return await generation(request, chat=True)

    return api


def _release(lock, in_flight: Counter, holders) -> None:
    with lock:
        for holder in holders:
            in_flight[holder] -= 1
            if in_flight[holder] <= 0:
                del in_flight[holder]


def _once(fn):
    done = []

    def call():
        if not done:
            done.append(True)
            fn()
    return call


@dataclasses.dataclass
class Job:
    """One API request at the door: its choices' frame streams (one generation each, submitted together so
    they decode in one batch) and what the answer needs to say."""

    gen: Generation
    chat: bool
    model: str
    streams: list
    prompt_tokens: int = 0
    applied: dict | None = None
    ident: str = ""
    created: int = 0

    def close(self) -> None:
        for stream in self.streams:  # a stream closed early drops its rows at the next decode step
            stream.close()

    def frames(self) -> Iterator[list]:
        """The newest frame of every choice, each time one of them moves on; the last yield has them all done."""
        latest = [None] * len(self.streams)
        live = set(range(len(self.streams)))
        while live:
            for i in sorted(live):
                try:
                    latest[i] = next(self.streams[i])
                except StopIteration:
                    live.discard(i)
            yield latest

    def head(self, obj: str) -> dict:
        head = {"id": self.ident, "object": obj, "created": self.created, "model": self.model}
        if self.applied is not None:
            head["steering"] = self.applied
        return head

    def whole(self) -> dict:
        last = None
        for last in self.frames():
            pass
        g, choices, completion = self.gen, [], 0
        for n, frame in enumerate(last):
            for k, (side, text, tokens, finished) in enumerate(answers.sides(frame, g.compare)):
                index = n + k * g.n  # the steered choices first, then their unsteered sides
                choices.append(answers.choice(index, side, text, tokens, finished, self.chat, g.logprobs,
                                              g.top_logprobs))
                completion += len(tokens)
        choices.sort(key=lambda c: c["index"])
        return {**self.head("chat.completion" if self.chat else "text_completion"), "choices": choices,
                "usage": answers.usage(self.prompt_tokens, completion)}


def _start(backend: Service, gen: Generation, chat: bool, address, owner: str | None) -> Job:
    """Resolve the request at the door (its prompt, steering and sampling) and submit every choice."""
    sessions = []
    for _ in range(gen.n):  # a choice each: a session's places in the batch are few (policy.generations_per_session)
        session = ANONYMOUS_PREFIX + uuid.uuid4().hex
        backend.session(session, address)
        if owner:
            backend.claim_owner(session, owner, address, issue=False)
        sessions.append(session)
    prompt = backend.chat_prompt(gen.messages) if chat else gen.prompt
    steering = gen.steering if gen.steering is not None else {"vectors": [{"source": "random", "scale": 0}]}
    applied = backend.applied(sessions[0], steering) if gen.steering is not None else None
    sampling = backend.sampling(max_new_tokens=gen.max_tokens or backend.policy.max_new_tokens,
                                temperature=gen.temperature, top_k=gen.top_k, top_p=gen.top_p,
                                repetition_penalty=gen.repetition_penalty, seed=gen.seed,
                                greedy=gen.temperature == 0, stop=gen.stop,
                                alternatives=max(gen.top_logprobs, 1),
                                # only the rows the answer shows: the unsteered side for compare, the
                                # counterfactual row for log-probabilities' Δlogit (issue #49)
                                unsteered=gen.compare, counterfactual=gen.logprobs)
    streams = [backend.stream_generate_for(s, prompt, steering, dataclasses.replace(sampling, seed=sampling.seed + i))
               for i, s in enumerate(sessions)]
    job = Job(gen=gen, chat=chat, model=backend.handle.model_id, streams=streams, applied=applied,
              ident=("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex, created=int(time.time()))
    try:
        first = [next(s) for s in streams]  # submits each choice; refusals (busy, too long) come here
    except StopIteration:
        first = []
    except BaseException:
        job.close()
        raise
    job.streams = [_prepend(f, s) for f, s in zip(first, streams)]
    job.prompt_tokens = first[0].prompt_tokens if first else 0
    return job


def _prepend(first, stream) -> Iterator:
    yield first
    try:
        yield from stream
    finally:
        stream.close()


def _holdback(stop: list) -> int:
    """Characters of the text not yet sent while a choice runs: a stop string may be forming at its end (the
    finished text is cut before it), and a partial UTF-8 character shows as U+FFFD until its last byte."""
    return max((len(s) - 1 for s in stop), default=0)


async def _sse(job: Job, release, refusal) -> Iterator[str]:
    """The stream's chunks as server-sent events; closing (the client went away) drops the choices' rows."""
    import anyio
    from starlette.concurrency import run_in_threadpool

    g = job.gen
    obj = "chat.completion.chunk" if job.chat else "text_completion"
    frames = job.frames()
    sent: dict[int, int] = {}  # choice index -> characters sent
    counted: dict[int, int] = {}  # choice index -> tokens sent
    hold = _holdback(g.stop)
    stop = object()
    try:
        while True:
            try:
                latest = await run_in_threadpool(next, frames, stop)
            except UserError as exc:
                err = refusal(exc)
                yield f"data: {json.dumps(err.body())}\n\n"
                break
            if latest is stop:
                break
            pieces = []
            for n, frame in enumerate(latest):
                for k, (side, text, tokens, finished) in enumerate(answers.sides(frame, g.compare)):
                    index = n + k * g.n
                    done = finished is not None or frame.done
                    ready = text if done else text[:max(0, len(text) - hold)].rstrip("\ufffd")
                    start, first = sent.get(index, 0), index not in sent
                    new_tokens = tokens[counted.get(index, 0):]
                    if len(ready) <= start and not new_tokens and not (done and index not in counted):
                        continue
                    sent[index], counted[index] = max(start, len(ready)), len(tokens)
                    pieces.append(answers.chunk_choice(index, side, ready[start:], new_tokens,
                                                       finished if done else None, job.chat, g.logprobs,
                                                       g.top_logprobs, first, start))
            if pieces:
                yield f"data: {json.dumps({**job.head(obj), 'choices': pieces})}\n\n"
        if g.include_usage:  # OpenAI's last chunk before [DONE]: no choices, the whole request's usage
            usage = answers.usage(job.prompt_tokens, sum(counted.values()))
            yield f"data: {json.dumps({**job.head(obj), 'choices': [], 'usage': usage})}\n\n"
        yield "data: [DONE]\n\n"
    finally:
        with anyio.CancelScope(shield=True):
            await run_in_threadpool(job.close)
        release()
