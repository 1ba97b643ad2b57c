"""One batched decode loop: unsteered and steered continuations, for many requests at once.

A request (:class:`Request`, one side-by-side generation) is three rows of a
decode batch (:class:`DecodeBatch`):

* ``unsteered``: the model as it is (α = 0);
* ``steered``: the same prompt with the steering applied;
* ``counterfactual``: the *unsteered* model fed the steered row's tokens.  Its
  logit for the token the steered row picks, on the same prefix, gives the
  per-token Δlogit = steered logit − unsteered logit without a second pass.

A request that needs less (an API client without ``compare`` or
log-probabilities, issue #49) decodes only some of them: always the steered
row, and the others as ``Sampling.unsteered`` / ``counterfactual`` ask
(:func:`row_kinds`), with exactly the tokens and numbers it gets beside them.

Each steered token also gets a *direct* Δlogit (:func:`direct_delta_logit`):
the part of the steering effect that flows straight from the steered blocks'
outputs along the residual stream to the logits, with the later blocks'
reaction removed.  At the last block nothing reacts, so there it equals the
actual Δlogit.

With a Δlogit limit (``Sampling.max_delta_logit``) the counterfactual row is
unembedded in full as well, and a steered step whose logits move further
than the limit from the unsteered model's on the same tokens is scaled back
to it (:meth:`DecodeBatch._limit_delta`).

A request's rows draw from the request's own random stream (one Gumbel
noise vector per step, shared by its two sampled rows), so with α = 0 the two
sides are token-for-token identical, greedy or sampled.

Many requests share a batch (continuous batching, :mod:`.engine` schedules
them): their prompts are left-padded, with an attention mask and position
ids that count real tokens only, so every row sees what it would see alone;
each request keeps its own steering (one (rows, hidden) matrix per steered
block, zero on other requests' rows), sampling settings and random stream.
Requests join between decode steps (their prompts are run together, then
their KV cache rows are joined to the running batch's, :mod:`.kv_rows`) and
leave as soon as both their sides have stopped.  :func:`stream_side_by_side`
runs one request alone through the same code.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import torch

from ..limits import MAX_DELTA_LOGIT_LIMIT
from . import kv_rows, static_decode, vocab_pass
from .dynamic_decode import DynamicDecode
from .fused_decode import FusedDecode
from .architecture import centred, topk_last
from .sampler import choose, noise_generator, process_logits, uniforms
from .capture import left_pad, recording
from .hooks import (HeadSteer, Steer, StepState, between_blocks, input_vector, special_positions, steering,
                    validate)
from .static_decode import StaticDecode
from .switches import Setting

UNSTEERED, STEERED, COUNTERFACTUAL = 0, 1, 2
_MIRROR = Setting(True)  # every_row_decoded() turns it off


@contextmanager
def every_row_decoded():
    """Inside, requests made here decode every row their sampling asks for, even one that adds nothing (which is
    otherwise mirrored: :meth:`Request.mirror`): A/B runs, tests, and the bench's hook overhead, whose unsteered
    baseline decodes the page's three rows as the steered run does."""
    with _MIRROR.held(False):
        yield



class GenerationError(ValueError):
    """A generation request that cannot run (empty prompt, bad sampling values)."""


# a temperature below this decodes greedily (its limit); 1e-3 turns a gap of 0.1 logits into 100 nats
GREEDY_BELOW = 1e-3


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
    stop_ids: Sequence[int] = ()  # more token ids that end a side (a chat turn's end: the template's markers)
    alternatives: int = 5  # top-k alternatives recorded per token
    # 0 = off; else the most any token's centred logit may move at a steered step (see DecodeBatch.sample)
    max_delta_logit: float = 0.0
    # also record what the Many prompts table reads (issue #31): each steered token's log-probability under the
    # unsteered model (the counterfactual row, unembedded in full) and the first token's KL(unsteered ‖ steered)
    measure: bool = False
    # which rows a request decodes beside the steered one (issue #49): the unsteered side (the page's left column,
    # the API's compare) and the counterfactual row that measures each steered token's Δlogit; a Δlogit limit
    # needs the counterfactual row and a measured request both, whatever these say
    unsteered: bool = True
    counterfactual: bool = True

    def __post_init__(self) -> None:
        # T -> 0 is greedy decoding; a temperature this small only overflows: the logits over it were infinite in
        # float32 (1e-38 gave an empty answer through /v1, NaN probabilities in Concepts: a hostile probe)
        if isinstance(self.temperature, (int, float)) and 0 < self.temperature < GREEDY_BELOW:
            self.temperature = 0.0

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
            (math.isfinite(self.max_delta_logit) and 0 <= self.max_delta_logit <= MAX_DELTA_LOGIT_LIMIT,
             f"the Δlogit limit must be in 0..{MAX_DELTA_LOGIT_LIMIT:g} (0 = off), got {self.max_delta_logit!r}"),
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
    direct_delta_logit: float | None = None  # steered row only; see direct_delta_logit()
    # steered row, with a Δlogit limit only: the step's max centred |Δlogit| before the limit, and the share of
    # the change kept (1 = the limit did not bite)
    max_delta_logit: float | None = None
    kept: float | None = None
    # steered row, with Sampling.measure: log p of this token under the unsteered model on the same steered text
    unsteered_logprob: float | None = None

    def as_dict(self) -> dict:
        d = {"token": self.token, "token_id": self.token_id, "logprob": self.logprob,
             "alternatives": [{"token": t, "prob": p} for t, p in self.alternatives]}
        if self.delta_logit is not None:
            d["delta_logit"] = self.delta_logit
            d["direct_delta_logit"] = self.direct_delta_logit
        if self.max_delta_logit is not None:
            d["max_delta_logit"] = self.max_delta_logit
            d["kept"] = self.kept
        if self.unsteered_logprob is not None:
            d["unsteered_logprob"] = self.unsteered_logprob
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
    first_kl: float | None = None  # with Sampling.measure: KL(unsteered ‖ steered) of the first token, nats

    def as_dict(self) -> dict:
        return {"prompt": self.prompt, "unsteered": self.unsteered.as_dict(), "steered": self.steered.as_dict()}

    def snapshot(self) -> "SideBySide":
        """A copy as it is now (token records are never changed once made, so they are shared)."""
        def side(s: Side) -> Side:
            return Side(tokens=list(s.tokens), text=s.text, finished=s.finished)

        return SideBySide(prompt=self.prompt, unsteered=side(self.unsteered), steered=side(self.steered),
                          steps=self.steps, first_kl=self.first_kl)


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


