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

from .architecture import argmax_last, topk_last
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
    repetition penalty.  ``logits`` is never modified; when there is nothing
    to apply it is returned as is (no copy of a vocabulary-sized tensor).
    """
    penalise = s.repetition_penalty != 1.0 and history is not None and history.numel()
    if not penalise and s.temperature == 0:
        return logits
    logits = logits.clone()
    if penalise:
        history = history.to(logits.device)
        seen = torch.gather(logits, 1, history)
        seen = torch.where(seen < 0, seen * s.repetition_penalty, seen / s.repetition_penalty)
        logits.scatter_(1, history, seen)
    if s.temperature == 0:
        return logits
    logits = logits / s.temperature
    if s.top_k and s.top_k < logits.shape[-1]:
        kth = topk_last(logits, s.top_k)[0][:, -1:]
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
        return argmax_last(processed)
    probs = processed.softmax(-1)
    cdf = probs.cumsum(-1)
    u = torch.full((probs.shape[0], 1), float(uniform), dtype=cdf.dtype, device=cdf.device) * cdf[:, -1:]
    idx = torch.searchsorted(cdf, u).squeeze(1)
    return idx.clamp_max(probs.shape[-1] - 1)


def _steered_direction(steers: Sequence[Steer], state: StepState) -> torch.Tensor | None:
    """Σ α·v over the steers, for the steered row: the residual added at the steering site.

    The direct (unembedding-only) Δlogit of a token t is W_U[t]·(Σ α·v), so one
    dot product per generated token replaces a vocabulary-sized projection.
    """
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
        add = vec.float() * float(alpha)
        total = add if total is None else total + add.to(total.device)
    return total


def _forward_hidden(handle, input_ids, position_ids, cache):
    """Run the base model (final norm included); return the last position's hidden state and the cache."""
    out = handle.model.base_model(input_ids=input_ids, position_ids=position_ids, past_key_values=cache,
                                  use_cache=True)
    return out.last_hidden_state[:, -1, :], out.past_key_values


def _prefill_rows(steers: Sequence) -> list[int] | None:
    """Which rows the prompt pass must compute, as an index map onto the three decode rows.

    The counterfactual row is the unsteered model on the same prompt, so its
    prefill equals the unsteered row's and is copied rather than computed;
    when no steer touches prompt positions, the steered row's is too.  None
    (compute all three rows): an extension object, whose per-row behaviour we
    cannot reason about, or an input-dependent steer, whose function is
    called once on all three rows' contexts.
    """
    if any(not isinstance(s, Steer) or s.fn is not None for s in steers):
        return None
    if all(s.positions == "generated" for s in steers):
        return [UNSTEERED, UNSTEERED, UNSTEERED]
    return [UNSTEERED, STEERED, UNSTEERED]


def _decode_many(tok, ids: list[int]) -> list[str]:
    return tok.batch_decode([[i] for i in ids]) if ids else []


