"""One batched decode loop for unsteered and steered continuations together.

Rows of a side-by-side run:

* ``unsteered``: the model as it is (α = 0);
* ``steered``: the same prompt with the steering applied;
* ``counterfactual``: the *unsteered* model fed the steered row's tokens.  Its
  logit for the token the steered row picks, on the same prefix, gives the
  per-token Δlogit = steered logit − unsteered logit without a second pass.

All rows share every forward pass and the KV cache, and draw from one random
stream (one uniform number per step, shared by the rows), so with α = 0 the
two sides are token-for-token identical, greedy or sampled.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Sequence

import torch

from .hooks import Steer, StepState, steering

UNSTEERED, STEERED, COUNTERFACTUAL = 0, 1, 2


class GenerationError(ValueError):
    """A generation request that cannot run (empty prompt, bad sampling values)."""


@dataclass
class Sampling:
    max_new_tokens: int = 48
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    seed: int = 0
    stop: Sequence[str] = ()
    stop_at_eos: bool = True
    alternatives: int = 5  # top-k alternatives recorded per token

    def validate(self) -> None:
        import math

        checks = [
            (isinstance(self.max_new_tokens, int) and 1 <= self.max_new_tokens <= 4096,
             f"max new tokens must be an integer in 1..4096, got {self.max_new_tokens!r}"),
            (math.isfinite(self.temperature) and self.temperature >= 0,
             f"temperature must be a finite number >= 0, got {self.temperature!r}"),
            (self.top_k >= 0, f"top-k must be >= 0 (0 = off), got {self.top_k!r}"),
            (math.isfinite(self.top_p) and 0 < self.top_p <= 1, f"top-p must be in (0, 1], got {self.top_p!r}"),
            (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0,
             f"repetition penalty must be > 0, got {self.repetition_penalty!r}"),
        ]
        for ok, msg in checks:
            if not ok:
                raise GenerationError(msg)


@dataclass
class TokenRecord:
    token_id: int
    token: str
    logprob: float
    alternatives: list[tuple[str, float]]  # (token, probability) under the row's own model
    delta_logit: float | None = None  # steered row only
    direct_delta_logit: float | None = None  # steered row only

    def as_dict(self) -> dict:
        d = {"token": self.token, "token_id": self.token_id, "logprob": self.logprob,
             "alternatives": [{"token": t, "prob": p} for t, p in self.alternatives]}
        if self.delta_logit is not None:
            d["delta_logit"] = self.delta_logit
            d["direct_delta_logit"] = self.direct_delta_logit
        return d


@dataclass
class Side:
    tokens: list[TokenRecord] = field(default_factory=list)
    text: str = ""
    finished: str | None = None  # "eos", "stop", "length"

    def as_dict(self) -> dict:
        return {"text": self.text, "tokens": [t.as_dict() for t in self.tokens], "finished": self.finished}


@dataclass
class SideBySide:
    prompt: str
    unsteered: Side
    steered: Side
    steps: int = 0

    def as_dict(self) -> dict:
        return {"prompt": self.prompt, "unsteered": self.unsteered.as_dict(), "steered": self.steered.as_dict()}


@dataclass
class StepEvent:
    """Yielded once per decode step: the new token of each side (None once a side has stopped)."""

    step: int
    unsteered: TokenRecord | None
    steered: TokenRecord | None
    result: SideBySide


def encode_prompt(handle, prompt: str) -> torch.Tensor:
    if not isinstance(prompt, str) or not prompt.strip():
        raise GenerationError("the prompt is empty: type some text to continue")
    ids = handle.tokenizer(prompt, return_tensors="pt").input_ids
    if ids.shape[1] == 0:
        raise GenerationError("the prompt tokenised to nothing")
    return ids


def process_logits(logits: torch.Tensor, history: torch.Tensor | None, s: Sampling) -> torch.Tensor:
    """Apply repetition penalty, temperature, top-k and top-p to (rows, vocab) logits.

    Filtered-out tokens get -inf.  Greedy (temperature 0) only applies the
    repetition penalty.
    """
    logits = logits.clone()
    if s.repetition_penalty != 1.0 and history is not None and history.numel():
        seen = torch.gather(logits, 1, history)
        seen = torch.where(seen < 0, seen * s.repetition_penalty, seen / s.repetition_penalty)
        logits.scatter_(1, history, seen)
    if s.temperature == 0:
        return logits
    logits = logits / s.temperature
    if s.top_k and s.top_k < logits.shape[-1]:
        kth = torch.topk(logits, s.top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if s.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        # keep the smallest prefix whose mass reaches top_p (the token crossing it stays)
        drop_sorted = (cum - sorted_logits.softmax(-1)) >= s.top_p
        drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def choose(processed: torch.Tensor, s: Sampling, uniform: float | None) -> torch.Tensor:
    """Greedy argmax, or inverse-CDF sampling with one shared uniform so equal rows pick equal tokens."""
    if s.temperature == 0:
        return processed.argmax(-1)
    probs = processed.softmax(-1)
    cdf = probs.cumsum(-1)
    u = torch.full((probs.shape[0], 1), float(uniform), dtype=cdf.dtype) * cdf[:, -1:]
    idx = torch.searchsorted(cdf, u).squeeze(1)
    return idx.clamp_max(probs.shape[-1] - 1)


def _record(handle, token_id: int, logprobs_row: torch.Tensor, k: int) -> TokenRecord:
    tok = handle.tokenizer
    top = torch.topk(logprobs_row, k) if k else None
    alts = [] if top is None else [(tok.decode([int(i)]), float(p.exp())) for p, i in zip(top.values, top.indices)]
    return TokenRecord(token_id=token_id, token=tok.decode([token_id]), logprob=float(logprobs_row[token_id]),
                       alternatives=alts)


def _direct_effects(handle, steers: Sequence[Steer], state: StepState) -> torch.Tensor | None:
    """α·(v·W_Uᵀ) summed over steers, for the steered row: shape (vocab,)."""
    w = handle.arch.unembedding
    total = None
    for s in steers:
        if not isinstance(s, Steer):
            continue  # extensions have no single residual direction
        if s.fn is not None:
            vec = state.input_vectors.get(id(s))
            if vec is None:
                continue
            vec = vec[STEERED]
        else:
            vec = s.vector
        alpha = s.alpha if s.alpha.numel() == 1 else s.alpha[STEERED]
        proj = torch.matmul(w, vec.to(w.device, w.dtype)).float().cpu() * float(alpha)
        total = proj if total is None else total + proj
    return total


def _forward_last(handle, input_ids, attention_mask, position_ids, cache):
    """Run the base model (final norm included) and unembed only the last position."""
    out = handle.model.base_model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                  past_key_values=cache, use_cache=True)
    logits = handle.arch.logits(out.last_hidden_state[:, -1, :])
    return logits, out.past_key_values


def stream_side_by_side(
    handle,
    prompt: str,
    steers: Sequence[Steer],
    sampling: Sampling | None = None,
) -> Iterator[StepEvent]:
    """Decode unsteered, steered and counterfactual rows together; yield each step.

    ``steers`` carry the *steered* α (scalar); this function sets the
    per-row α to (0, α, 0).  The last event's ``result`` is complete.
    """
    sampling = sampling or Sampling()
    sampling.validate()
    ids = encode_prompt(handle, prompt)
    rows = 3
    row_steers = [s.with_alpha(torch.stack([torch.zeros(()), s.scalar_alpha.float(), torch.zeros(())]))
                  for s in steers]
    eos = set()
    if sampling.stop_at_eos:
        e = handle.tokenizer.eos_token_id
        eos = set(e if isinstance(e, (list, tuple)) else [e]) - {None}
        gen_eos = getattr(getattr(handle.model, "generation_config", None), "eos_token_id", None)
        if gen_eos is not None:
            eos |= set(gen_eos if isinstance(gen_eos, (list, tuple)) else [gen_eos])
    result = SideBySide(prompt=prompt, unsteered=Side(), steered=Side())
    sides = {UNSTEERED: result.unsteered, STEERED: result.steered}
    generated: dict[int, list[int]] = {UNSTEERED: [], STEERED: []}
    rng = torch.Generator().manual_seed(int(sampling.seed))
    device = handle.input_device
    prompt_len = ids.shape[1]
    input_ids = ids.to(device).expand(rows, -1).contiguous()
    history = input_ids.cpu()
    position = torch.arange(prompt_len, device=device).unsqueeze(0).expand(rows, -1)
    cache = None
    state = StepState(prompt_len=prompt_len, offset=0)
    with torch.inference_mode(), steering(handle, row_steers, state):
        direct = None
        for step in range(sampling.max_new_tokens):
            logits, cache = _forward_last(handle, input_ids, None, position, cache)
            logits = logits.cpu()
            if step == 0:
                direct = _direct_effects(handle, row_steers, state)
            logprobs = logits.log_softmax(-1)
            uniform = float(torch.rand((), generator=rng)) if sampling.temperature > 0 else None
            processed = process_logits(logits[:2], history[:2], sampling)
            picked = choose(processed, sampling, uniform)
            new = {}
            for row in (UNSTEERED, STEERED):
                side = sides[row]
                if side.finished:
                    new[row] = None
                    continue
                tid = int(picked[row])
                rec = _record(handle, tid, logprobs[row], sampling.alternatives)
                if row == STEERED:
                    rec.delta_logit = float(logits[STEERED, tid] - logits[COUNTERFACTUAL, tid])
                    rec.direct_delta_logit = float(direct[tid]) if direct is not None else 0.0
                new[row] = rec
                if tid in eos:
                    side.finished = "eos"
                    continue
                side.tokens.append(rec)
                generated[row].append(tid)
                side.text = handle.tokenizer.decode(generated[row], skip_special_tokens=True)
                for stop in sampling.stop:
                    if stop and stop in side.text:
                        side.text = side.text[: side.text.index(stop)]
                        side.finished = "stop"
                        break
            result.steps = step + 1
            yield StepEvent(step=step, unsteered=new[UNSTEERED], steered=new[STEERED], result=result)
            if all(sides[r].finished for r in sides):
                break
            nxt = torch.tensor([int(picked[UNSTEERED]), int(picked[STEERED]), int(picked[STEERED])])
            history = torch.cat([history, nxt.unsqueeze(1)], dim=1)
            input_ids = nxt.unsqueeze(1).to(device)
            state.offset = prompt_len + step
            position = torch.full((rows, 1), prompt_len + step, device=device)
        for side in sides.values():
            side.finished = side.finished or "length"


def side_by_side(handle, prompt: str, steers: Sequence[Steer], sampling: Sampling | None = None) -> SideBySide:
    result = None
    for event in stream_side_by_side(handle, prompt, steers, sampling):
        result = event.result
    return result
