"""What a long job may take before it starts: its share of the working memory, and its time at the measured speed.

A comparison of many prompts is the one request a visitor can size freely (up to
``policy.max_compare_prompts`` prompts of ``policy.max_prompt_tokens`` tokens and
``policy.max_new_tokens`` new ones), so it is planned before any model work:

* **Memory.** Each prompt in the decode batch keeps its KV cache (three rows over its
  tokens and new tokens, :func:`steer_ui.model.budget.kv_bytes`).  A long job may hold at
  most ``policy.long_job_share`` of the server's working memory
  (``policy.max_inflight_bytes``), so slider moves and next-token calls always find the
  rest; the comparison runs as many prompts at once as fit in its share (at most
  ``policy.compare_in_flight``), and is refused when not even one does.
* **Time.** Its work in the one formula the engine measures its speed in
  (:meth:`steer_ui.model.engine.EngineStats.estimate_seconds`): token rows to prefill
  (prompt tokens × rows, for the generations and for the read-out passes over prompt and
  text) and rows to decode (prompts × 3 rows × new tokens).  A comparison whose estimate
  passes ``policy.compare_seconds`` is refused up front with the number of prompts that
  would fit; one that runs past it anyway (the machine got busier) stops there and returns
  the prompts it finished (:func:`steer_ui.steerability.generate_all`).

Before the engine has measured anything (a fresh server) the time check is skipped and the
deadline alone applies.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from .messages import UserError
from .model.budget import kv_bytes
from .policy import Policy

MB = 1 << 20
SIDE_BY_SIDE_ROWS = 3  # unsteered, steered, counterfactual


def long_job_bytes(policy: Policy) -> int:
    """The working memory all long jobs together may hold."""
    return int(policy.max_inflight_bytes * policy.long_job_share)


@dataclass(frozen=True)
class ComparisonPlan:
    """How a comparison runs: prompts at once, the memory that holds, and its estimated seconds (None: unmeasured)."""

    in_flight: int
    reserve_bytes: int
    estimate_seconds: float | None
    token_rows: int
    decode_rows: int


def comparison_work(token_counts: Sequence[int], new_tokens: int, reading_rows: int) -> tuple[int, int]:
    """(token rows to prefill, rows to decode) of a comparison: each prompt's generation (3 rows over its tokens,
    then ``new_tokens`` steps of 3 rows) and its read-out passes (``reading_rows`` rows over prompt and text)."""
    token_rows = sum(SIDE_BY_SIDE_ROWS * t + reading_rows * (t + new_tokens) for t in token_counts)
    decode_rows = len(token_counts) * SIDE_BY_SIDE_ROWS * new_tokens
    return token_rows, decode_rows


def plan_comparison(handle, stats, policy: Policy, token_counts: Sequence[int], new_tokens: int,
                    reading_rows: int) -> ComparisonPlan:
    """The plan of a comparison of prompts of ``token_counts`` tokens, or a one-line :class:`UserError` saying what
    to shrink.  ``stats``: the engine's :class:`~steer_ui.model.engine.EngineStats` (its measured speed)."""
    longest = max(token_counts)
    per_prompt = kv_bytes(handle, longest + new_tokens, SIDE_BY_SIDE_ROWS)
    share = long_job_bytes(policy)
    fit = share // max(per_prompt, 1)
    if fit < 1:
        raise UserError("compare_too_large", tokens=longest, new_tokens=new_tokens, need=math.ceil(per_prompt / MB),
                        limit=share // MB, total=policy.max_inflight_bytes // MB)
    in_flight = int(max(1, min(policy.compare_in_flight, policy.batch_requests, fit, len(token_counts))))
    token_rows, decode_rows = comparison_work(token_counts, new_tokens, reading_rows)
    estimate = stats.estimate_seconds(token_rows, decode_rows)
    if estimate is not None and estimate > policy.compare_seconds:
        per = estimate / len(token_counts)
        raise UserError("compare_too_slow", estimate=math.ceil(estimate), prompts=len(token_counts),
                        new_tokens=new_tokens, tokens=sum(token_counts), limit=int(policy.compare_seconds),
                        fit=max(1, int(policy.compare_seconds / per)))
    return ComparisonPlan(in_flight=in_flight, reserve_bytes=per_prompt * in_flight, estimate_seconds=estimate,
                          token_rows=token_rows, decode_rows=decode_rows)
