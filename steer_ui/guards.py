"""The checks every request passes before any model work: numbers, texts counted in tokens, working memory,
and pushes that would overflow.

Values come from strangers (the page, the HTTP API, links, files).  Each check names the field and the
problem in one line (a :class:`~steer_ui.messages.UserError` the UI translates) and changes nothing;
the limits are the policy's (:mod:`steer_ui.policy`).
"""
from __future__ import annotations

import math
import threading
import time
import weakref
from contextlib import contextmanager
from typing import Any, Iterable, Iterator, Sequence

import torch

from . import heap
from .messages import UserError
from .model.budget import Cost, cost
from .numbers import NumberError, parse_number
from .policy import Policy

MB = 1 << 20
TRIM_AFTER_BYTES = 16 * MB  # a request whose working memory was at least this hands its free pages back
# A residual whose squared length is not finite in float32 cannot be normalised: every norm layer of the
# supported families sums squares in float32 (upcasting half-precision models), so a push is refused when
# ‖h + α·v‖² could overflow there, not only when α·v itself does.
NORM_SQUARES_MAX = float(torch.finfo(torch.float32).max)
# The texts of a dataset a job reads (steer_ui.data.datasets' canonical columns; group and category are keys,
# never read by the model), and how many characters of them one tokenizer call takes: counting stops within
# one chunk of passing max_train_tokens.
READ_COLUMNS = ("prompt", "completion", "positive", "negative")
TOKENIZE_CHUNK_CHARS = 1 << 16
_LONGEST_TOKEN: dict[int, tuple[Any, int]] = {}


def longest_token_chars(tokenizer) -> int:
    """The most characters one token of ``tokenizer`` can span: its longest vocabulary entry, special tokens
    included (byte-level and SentencePiece entries spell at least the characters they cover).  So a text of
    more than ``n × this`` characters is more than ``n`` tokens, known without tokenising it (a tokenizer that
    maps a whole unknown word to one token can be refused by that bound when it would not by its count)."""
    held = _LONGEST_TOKEN.get(id(tokenizer))
    if held is not None and held[0]() is tokenizer:
        return held[1]
    try:
        longest = max(1, max((len(str(entry)) for entry in tokenizer.get_vocab()), default=1))
    except Exception:  # noqa: BLE001 - a tokenizer without a readable vocabulary: characters imply nothing
        return 1 << 20
    try:
        _LONGEST_TOKEN[id(tokenizer)] = (weakref.ref(tokenizer), longest)
    except TypeError:  # not weakly referable: measured again next time
        pass
    return longest


def _cell_text(value: Any) -> str:
    """A non-text cell as the text a job would read: empty for a missing value (None, NaN, NA)."""
    if value is None or (isinstance(value, float) and math.isnan(value)) or type(value).__name__ == "NAType":
        return ""
    return str(value)


def number(value: Any, what: str, *, integer: bool = False, low: float | None = None,
           high: float | None = None) -> int | float:
    """``value`` as a finite number (an int with ``integer``) in [low, high], or a one-line ``UserError``."""
    try:
        return parse_number(value, what, integer=integer, low=low, high=high)
    except NumberError as exc:
        raise UserError("number_" + exc.problem, **exc.params) from None