def stream_side_by_side(
    handle,
    prompt: str,
    steers: Sequence[Steer],
    sampling: Sampling | None = None,
) -> Iterator[StepEvent]:
    """Decode unsteered, steered and counterfactual rows together; yield each step.

    ``steers`` carry the *steered* α (scalar); this function sets the
    per-row α to (0, α, 0).  The last event's ``result`` is complete.

    Per step: one forward of the three rows through the blocks, the full
    unembedding for the unsteered and steered rows only (the counterfactual
    row needs one logit, the steered token's, so it gets a dot product), and
    a few small tensors brought to the host in one transfer each.
    """
    sampling = sampling or Sampling()
    sampling.validate()
    ids = encode_prompt(handle, prompt)
    rows = 3
    zero = torch.zeros(())
    row_steers = [s.with_alpha(torch.stack([zero, s.scalar_alpha.float(), zero])) for s in steers]
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
    tok = handle.tokenizer
    arch = handle.arch
    device = handle.input_device
    k = min(int(sampling.alternatives), arch.vocab_size)
    prompt_len = ids.shape[1]
    ids = ids.to(device)
    history = ids.expand(2, -1) if sampling.repetition_penalty != 1.0 else None
    state = StepState(prompt_len=prompt_len, offset=0)
    index_map = _prefill_rows(steers) if steers else [UNSTEERED, UNSTEERED, UNSTEERED]

    with torch.inference_mode(), handle.lock:
        # ---- prompt pass: only the distinct rows, then copied into the three decode rows
        position = torch.arange(prompt_len, device=device).unsqueeze(0)
        if index_map is None:
            with steering(handle, row_steers, state):
                hidden, cache = _forward_hidden(handle, ids.expand(rows, -1), position.expand(rows, -1), None)
        else:
            distinct = sorted(set(index_map))
            pre_steers = [s.with_alpha(s.alpha[distinct]) for s in row_steers]
            with steering(handle, pre_steers, state):
                hidden, cache = _forward_hidden(handle, ids.expand(len(distinct), -1),
                                                position.expand(len(distinct), -1), None)
            gather = torch.tensor([distinct.index(r) for r in index_map], device=device)
            hidden = hidden.index_select(0, gather)
            cache.reorder_cache(gather)
        direction = _steered_direction(row_steers, state)
        w_direct = None

        with steering(handle, row_steers, state):
            for step in range(sampling.max_new_tokens):
                if step:
                    hidden, cache = _forward_hidden(handle, input_ids, position, cache)
                    if direction is None:  # an input-dependent vector whose context came after it at prefill
                        direction = _steered_direction(row_steers, state)
                logits = arch.logits(hidden[:2])  # (2, vocab): the rows whose distributions we show and sample
                uniform = float(torch.rand((), generator=rng)) if sampling.temperature > 0 else None
                processed = process_logits(logits, history, sampling)
                picked = choose(processed, sampling, uniform)
                counterfactual = arch.logits_at(hidden[COUNTERFACTUAL:], picked[STEERED:])
                lse = torch.logsumexp(logits, dim=-1)
                chosen = logits.gather(1, picked.unsqueeze(1)).squeeze(1)
                floats = [chosen, lse, counterfactual]
                if direction is not None:
                    if w_direct is None:
                        w_direct = direction.to(device=arch.unembedding.device, dtype=arch.unembedding.dtype)
                    floats.append(arch.unembedding[picked[STEERED]].float() @ w_direct.float())
                if k:
                    top_values, top_indices = topk_last(logits, k)
                    floats.append((top_values - lse.unsqueeze(1)).exp().reshape(-1))
                # one device-to-host transfer for the floats, one for the ids
                values = torch.cat([f.reshape(-1).float() for f in floats]).tolist()
                id_list = torch.cat([picked.reshape(-1), top_indices.reshape(-1)] if k else [picked]).tolist()
                picked_ids, alt_ids = id_list[:2], id_list[2:]
                chosen_v, lse_v, cf_v = values[0:2], values[2:4], values[4]
                pos = 5
                direct_v = 0.0
                if direction is not None:
                    direct_v, pos = values[pos], pos + 1
                alt_probs = values[pos:]
                strings = _decode_many(tok, picked_ids + alt_ids)
                new = {}
                for row in (UNSTEERED, STEERED):
                    side = sides[row]
                    if side.finished:
                        new[row] = None
                        continue
                    tid = picked_ids[row]
                    alts = [(strings[2 + row * k + j], alt_probs[row * k + j]) for j in range(k)]
                    rec = TokenRecord(token_id=tid, token=strings[row], logprob=chosen_v[row] - lse_v[row],
                                      alternatives=alts)
                    if row == STEERED:
                        rec.delta_logit = chosen_v[STEERED] - cf_v
                        rec.direct_delta_logit = direct_v
                    new[row] = rec
                    if tid in eos:
                        side.finished = "eos"
                        continue
                    side.tokens.append(rec)
                    generated[row].append(tid)
                    side.text = tok.decode(generated[row], skip_special_tokens=True)
                    for stop in sampling.stop:
                        if stop and stop in side.text:
                            side.text = side.text[: side.text.index(stop)]
                            side.finished = "stop"
                            break
                result.steps = step + 1
                yield StepEvent(step=step, unsteered=new[UNSTEERED], steered=new[STEERED], result=result)
                if all(sides[r].finished for r in sides):
                    break
                input_ids = picked[[UNSTEERED, STEERED, STEERED]].unsqueeze(1)
                if history is not None:
                    history = torch.cat([history, picked.unsqueeze(1)], dim=1)
                state.offset = prompt_len + step
                position = torch.full((rows, 1), prompt_len + step, device=device)
        for side in sides.values():
            side.finished = side.finished or "length"


def side_by_side(handle, prompt: str, steers: Sequence[Steer], sampling: Sampling | None = None) -> SideBySide:
    result = None
    for event in stream_side_by_side(handle, prompt, steers, sampling):
        result = event.result
    return result
