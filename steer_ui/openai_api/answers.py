"""OpenAI's response bodies from the door's frames (issue #49): choices, log-probabilities with each token's
Δlogit, finish reasons, usage, and the stream's chunks.  Pure functions of plain values."""
from __future__ import annotations

import math

FINISH = {"eos": "stop", "stop": "stop", "length": "length"}
STEERED, UNSTEERED = "steered", "unsteered"


def finish_reason(finished: str | None) -> str | None:
    return FINISH.get(finished) if finished else None


def _logprob(p: float) -> float:
    return math.log(p) if p > 0 else -9999.0  # OpenAI's floor for an impossible token


def completion_logprobs(tokens: list, top: int, offset: int = 0) -> dict:
    """/v1/completions' columns; ``delta_logit`` beside them: each steered token's steered minus unsteered logit
    on the same prefix (None on the unsteered side)."""
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": [], "delta_logit": []}
    for t in tokens:
        out["tokens"].append(t.token)
        out["token_logprobs"].append(t.logprob)
        out["top_logprobs"].append({a: _logprob(p) for a, p in t.alternatives[:top]} if top else None)
        out["text_offset"].append(offset)
        out["delta_logit"].append(t.delta_logit)
        offset += len(t.token)
    return out


def chat_logprobs(tokens: list, top: int) -> dict:
    """Chat's ``logprobs.content``: one entry per token, with its ``delta_logit`` (steered side)."""
    def entry(token: str, logprob: float) -> dict:
        return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}

    return {"content": [{**entry(t.token, t.logprob), "delta_logit": t.delta_logit,
                         "top_logprobs": [entry(a, _logprob(p)) for a, p in t.alternatives[:top]]}
                        for t in tokens], "refusal": None}


def sides(frame, compare: bool) -> list[tuple[str, str, list, str | None]]:
    """(side, text, tokens, finished) of a frame: the steered side, and the unsteered one when compared."""
    out = [(STEERED, frame.steered_text, frame.steered_tokens, frame.steered_finished)]
    if compare:
        out.append((UNSTEERED, frame.unsteered_text, frame.unsteered_tokens, frame.unsteered_finished))
    return out


def choice(index: int, side: str, text: str, tokens: list, finished: str | None, chat: bool, logprobs: bool,
           top: int) -> dict:
    """One whole choice: its text (or assistant message), why it ended, its log-probabilities where asked for,
    and which side it is (``steered``, or ``unsteered`` with ``compare``)."""
    if chat:
        body = {"index": index, "message": {"role": "assistant", "content": text, "refusal": None},
                "logprobs": chat_logprobs(tokens, top) if logprobs else None}
    else:
        body = {"index": index, "text": text, "logprobs": completion_logprobs(tokens, top) if logprobs else None}
    return {**body, "finish_reason": finish_reason(finished) or "length", "side": side}


def chunk_choice(index: int, side: str, new_text: str, new_tokens: list, finished: str | None, chat: bool,
                 logprobs: bool, top: int, first: bool, offset: int) -> dict:
    """One choice's piece of a stream chunk: the text and tokens since the last chunk."""
    if chat:
        delta = {"content": new_text}
        if first:
            delta["role"] = "assistant"
        body = {"index": index, "delta": delta, "logprobs": chat_logprobs(new_tokens, top) if logprobs else None}
    else:
        body = {"index": index, "text": new_text,
                "logprobs": completion_logprobs(new_tokens, top, offset) if logprobs else None}
    return {**body, "finish_reason": finish_reason(finished), "side": side}


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}