def _site(layer: int, special_tokens: bool):
    """A decode site's key: the layer alone (as it always was) or (layer, True) for steers taking special tokens."""
    return (layer, True) if special_tokens else layer


def _site_layer(key) -> int:
    return key[0] if isinstance(key, tuple) else key


def _site_special(key) -> bool:
    return isinstance(key, tuple)


def _steered_addition(steers: Sequence, state: StepState, seq_len: int, last_special: bool = False
                      ) -> torch.Tensor | None:
    """Σ α·v that the steered row received at the last of the ``seq_len`` positions being run, or None.

    Only steers whose position mask covers that position count (the hooks'
    own rule, :meth:`StepState.position_mask`); an input-dependent steer
    contributes the steered row's own vector.  Extensions (per-head
    interventions) have no single residual addition and are left out.
    ``last_special``: that position holds a special token, which only steers
    asking for special tokens touch.
    """
    total = None
    for s in steers:
        if not isinstance(s, Steer) or (last_special and not s.special_tokens):
            continue
        mask = state.position_mask(seq_len, s.positions, "cpu")
        if mask is not None and not bool(mask[0, -1, 0]):
            continue
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


def direct_delta_logit(arch, final_residual: torch.Tensor, addition: torch.Tensor, token_ids: torch.Tensor,
                       base_logit: torch.Tensor) -> torch.Tensor:
    """The direct Δlogit of ``token_ids``: ``logit(final_norm(h + a)) − logit(final_norm(h))``.

    ``final_residual`` h (rows, hidden): the residual at the output of the
    last block of the *counterfactual* row (the unsteered model on the
    steered row's tokens), before the final norm.  ``addition`` a (hidden,),
    or (rows, hidden) with one per row: what the steering added to the steered row at that position, summed over
    the steered blocks (:func:`_steered_addition`).  ``base_logit`` (rows,):
    the counterfactual row's own logit of the token, ``logit(final_norm(h))``.

    "Direct" means the part of the steering effect that flows straight from
    the steered blocks' outputs along the residual stream to the logits, with
    the later blocks' reaction removed: the additions carried unchanged to the
    final residual, then the final norm (which divides by the residual's RMS
    and multiplies by its gain), the unembedding and any logit soft-cap, while
    every block after a steered one sees the unsteered stream.  At a position
    no steer's mask covers it is 0 (the decode loop then skips this call); at
    the last block it is the actual Δlogit.  It costs one final norm on ``rows`` rows and
    one unembedding row per token, never the full vocabulary.  The addition
    is made in the residual's dtype, as the steering hook makes it, so at the
    last block the result equals the actual Δlogit to float rounding.
    """
    h = final_residual + addition.to(device=final_residual.device, dtype=final_residual.dtype)
    return arch.logits_at(arch.final_hidden(h), token_ids) - base_logit