def flag(value: Any, what: str) -> bool:
    """A checkbox's value: True or False (also 0 / 1, as JSON clients send), nothing else."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    raise UserError("not_a_flag", what=what)


def text(value: Any, what: str, max_chars: int, allow_empty: bool = False) -> str:
    """``value`` as text: a string of at most ``max_chars`` characters that encodes as UTF-8 (a lone surrogate
    such as "\\ud800" does not, and no tokenizer takes it)."""
    if value is None and allow_empty:
        return ""
    if not isinstance(value, str):
        raise UserError("text_not_text", what=what)
    if len(value) > max_chars:
        raise UserError("prompt_too_long" if what == "prompt" else "text_too_long", what=what, size=len(value),
                        limit=max_chars)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise UserError("text_not_unicode", what=what, position=exc.start) from None
    if not allow_empty and not value.strip():
        raise UserError("empty_prompt" if what == "prompt" else "text_empty", what=what)
    return value


MAX_SETTINGS_CHARS = 64 * 1024  # settings as JSON text (limits.MAX_JSON_BYTES keeps them in a vector file)
MAX_SETTINGS_DIGITS = 30  # digits of one JSON number: no 5,000-digit integers, no interpreter advice


def settings_json(value: Any) -> dict:
    """A training method's settings sent as JSON text (or already an object): a dict of plain values.

    Bounded before and while parsing: at most :data:`MAX_SETTINGS_CHARS` characters, numbers of at most
    :data:`MAX_SETTINGS_DIGITS` digits, no NaN or Infinity, nesting that cannot exhaust the parser.  Each refusal
    says what is wrong in plain words, in a message of its own (``settings_json_*``, translated), never in the
    json module's English.
    """
    import json

    if value is None or (isinstance(value, str) and not value.strip()):
        return {}
    if isinstance(value, dict):
        value = json.dumps(value, allow_nan=True)  # parsed below like text, so the same bounds hold
    if not isinstance(value, str):
        raise UserError("settings_json_not_text")
    if len(value) > MAX_SETTINGS_CHARS:
        raise UserError("settings_json_too_long", size=len(value), limit=MAX_SETTINGS_CHARS)

    def bounded(kind):
        def parse(text: str):
            if len(text.lstrip("-")) > MAX_SETTINGS_DIGITS:
                raise UserError("settings_json_long_number", size=len(text), digits=MAX_SETTINGS_DIGITS)
            return kind(text)
        return parse

    def no_constant(name: str):
        raise UserError("settings_json_not_finite", name=name)

    try:
        parsed = json.loads(value, parse_int=bounded(int), parse_float=bounded(float), parse_constant=no_constant)
    except UserError:
        raise
    except RecursionError:
        raise UserError("settings_json_nested") from None
    except json.JSONDecodeError as exc:  # where, in plain words: exc.msg is the json module's English
        raise UserError("settings_json_unreadable", line=exc.lineno, column=exc.colno) from None
    if not isinstance(parsed, dict):
        raise UserError("settings_json_not_object")
    return parsed


class Guard:
    """The policy's limits, applied."""

    def __init__(self, policy: Policy):
        self.policy = policy
        self._in_flight = 0  # bytes that running requests hold, by the formula (reserve)
        self._long_in_flight = 0  # the part of it long jobs hold (at most policy.long_job_share of the budget)
        self._freed = threading.Condition()

    @contextmanager
    def reserve(self, needed: Cost | int, long: bool = False, waiting=None) -> Iterator[None]:
        """Hold ``needed`` bytes of the server's working memory (``policy.max_inflight_bytes`` in all) while
        a request runs; wait for others to finish first, up to ``policy.inflight_wait_seconds``, then say
        busy.  Many concurrent requests each within their own limit can then never add up past the budget.

        ``long``: a long job (a comparison), which with the other long jobs holds at most
        ``policy.long_job_share`` of the budget, so short requests (slider moves) always find room.
        ``waiting``: called once, with a one-line :class:`UserError` saying what it waits for, if it must wait.
        """
        p = self.policy
        total = p.max_inflight_bytes
        cap = int(total * p.long_job_share) if long else total
        size = min(int(getattr(needed, "bytes", needed)), cap)
        deadline = time.monotonic() + p.inflight_wait_seconds

        def full() -> bool:
            return self._in_flight + size > total or (long and self._long_in_flight + size > cap)

        with self._freed:
            told = False
            while full():
                if waiting is not None and not told:
                    told = True
                    waiting(UserError("waiting_for_memory", used=math.ceil(self._in_flight / MB), total=total // MB,
                                      long=math.ceil(self._long_in_flight / MB)))
                left = deadline - time.monotonic()
                if left <= 0 or not self._freed.wait(timeout=left):
                    if full():
                        raise UserError("memory_busy", limit=total // MB)
            self._in_flight += size
            self._long_in_flight += size if long else 0
        try:
            yield
        finally:
            with self._freed:
                self._in_flight -= size
                self._long_in_flight -= size if long else 0
                self._freed.notify_all()
            if size >= TRIM_AFTER_BYTES:
                heap.trim()  # its temporaries are free now: give the pages back (steer_ui/heap.py)

    # ------------------------------------------------------------------ numbers
    number = staticmethod(number)

    def alpha(self, value: Any, what: str = "alpha") -> float:
        limit = self.policy.max_alpha
        return float(number(value, what, low=-limit, high=limit))

    def seed(self, value: Any, what: str = "seed") -> int:
        return int(number(0 if value is None or value == "" else value, what, integer=True, low=0, high=2**31 - 1))

    def layer(self, handle, value: Any, what: str = "layer") -> int:
        layer = int(number(value, what, integer=True))
        if not 0 <= layer < handle.arch.num_layers:
            raise UserError("bad_layer", layer=layer, last=handle.arch.num_layers - 1)
        return layer

    # -------------------------------------------------------------------- texts
    def prompt(self, handle, value: Any, what: str = "prompt", rows: int = 1, new_tokens: int = 0,
               allow_empty: bool = False) -> Cost:
        """Check one text (characters first, a cheap gate; then tokens), and the request's working memory."""
        return self.texts(handle, [value], what, rows=rows, new_tokens=new_tokens, allow_empty=allow_empty)

    def texts(self, handle, values: Iterable[Any], what: str, rows: int = 1, new_tokens: int = 0,
              allow_empty: bool = False, max_tokens: int | None = None) -> Cost:
        """Check each of ``values`` as :meth:`prompt` does; the cost is that of the longest."""
        p = self.policy
        checked = [text(v, what, p.max_prompt_chars, allow_empty=allow_empty) for v in values]
        limit = max_tokens or p.max_prompt_tokens
        needed = cost(handle, [t for t in checked if t], rows=rows, extra_tokens=new_tokens)
        if needed.tokens > limit:
            raise UserError("too_many_tokens", what=what, tokens=needed.tokens, limit=limit)
        if needed.bytes > p.max_request_bytes:
            raise UserError("request_too_large", tokens=needed.tokens + new_tokens, rows=rows,
                            need=math.ceil(needed.bytes / MB), limit=p.max_request_bytes // MB)
        return needed

    def dataset(self, handle, dataset) -> None:
        """A dataset a long job reads: at most ``policy.max_train_rows`` rows; every text within the character
        gate and each text the job reads within the token limit; those together within
        ``policy.max_train_tokens`` (training keeps activations per token).

        Never tokenises more than the limits allow: characters are measured first (a text over the gate, or
        texts together longer than ``max_train_tokens`` of the model's longest tokens could span, are refused
        without a tokenizer call), then the texts are tokenised a chunk at a time and counting stops as soon as
        the running total passes its limit."""
        from .data.datasets import column_chars, first_long_cell

        p = self.policy
        frame = dataset.frame
        if len(frame) > p.max_train_rows:
            raise UserError("too_many_rows", rows=len(frame), limit=p.max_train_rows)
        longest = longest_token_chars(handle.tokenizer)
        per_text = min(p.max_prompt_chars, p.max_prompt_tokens * longest)  # over it: over one limit or the other
        first = first_long_cell(frame, per_text)
        if first is not None:
            row, column, size = first
            raise UserError("row_too_many_chars", row=row + 1, column=str(column)[:40], size=size, limit=per_text)
        read = {}
        for column in READ_COLUMNS:
            chars = column_chars(frame[column]) if column in frame.columns else None
            if chars is not None:
                read[column] = chars
        total_chars = sum(int(chars.sum()) for chars in read.values())
        if total_chars > p.max_train_tokens * longest:
            raise UserError("data_too_many_chars", chars=total_chars, limit=p.max_train_tokens, longest=longest)
        total = 0
        for column, chars in read.items():
            values = frame[column].tolist()  # each within the gate, all within the bound above
            start = 0
            while start < len(values):
                end, size = start + 1, int(chars[start])
                while end < len(values) and size + chars[end] <= TOKENIZE_CHUNK_CHARS:
                    size += int(chars[end])
                    end += 1
                texts = [v if isinstance(v, str) else _cell_text(v) for v in values[start:end]]
                ids = handle.tokenizer(texts, add_special_tokens=False, return_attention_mask=False).input_ids
                for i, row_ids in enumerate(ids):
                    if len(row_ids) > p.max_prompt_tokens:
                        raise UserError("row_too_long", row=start + i + 1, column=str(column)[:40],
                                        tokens=len(row_ids), limit=p.max_prompt_tokens)
                total += sum(len(row_ids) for row_ids in ids)
                if total > p.max_train_tokens:
                    raise UserError("data_too_large", tokens=total, limit=p.max_train_tokens)
                start = end

    # ------------------------------------------------------------------- pushes
    def pushes(self, handle, steers: Sequence) -> None:
        """Refuse steering whose α-scaled push, or its effect on the residual stream, is not finite in the model's
        arithmetic: such a request would otherwise decode NaN or a uniform distribution, not an error."""
        from .model.hooks import HeadSteer, Steer

        dtype_max = float(torch.finfo(handle.dtype).max) if handle.dtype.is_floating_point else NORM_SQUARES_MAX
        norms = handle.layer_norms()
        for s in steers:
            if isinstance(s, Steer) and s.vector is not None:
                vectors = [(s.layer, s.vector)]
            elif isinstance(s, HeadSteer):
                vectors = list(s.shifts.items())
            else:
                continue  # input-dependent: its vectors exist only per prompt, and fail their own request
            alpha = float(s.alpha.double().abs().max())
            for layer, vector in vectors:
                push = vector.double() * alpha
                largest = float(push.abs().max())
                residual = float(norms[layer]) if 0 <= layer < len(norms) else 0.0
                squares = float(push.pow(2).sum()) + residual ** 2
                if not (math.isfinite(largest) and largest <= dtype_max and math.isfinite(squares)
                        and squares < NORM_SQUARES_MAX):
                    raise UserError("push_overflows", size=f"{math.sqrt(squares) if math.isfinite(squares) else math.inf:.3g}",
                                    dtype=str(handle.dtype).replace("torch.", ""))