def _prefill_rows(steers: Sequence) -> list[int] | None:
    """Which rows the prompt pass must compute, as an index map onto a request's three rows.

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


def _prefill_plan(r: Request) -> tuple[list[int], list[int]]:
    """The rows a request's prompt pass computes, and the index map of its three rows onto them (only the kinds
    it decodes need a computed row)."""
    index_map = _prefill_rows(r.row_steers) if r.row_steers else [UNSTEERED] * 3
    if index_map is None:
        return [UNSTEERED, STEERED, COUNTERFACTUAL], [UNSTEERED, STEERED, COUNTERFACTUAL]
    return sorted({index_map[kind] for kind in r.kinds}), index_map


def row_kinds(s: Sampling) -> tuple[int, ...]:
    """The rows a request with sampling ``s`` decodes: always the steered one; the unsteered one for its side (and
    a measured request's first-token KL); the counterfactual one for Δlogit, a Δlogit limit or a measure."""
    unsteered = s.unsteered or s.measure
    counterfactual = s.counterfactual or s.measure or s.max_delta_logit > 0
    return tuple(kind for kind, on in ((UNSTEERED, unsteered), (STEERED, True), (COUNTERFACTUAL, counterfactual))
                 if on)


def prefill_groups(requests: Sequence[Request], device) -> list[list[Request]]:
    """``requests`` split into groups whose prompts run in one pass each: on the CPU one group per prompt
    length, so no prompt is padded (elsewhere one group: padding is all but free beside a pass there).

    A left-padded row is not computed as it is alone: its attention sums run over more columns, in another
    order, so its numbers part from the request's solo run in the last bits (the bench's many-users batch: the
    two chats' probabilities 1.8e-6 and 2.1e-6 from their solo runs, every other request equal bit for bit).
    Without padding the batch equals each request alone bit for bit on the fused CPU step, which the
    unembedding's int16 activations need (int8.py: their rounding turns last-bit differences into code steps).
    It also spares the padding's rows (a burst of prompts of 2 and 26 tokens padded into one pass computed 2.3x
    the token rows it needed); a pass's fixed part, ~7 ms on the embedded model, is what it costs."""
    requests = list(requests)
    if torch.device(device).type != "cpu" or len(requests) < 2:
        return [requests] if requests else []
    by_length: dict[int, list[Request]] = {}
    for r in sorted(requests, key=lambda r: len(r.ids)):
        by_length.setdefault(len(r.ids), []).append(r)
    return list(by_length.values())


def _decode_many(tok, ids: list[int]) -> list[str]:
    return tok.batch_decode([[i] for i in ids]) if ids else []


def _eos_ids(handle) -> set[int]:
    e = handle.tokenizer.eos_token_id
    eos = set(e if isinstance(e, (list, tuple)) else [e]) - {None}
    gen_eos = getattr(getattr(handle.model, "generation_config", None), "eos_token_id", None)
    if gen_eos is not None:
        eos |= set(gen_eos if isinstance(gen_eos, (list, tuple)) else [gen_eos])
    return eos


def max_positions(handle) -> int | None:
    """The longest sequence the model takes (learned position tables end there), or None if it does not say."""
    config = handle.model.config
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    for name in ("max_position_embeddings", "n_positions"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


@dataclass(eq=False)
class Request:
    """One side-by-side generation: rows unsteered, steered and counterfactual of a :class:`DecodeBatch`.

    Make it with :meth:`make` (which validates everything a batch would
    otherwise fail on).  ``steers`` carry the steered α (scalar); the
    request's rows get (0, α, 0).  The decode fills ``result``; ``done`` is
    set once both sides have stopped, ``cancelled`` by whoever gives up on it.
    """

    prompt: str
    ids: list[int]
    steers: list
    sampling: Sampling
    result: SideBySide
    eos: set[int]
    row_steers: list = field(default_factory=list)
    last_special: bool = False  # the prompt's last token is a special one (unsteered unless a steer asks)
    step: int = 0
    done: bool = False
    cancelled: bool = False
    # filled at prefill
    input_vectors: dict[int, torch.Tensor] = field(default_factory=dict, repr=False)  # id(row steer) -> (3, hidden)
    additions: dict[bool, torch.Tensor | None] = field(default_factory=dict, repr=False)  # generated? -> Σ α·v
    decode_resid: dict[int, torch.Tensor] = field(default_factory=dict, repr=False)  # block -> (hidden,) float
    decode_heads: dict[int, torch.Tensor] = field(default_factory=dict, repr=False)  # block -> (width,) float
    rng: torch.Generator | None = field(default=None, repr=False)  # made at the first sampled step
    noise: torch.Tensor | None = field(default=None, repr=False)  # the step's uniforms, rewritten every step
    history: torch.Tensor | None = field(default=None, repr=False)
    generated: dict[int, list[int]] = field(default_factory=lambda: {UNSTEERED: [], STEERED: []}, repr=False)
    # the rows this request decodes, in the batch's order (see Sampling.unsteered / counterfactual)
    kinds: tuple[int, ...] = (UNSTEERED, STEERED, COUNTERFACTUAL)
    # no steer adds anything (none, or every α 0): the unsteered side and the counterfactual row would be the
    # steered row bit for bit, so only the steered row decodes and the others are filled from it (:meth:`mirror`)
    mirrored: bool = False
    asked: tuple[int, ...] = (UNSTEERED, STEERED, COUNTERFACTUAL)  # the rows the sampling asks for (row_kinds)

    @classmethod
    def make(cls, handle, prompt: str, steers: Sequence, sampling: Sampling | None = None) -> "Request":
        sampling = sampling or Sampling()
        sampling.validate()
        ids = encode_prompt(handle, prompt)[0].tolist()
        steers = list(steers)
        validate(steers, handle.arch.num_layers, handle.arch.hidden_size)
        for s in steers:
            if not isinstance(s, (Steer, HeadSteer)):
                raise GenerationError(f"cannot decode with a {type(s).__name__} intervention")
            # α·v must be finite in the model's dtype: an overflow would reach other requests' rows as 0 · inf
            pushes = [s.vector] if isinstance(s, Steer) and s.fn is None else \
                list(s.shifts.values()) if isinstance(s, HeadSteer) else []
            for push in pushes:
                if not torch.isfinite((s.scalar_alpha.float() * push.float()).to(handle.dtype)).all():
                    raise GenerationError("α × vector overflows the model's number range: use a smaller α")
        limit = max_positions(handle)
        if limit and len(ids) + sampling.max_new_tokens > limit:
            raise GenerationError(f"the prompt ({len(ids)} tokens) plus {sampling.max_new_tokens} new tokens is "
                                  f"longer than this model's {limit} positions")
        zero = torch.zeros(())
        row_steers = [s.with_alpha(torch.stack([zero, s.scalar_alpha.float(), zero])) for s in steers]
        # an input-dependent steer's α · fn(context) is left to compute (its function could return inf)
        mirrored = _MIRROR.value and all(float(s.scalar_alpha) == 0.0 and getattr(s, "fn", None) is None
                                         for s in steers)
        asked = row_kinds(sampling)
        return cls(prompt=prompt, ids=ids, steers=steers, sampling=sampling,
                   result=SideBySide(prompt=prompt, unsteered=Side(), steered=Side()),
                   eos=(_eos_ids(handle) if sampling.stop_at_eos else set()) | {int(i) for i in sampling.stop_ids},
                   row_steers=[] if mirrored else row_steers, kinds=(STEERED,) if mirrored else asked,
                   mirrored=mirrored, asked=asked,
                   last_special=bool(special_positions(handle, torch.tensor(ids[-1:])).any()))

    def uniforms(self, vocab: int, device) -> torch.Tensor:
        """This step's uniforms from the request's stream (made on first use where the logits are); the sampler
        turns the few it needs into Gumbel noise (:mod:`.sampler`)."""
        if self.rng is None:
            self.rng = noise_generator(self.sampling.seed, device)
        # the same buffer every step where it fits: fresh pages each step cost more than the draw (mt_stream)
        keep = self.noise if self.noise is not None and self.noise.shape == (vocab,) \
            and self.noise.device == self.rng.device else None
        self.noise = uniforms(self.rng, vocab, out=keep)
        return self.noise

    @property
    def sides(self) -> dict[int, Side]:
        """The sides this request decodes (an undecoded unsteered side stays empty and unfinished)."""
        return {kind: side for kind, side in ((UNSTEERED, self.result.unsteered), (STEERED, self.result.steered))
                if kind in self.kinds}

    def _after_prefill(self, input_vectors: dict[int, torch.Tensor], device) -> None:
        """What the decode steps need: the direct-Δlogit additions and the steered row's per-block additions.

        While decoding every position is a generated one, so prompt-only
        steers drop out and every other steer adds its α·v (an input-dependent
        one, the steered row's own vector, fixed at prefill) at every step.
        """
        self.input_vectors = input_vectors
        self.decode_resid, self.decode_heads = {}, {}  # recomputed whole: an admit retried after a failure
        length = len(self.ids)
        residual = [s for s in self.row_steers if isinstance(s, Steer)]
        at_prompt = StepState(prompt_len=length, offset=0, input_vectors=input_vectors)
        at_generated = StepState(prompt_len=length, offset=length, input_vectors=input_vectors)
        # step 0 predicts from the last prompt position, later steps from generated positions
        self.additions = {False: _steered_addition(residual, at_prompt, length, self.last_special) if residual
                          else None,
                          True: _steered_addition(residual, at_generated, 1) if residual else None}
        # on the step's device once: a host-to-device copy every step would make the host wait for the GPU
        self.additions = {k: v if v is None else v.to(device) for k, v in self.additions.items()}
        for s in self.row_steers:
            if s.positions == "prompt":
                continue
            alpha = float(s.alpha[STEERED])
            # keyed by layer, and by whether the steer also takes special tokens (a second matrix, where asked)
            if isinstance(s, Steer):
                vec = s.vector if s.fn is None else input_vectors[id(s)][STEERED]
                add, key = alpha * vec.float().to(device), _site(s.layer, s.special_tokens)
                self.decode_resid[key] = add if key not in self.decode_resid else self.decode_resid[key] + add
            else:
                for layer, shift in s.shifts.items():
                    add, key = alpha * shift.to(device), _site(layer, s.special_tokens)
                    self.decode_heads[key] = add if key not in self.decode_heads else self.decode_heads[key] + add
        if self.sampling.repetition_penalty != 1.0:
            self.history = torch.tensor([self.ids] * len(self.sides), device=device)

    def _finish(self) -> None:
        for side in self.sides.values():
            side.finished = side.finished or "length"
        self.done = True

    def mirror(self, steered: TokenRecord | None, first: bool) -> TokenRecord | None:
        """A mirrored request's step, once its steered row's token is taken: the numbers of the rows it did not
        decode, which equal the steered row's (no steer adds anything).  ``steered``: this step's record (None if
        the side had stopped); ``first``: whether this was step 0.  Returns the unsteered side's record, where the
        request shows that side.

        Δlogit against the counterfactual row (the unsteered model on the same tokens: this very row) is 0 and so
        is the direct Δlogit; a Δlogit limit finds nothing to hold (0 before it, all of the change kept); a
        measured request's unsteered log-probability is the token's own and its first token's KL is 0."""
        s = self.sampling
        if steered is not None and COUNTERFACTUAL in self.asked:
            steered.delta_logit = steered.direct_delta_logit = 0.0
            if s.max_delta_logit > 0:
                steered.max_delta_logit, steered.kept = 0.0, 1.0
            if s.measure:
                steered.unsteered_logprob = steered.logprob
        if first and s.measure:
            self.result.first_kl = 0.0
        if UNSTEERED not in self.asked:
            return None
        mine, theirs = self.result.unsteered, self.result.steered
        mine.text, mine.finished = theirs.text, theirs.finished
        if steered is None:
            return None
        record = TokenRecord(token_id=steered.token_id, token=steered.token, logprob=steered.logprob,
                             alternatives=list(steered.alternatives))
        if len(mine.tokens) < len(theirs.tokens):  # the token was kept (not an end of sequence)
            mine.tokens.append(record)
        return record


def row_twins(requests: Sequence[Request], blocks: int) -> list[tuple[int, int]]:
    """Per row of ``requests`` (in the batch's order), (the row it equals, in how many first blocks), for the
    decode path to skip computing: a request's counterfactual row is fed its steered row's tokens and is never
    steered, so below the first block any of the request's steers touches (a residual steer after its block, a
    head shift inside its block; prompt-only ones too, which made the prompt's keys and values differ above them)
    the two rows' inputs are the same, bit for bit.  (-1, 0) for every other row."""
    twins: list[tuple[int, int]] = []
    for r in requests:
        first = min([s.layer + 1 if isinstance(s, Steer) else min(s.shifts) for s in r.steers], default=blocks)
        start = len(twins)
        for kind in r.kinds:
            shared = kind == COUNTERFACTUAL and STEERED in r.kinds and first > 0
            twins.append((start + r.kinds.index(STEERED), first) if shared else (-1, 0))
    return twins


class DecodeBatch:
    """The rows of every running request, their KV cache, and one decode step for all of them.

    Each request owns contiguous rows, in the order of its ``kinds``: unsteered,
    steered and counterfactual for the page's side by side (three rows), the
    steered row alone, or with one of the others (issue #49).  :meth:`admit` runs new requests' prompts
    and joins their rows; :meth:`sample` picks every request's next tokens
    from the rows' current hidden states and returns one event per request;
    :meth:`advance` drops the requests that are done or cancelled and runs
    one forward pass of the remaining rows.  Not thread-safe: one thread (the
    engine's, or :func:`stream_side_by_side`'s caller) drives a batch, and the
    steering hooks it installs act in that thread only.
    """

    def __init__(self, handle, pause=None, decode: str | None = None):
        """``pause``: called before each decoder block of this batch's passes, and between the
        stages of :meth:`sample` (the points where a step may give way to a slider move).
        ``decode``: ``auto``, ``static``, ``dynamic`` or ``fused`` (default: ``STEER_UI_DECODE``, else ``auto``);
        see :func:`.static_decode.choose`.  :attr:`decode_path` says which path runs."""
        self.handle = handle
        # the rows' KV store and decode step: static_decode's (captured on CUDA) or Hugging Face's dynamic cache;
        # both take the same calls, so nothing below asks which
        static, self._decode_reason = static_decode.choose(handle, decode)
        self.kv: StaticDecode | FusedDecode | DynamicDecode = static if static is not None else DynamicDecode(handle)
        self.pause = pause
        self._between = pause or (lambda: None)
        self.requests: list[Request] = []
        self.hidden = self.final = self.next_ids = None
        self._final_block = handle.arch.num_layers - 1
        self._indices: dict[tuple, torch.Tensor] = {}  # sample()'s index tensors, by their values and device

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def rows(self) -> int:
        """Rows the batch decodes: three per side-by-side request, fewer for one that asked for less."""
        return sum(len(r.kinds) for r in self.requests)

    @staticmethod
    def _starts(requests) -> list[int]:
        """Each request's first row (its rows are contiguous, in ``kinds`` order)."""
        starts, at = [], 0
        for r in requests:
            starts.append(at)
            at += len(r.kinds)
        return starts

    @property
    def can_join(self) -> bool:
        """Whether new rows can join now (always when empty; else when the cache layout allows it)."""
        return self.kv.can_join

    @property
    def static(self) -> StaticDecode | None:
        """The static store when this batch runs the static path (its counters: builds, captures), else None."""
        return self.kv if isinstance(self.kv, StaticDecode) else None

    @property
    def decode_path(self) -> dict:
        """``{"path": "dynamic" | "fused" | "static (eager)" | "static+cuda-graph", "reason": ...}`` (and the static path's
        re-build and capture counts)."""
        return self.kv.report(self._decode_reason)

    def steering_changed(self) -> None:
        """Take up changed steering of running requests (their ``decode_resid`` / ``decode_heads``) from the
        next step on; on the static path an in-place write of their rows (no re-build, no re-capture)."""
        self.kv.set_steering(self._steers_for(self.requests), row_twins(self.requests, self.handle.arch.num_layers))

    # ------------------------------------------------------------ prefill
    def admit(self, requests: Sequence[Request]) -> None:
        """Run the new requests' prompts together (left-padded) and join their rows to the batch."""
        requests = [r for r in requests if not r.cancelled]
        if not requests:
            return
        handle = self.handle
        device = handle.input_device
        plans, texts = [], []
        for r in requests:
            distinct, index_map = _prefill_plan(r)
            plans.append((len(texts), distinct, index_map))
            texts += [r.ids] * len(distinct)
        pad = handle.tokenizer.pad_token_id
        ids, attention, position = left_pad(texts, pad if pad is not None else 0)
        rows, length = ids.shape
        # each request's steers act on its own prefill rows only (α = 0 elsewhere)
        pre_steers, owner = [], {}
        for r, (first, distinct, _) in zip(requests, plans):
            for s in r.row_steers:
                alpha = torch.zeros(rows)
                for j, kind in enumerate(distinct):
                    alpha[first + j] = s.alpha[kind]
                pre = s.with_alpha(alpha)
                pre_steers.append(pre)
                owner[id(pre)] = (r, s)
        state = StepState(prompt_len=length, offset=0)
        with torch.inference_mode(), \
                recording(handle, [self._final_block], "resid", reduce=lambda h: h[:, -1, :]) as final, \
                steering(handle, pre_steers, state), between_blocks(handle, self.pause):
            padded = bool((attention == 0).any())
            out = handle.model.base_model(input_ids=ids.to(device),
                                          attention_mask=attention.to(device) if padded else None,
                                          position_ids=position.to(device), use_cache=True)
            # a generated-only input-dependent steer whose context block comes after its own block saw no
            # context while the prompt ran through it; its vector is fixed now, from the recorded context
            for pre in pre_steers:
                if isinstance(pre, Steer) and pre.fn is not None and id(pre) not in state.input_vectors:
                    input_vector(pre, state, out.last_hidden_state)
        order = [first + distinct.index(index_map[kind]) for r, (first, distinct, index_map) in zip(requests, plans)
                 for kind in r.kinds]
        gather = torch.tensor(order, device=device)
        cache = out.past_key_values
        kv_rows.keep_rows(cache, gather)
        hidden = out.last_hidden_state[:, -1, :].index_select(0, gather)
        final_residual = final[self._final_block].index_select(0, gather.to(final[self._final_block].device))
        mask = attention.to(device).index_select(0, gather)
        positions = position[:, -1].to(device).index_select(0, gather) + 1
        for r, (first, _, _) in zip(requests, plans):
            vectors = {}
            # input-dependent steers make their plan compute all three rows (_prefill_rows), so their vectors
            # are (3, hidden) whichever rows the request decodes
            three = torch.tensor([first + kind for kind in (UNSTEERED, STEERED, COUNTERFACTUAL)])
            for pre, vec in state.input_vectors.items():  # keyed by id(prefill steer), as ``owner`` is
                if owner[pre][0] is r:
                    vectors[id(owner[pre][1])] = vec.index_select(0, three.to(vec.device))
            r._after_prefill(vectors, device)
        self._join(requests, cache, length, mask, positions, hidden, final_residual)

    def _join(self, requests, cache, columns, mask, positions, hidden, final_residual) -> None:
        """Add the prefilled rows; all or nothing (what can fail runs before the batch changes)."""
        steers = self._steers_for(self.requests + list(requests))
        twins = row_twins(self.requests + list(requests), self.handle.arch.num_layers)
        self.kv.join(cache, columns, mask, positions, reserve=max(r.sampling.max_new_tokens for r in requests),
                     twins=twins)
        if self.hidden is None:
            self.hidden, self.final = hidden, final_residual
        else:
            self.hidden = torch.cat([self.hidden, hidden])
            self.final = torch.cat([self.final, final_residual.to(self.final.device)])
            if self.next_ids is not None:  # new rows have not sampled yet; sample() sets it for everyone
                self.next_ids = None
        self.requests += list(requests)
        self.kv.set_steering(steers, twins)

    def _steers_for(self, requests: list[Request]) -> list:
        """One (rows, hidden) matrix per steered block, one (rows, width) per steered head site; zero rows elsewhere."""
        rows = sum(len(r.kinds) for r in requests)
        device = self.handle.input_device
        resid: dict[int, torch.Tensor] = {}
        heads: dict[int, torch.Tensor] = {}
        for start, r in zip(self._starts(requests), requests):
            for table, mine in ((resid, r.decode_resid), (heads, r.decode_heads)):
                for layer, add in mine.items():
                    if layer not in table:
                        table[layer] = torch.zeros((rows, add.shape[-1]), device=device)
                    table[layer][start + r.kinds.index(STEERED)] = add
        steers = [Steer(layer=_site_layer(key), vector=matrix, special_tokens=_site_special(key))
                  for key, matrix in resid.items()]
        for special in (False, True):
            mine = {_site_layer(key): shift for key, shift in heads.items() if _site_special(key) == special}
            if mine:
                steers.append(HeadSteer(mine, special_tokens=special))
        return steers

    # ------------------------------------------------------------- decode
    def _index(self, values: list, device, dtype=torch.long) -> torch.Tensor:
        """``values`` as a tensor on ``device``, made once per distinct list: the rows a step reads change
        only when requests join, leave or pass their first step, and a tensor made from a list on a GPU is a
        copy the host waits for (nine a step before this, in the captured 8B step's profile)."""
        key = (tuple(values), str(device), dtype)
        index = self._indices.get(key)
        if index is None:
            if len(self._indices) >= 256:  # many batch compositions over a long run: start again
                self._indices.clear()
            index = self._indices[key] = torch.tensor(values, dtype=dtype, device=device)
        return index

    def sample(self) -> list[tuple[Request, StepEvent]]:
        """Pick every request's next tokens from its rows' hidden states; one event per request.

        The full unembedding runs for the sampled rows only (unsteered and
        steered; the counterfactual row needs one logit, the steered token's,
        unless the request has a Δlogit limit: :meth:`_limit_delta`); the
        direct Δlogit costs one final-norm row per request; the host gets one
        transfer of floats and one of ids for the whole batch.  A request
        without an unsteered or counterfactual row (``Request.kinds``) simply
        has no entries for it.
        """
        arch, tok = self.handle.arch, self.handle.tokenizer
        requests = self.requests
        device = self.hidden.device
        starts = self._starts(requests)

        def row(i: int, kind: int) -> int:
            return starts[i] + requests[i].kinds.index(kind)

        # the sampled rows, request by request (each request's are contiguous): at[(i, kind)] is their place
        sampled = [(i, kind) for i, r in enumerate(requests) for kind in (UNSTEERED, STEERED) if kind in r.kinds]
        at = {key: j for j, key in enumerate(sampled)}
        m = len(sampled)
        with_cf = [i for i, r in enumerate(requests) if COUNTERFACTUAL in r.kinds]
        cf_at = {i: c for c, i in enumerate(with_cf)}
        # (a mirrored request's limit and measure read no row: Request.mirror)
        limited = [i for i, r in enumerate(requests) if r.sampling.max_delta_logit > 0 and not r.mirrored]
        measured = [i for i, r in enumerate(requests) if r.sampling.measure and not r.mirrored]
        # a limited or measured request's counterfactual row rides in the same unembedding (one read of W_U for
        # all rows)
        whole = limited + [i for i in measured if i not in limited]
        rows = [row(i, kind) for i, kind in sampled] + [row(i, COUNTERFACTUAL) for i in whole]
        unembedded = arch.logits(self.hidden.index_select(0, self._index(rows, device)), pause=self.pause)
        logits = unembedded[:m]  # (m, vocab): the sampled rows in ``sampled``'s order
        firsts = [i for i in measured if requests[i].step == 0]  # their first token's KL is read this step
        measures = self._measure(logits, unembedded[m:], whole, measured, firsts, at) if measured else []
        if limited:
            self._between()
            worst, kept = self._limit_delta(logits, unembedded[m:m + len(limited)], limited, at)
        k = min(max(int(r.sampling.alternatives) for r in requests), arch.vocab_size)
        # each row's log-sum-exp, k most likely tokens and argmax in one pass where the kernel can (else None)
        summary = vocab_pass.summarise(logits, max(k, 1))
        picked = []
        for i, r in enumerate(requests):
            self._between()  # each request's sampling is a few passes over the vocabulary
            noise = r.uniforms(logits.shape[-1], logits.device) if r.sampling.temperature > 0 else None
            lo = at[(i, STEERED)] - (UNSTEERED in r.kinds)  # the request's first sampled row
            own = logits[lo:lo + len(r.sides)]
            processed = process_logits(own, r.history, r.sampling)
            if summary is not None and processed is own and r.sampling.temperature == 0:
                picked.append(summary.top_indices[lo:lo + len(r.sides), 0])  # the first maximal index: argmax
            else:
                picked.append(choose(processed, r.sampling, noise))
        self._between()
        picked = torch.cat(picked)  # (m,): the sampled rows' tokens, in ``sampled``'s order
        cf_ids = picked.index_select(0, self._index([at[(i, STEERED)] for i in with_cf], picked.device))
        cf_rows = self._index([row(i, COUNTERFACTUAL) for i in with_cf], device)
        counterfactual = arch.logits_at(self.hidden.index_select(0, cf_rows), cf_ids) if with_cf else \
            logits.new_zeros(0)
        lse = summary.lse if summary is not None else torch.logsumexp(logits, dim=-1)
        chosen = logits.gather(1, picked.unsqueeze(1)).squeeze(1)
        floats = [chosen, lse, counterfactual]
        # the direct Δlogit reads the counterfactual row's final residual
        with_direct = [i for i in with_cf if requests[i].additions.get(requests[i].step > 0) is not None]
        if with_direct:
            adds = torch.stack([requests[i].additions[requests[i].step > 0] for i in with_direct])
            finals = self._index([row(i, COUNTERFACTUAL) for i in with_direct], self.final.device)
            idx = self._index([cf_at[i] for i in with_direct], counterfactual.device)
            floats.append(direct_delta_logit(arch, self.final.index_select(0, finals), adds,
                                             cf_ids.index_select(0, idx.to(cf_ids.device)),
                                             counterfactual.index_select(0, idx)))
        self._between()
        if k:
            top_values, top_indices = (summary.top_values[:, :k], summary.top_indices[:, :k]) \
                if summary is not None else topk_last(logits, k)
            floats.append((top_values - lse.unsqueeze(1)).exp().reshape(-1))
        if limited:
            floats += [worst, kept]
        floats += measures
        # one read for the host (each read waits for the GPU): the floats, then the ids, in float64, which holds
        # every float32 value and every token id exactly
        ids = torch.cat([picked, top_indices.reshape(-1)] if k else [picked])
        read = torch.cat([f.reshape(-1).double() for f in floats] + [ids.double()]).tolist()
        values, id_list = read[:-ids.numel()], [int(i) for i in read[-ids.numel():]]
        strings = _decode_many(tok, id_list)
        nc = len(with_cf)
        cf_logit = {i: values[2 * m + c] for c, i in enumerate(with_cf)}
        direct = dict(zip(with_direct, values[2 * m + nc:2 * m + nc + len(with_direct)]))
        end = 2 * m + nc + len(with_direct) + m * k
        probs = values[2 * m + nc + len(with_direct):end]
        limit = {i: (values[end + c], values[end + len(limited) + c]) for c, i in enumerate(limited)}
        end += 2 * len(limited)
        # measured: the counterfactual row's log-sum-exp, then (first step only) the first token's KL
        cf_lse = {i: values[end + c] for c, i in enumerate(measured)}
        first_kl = {i: values[end + len(measured) + c] for c, i in enumerate(firsts)}
        events = []
        for i, r in enumerate(requests):
            new = {UNSTEERED: None, STEERED: None}
            for kind, side in r.sides.items():
                if side.finished:
                    continue
                j = at[(i, kind)]
                tid = id_list[j]
                own_k = min(int(r.sampling.alternatives), k)
                alts = [(strings[m + j * k + a], probs[j * k + a]) for a in range(own_k)]
                rec = TokenRecord(token_id=tid, token=strings[j], logprob=values[j] - values[m + j],
                                  alternatives=alts)
                if kind == STEERED and i in cf_logit:
                    rec.delta_logit = values[j] - cf_logit[i]
                    # no steer touched this position: nothing flows straight from the steering to it
                    rec.direct_delta_logit = direct.get(i, 0.0)
                    if i in limit:
                        rec.max_delta_logit, rec.kept = limit[i]
                    if i in cf_lse:
                        rec.unsteered_logprob = cf_logit[i] - cf_lse[i]
                new[kind] = rec
                if tid in r.eos:
                    side.finished = "eos"
                    continue
                side.tokens.append(rec)
                r.generated[kind].append(tid)
                side.text = tok.decode(r.generated[kind], skip_special_tokens=True)
                for stop in r.sampling.stop:
                    if stop and stop in side.text:
                        side.text = side.text[: side.text.index(stop)]
                        side.finished = "stop"
                        break
            if i in first_kl:
                r.result.first_kl = first_kl[i]
            if r.history is not None:
                lo = at[(i, STEERED)] - (UNSTEERED in r.kinds)
                r.history = torch.cat([r.history, picked[lo:lo + len(r.sides)].unsqueeze(1)], dim=1)
            r.result.steps = r.step + 1
            r.step += 1
            if all(side.finished for side in r.sides.values()) or r.step >= r.sampling.max_new_tokens:
                r._finish()
            if r.mirrored:
                new[UNSTEERED] = r.mirror(new[STEERED], r.step == 1)
            events.append((r, StepEvent(step=r.step - 1, unsteered=new[UNSTEERED], steered=new[STEERED],
                                        result=r.result)))
        # the next inputs: the unsteered row its token, the steered and counterfactual rows the steered token
        feed = self._index([at[(i, UNSTEERED if kind == UNSTEERED else STEERED)]
                            for i, r in enumerate(requests) for kind in r.kinds], device)
        self.next_ids = picked.index_select(0, feed).unsqueeze(1)
        return events

    def _measure(self, logits: torch.Tensor, counterfactual: torch.Tensor, whole: list[int],
                 measured: list[int], firsts: list[int], at: dict) -> list[torch.Tensor]:
        """For ``measured`` requests: their counterfactual rows' log-sum-exp (``counterfactual`` holds the rows
        of ``whole``, in its order) and, for ``firsts`` (those at their first step), KL(unsteered ‖ steered) of
        the raw next-token distributions (before any Δlogit limit: the push itself, as the slider's readout shows
        it).  ``at``: each sampled (request, row kind)'s place in ``logits``."""
        where = self._index([whole.index(i) for i in measured], counterfactual.device)
        out = [torch.logsumexp(counterfactual.index_select(0, where).float(), dim=-1)]
        if firsts:
            u = logits[[at[(i, UNSTEERED)] for i in firsts]].float().log_softmax(-1)
            st = logits[[at[(i, STEERED)] for i in firsts]].float().log_softmax(-1)
            out.append((u.exp() * (u - st)).sum(-1))
        return out

    def _limit_delta(self, logits: torch.Tensor, base: torch.Tensor,
                     limited: list[int], at: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """Hold each limited request's steered logits within its Δlogit limit; (worst before, share kept) per request.

        The bound a vector is trained or calibrated for (docs/tsv.md) is on
        the centred change of the next-token logits against the unsteered
        model on the same text, and on inputs unlike the calibration rows it
        can break.  The counterfactual row is that unsteered model on the
        steered row's tokens, so here the change is measured exactly, every
        step: Δ = steered − counterfactual logits, and where the largest
        centred |Δ| exceeds the limit B the steered row's logits become
        counterfactual + (B / max)·Δ, which sits at the limit exactly.  It is
        the logit change a proportionally weaker push would make to first
        order; the residual stream keeps the full push (later steps are held
        again if they go over), and the token's direct Δlogit stays that of the
        full push.  ``logits`` (sampled rows, vocab) is changed in place; ``base``: the
        limited requests' counterfactual logits, in ``limited``'s order; ``at``: each sampled (request, row kind)'s
        place in ``logits``.
        """
        steered_rows = self._index([at[(i, STEERED)] for i in limited], logits.device)
        delta = logits.index_select(0, steered_rows).float() - base.float()
        worst = centred(delta).abs().amax(-1)  # the measure a vector's bound is trained and checked on
        bound = self._index([float(self.requests[i].sampling.max_delta_logit) for i in limited], logits.device,
                            torch.float32)
        kept = torch.clamp(bound / worst.clamp_min(1e-12), max=1.0)  # no host read: the step decides on device
        held = (base.float() + kept.unsqueeze(1) * delta).to(logits.dtype)
        # where the limit does not bite, the steered logits stay bit for bit what they were (base + Δ rounds)
        held = torch.where((kept < 1).unsqueeze(1), held, logits.index_select(0, steered_rows))
        logits.index_copy_(0, steered_rows, held)
        return worst, kept

    def advance(self) -> None:
        """Drop requests that are done or cancelled, then run one decode step for the rest."""
        keep = [i for i, r in enumerate(self.requests) if not (r.done or r.cancelled)]
        if len(keep) < len(self.requests):
            self._keep(keep)
        if not self.requests:
            return
        self.hidden, self.final = self.kv.step(self.next_ids, pause=self.pause)
        self.next_ids = None

    def _keep(self, keep: list[int]) -> None:
        starts = self._starts(self.requests)
        kept_rows = [starts[i] + j for i in keep for j in range(len(self.requests[i].kinds))]
        self.requests = [self.requests[i] for i in keep]
        self.kv.keep(kept_rows)  # static: the leaving rows' slots are freed; dynamic: their KV rows dropped
        if not self.requests:
            self.hidden = self.final = self.next_ids = None
            self.kv.set_steering([])
            return
        rows = torch.tensor(kept_rows, device=self.hidden.device)
        self.hidden = self.hidden.index_select(0, rows)
        self.final = self.final.index_select(0, rows.to(self.final.device))
        if self.next_ids is not None:
            self.next_ids = self.next_ids.index_select(0, rows)
        self.steering_changed()


def stream_side_by_side(
    handle,
    prompt: str,
    steers: Sequence[Steer],
    sampling: Sampling | None = None,
    batch: DecodeBatch | None = None,
) -> Iterator[StepEvent]:
    """Decode one request alone (unsteered, steered and counterfactual rows); yield each step.

    ``steers`` carry the *steered* α (scalar).  The last event's ``result``
    is complete.  The same :class:`DecodeBatch` code serves many requests at
    once (:mod:`.engine`); alone, a request gets exactly what it gets there.
    ``batch``: an empty batch to decode in (the benchmark passes one made with
    a decode path, to report it); default a new one on the one-off path
    (:func:`.static_decode.one_off_setting`: never a CUDA graph unless asked).
    """
    request = Request.make(handle, prompt, steers, sampling)
    if batch is None:
        batch = DecodeBatch(handle, decode=static_decode.one_off_setting(handle.input_device))
    batch.admit([request])
    while True:
        ((_, event),) = batch.sample()
        yield event
        if request.done:
            return
        batch.advance()


def side_by_side(handle, prompt: str, steers: Sequence[Steer], sampling: Sampling | None = None) -> SideBySide:
    result = None
    for event in stream_side_by_side(handle, prompt, steers, sampling):
        result = event.result
    return result
