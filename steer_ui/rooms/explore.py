"""Explore: the next-token view for a slider move, the calibrated α range, the vector's vocabulary projection,
sampling settings, streamed side-by-side generation, and the α sweep (dose-response)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterator

import pandas as pd

from .. import guards
from ..limits import MAX_DELTA_LOGIT_LIMIT
from ..messages import UserError
from ..sessions import Session
from ..steering import steering_kind
from .common import RANDOM, Shared, expected_errors, first_line, said_of
from . import unsteered_memo
from .library import Library
from .models import Models

MAX_VOCAB_TOP_K = 1 << 20  # no vocabulary is larger; a bigger top-k is a mistake or an attack
MAX_TARGET_CHARS = 200  # a sweep's target token, typed as text (only its first token counts)
MAX_TEMPERATURE = 100.0  # far past uniform sampling already
MAX_REPETITION_PENALTY = 100.0
MAX_STOP_STRINGS, MAX_STOP_CHARS = 4, 200  # OpenAI's API takes up to 4 stop sequences
MAX_ALTERNATIVES = 20  # the most top log-probabilities per token OpenAI's API returns


@dataclass
class Frame:
    """One snapshot of a streamed side-by-side generation (copied, so the worker may go on)."""

    prompt: str
    unsteered_text: str
    steered_text: str
    unsteered_tokens: list
    steered_tokens: list
    done: bool
    steps: int
    # why each side stopped once it has ("eos", "stop", "length"; None while it runs), and the prompt's length
    prompt_tokens: int = 0
    unsteered_finished: str | None = None
    steered_finished: str | None = None

    def token_frame(self) -> pd.DataFrame:
        """Per steered token: position, token, logprob, Δlogit (actual and direct), top alternatives; with a
        Δlogit limit also the step's max centred |Δlogit| before it and the share of the change kept."""
        tokens = self.steered_tokens
        frame = pd.DataFrame({
            "position": list(range(len(tokens))),
            "token": [t.token for t in tokens],
            "logprob": [t.logprob for t in tokens],
            "delta_logit": [t.delta_logit for t in tokens],
            "direct_delta_logit": [t.direct_delta_logit for t in tokens],
            "alternatives": [", ".join(f"{a!r} {p:.2f}" for a, p in t.alternatives[:5]) for t in tokens],
        })
        if any(t.max_delta_logit is not None for t in tokens):
            frame.insert(5, "max_delta_logit_before_limit", [t.max_delta_logit for t in tokens])
            frame.insert(6, "change_kept", [t.kept for t in tokens])
        return frame

    def as_dict(self) -> dict:
        return {"prompt": self.prompt, "done": self.done, "steps": self.steps,
                "unsteered": {"text": self.unsteered_text, "tokens": [t.as_dict() for t in self.unsteered_tokens]},
                "steered": {"text": self.steered_text, "tokens": [t.as_dict() for t in self.steered_tokens]}}


@dataclass
class Explore:
    shared: Shared
    models: Models
    library: Library

    def next_token(self, session: str | None, prompt: str, vector_name: str | None, layer: int | None, alpha: float,
                   relative: bool = True, seed: int = 0, top_k: int = 10):
        """Top-k next tokens unsteered vs steered, KL, entropies, Δlogit extremes (analysis fast path)."""
        return self.next_token_for(session, prompt, self._one(vector_name, layer, alpha, relative, seed), top_k)

    @staticmethod
    def _one(vector_name, layer, alpha, relative, seed):
        """Today's one-vector arguments as a spec of one term (checked with every other spec)."""
        from ..steering_spec import RANDOM_SOURCE, one

        source = RANDOM_SOURCE if not vector_name or vector_name == RANDOM else vector_name
        return one(source, alpha, layer, relative, seed)

    def next_token_for(self, session: str | None, prompt: str, steering, top_k: int = 10):
        """The next-token view for a steering spec of one or more terms (:mod:`steer_ui.steering_spec`)."""
        guard = self.shared.guard
        needed = guard.prompt(self.models.handle, prompt, rows=2)  # the unsteered and the steered row
        top_k = guard.number(top_k, "top_k", integer=True, low=1, high=self.shared.policy.max_top_k)
        steers = self.library.steers_for(session, steering)
        try:
            engine, slider = self.models.explore_workers()
            # the move runs in turn with the decode batch (on its thread while it decodes: Engine.run_move)
            with guard.reserve(needed):
                return slider.next_token(prompt, steers, top_k=top_k, run=engine.run_move)
        except expected_errors() as exc:
            raise UserError("explore_failed", detail=said_of(exc)) from None

    def calibrated_alpha_max(self, session: str | None, prompt: str, vector_name: str | None, layer: int | None,
                             seed: int = 0) -> float:
        """Relative α where the next-token KL on ``prompt`` reaches ~5 nats for this vector at ``layer``.

        The slider then spans from no effect to strong-but-readable; one batched
        sweep of the fast path (a fraction of a second).  Vectors that do not
        steer with one fixed direction keep their own recommended range.
        """
        from ..default_view import GRID, KL_AT_MAX, alpha_at_kl
        from ..model.analysis import mean_kl_curve

        guard, handle = self.shared.guard, self.models.handle
        layer = guard.layer(handle, layer if layer is not None else handle.arch.num_layers // 2)
        vector = self.library.get_vector(session, vector_name, layer, seed)
        needed = 0
        try:  # one row per α of the grid
            needed = guard.prompt(handle, prompt, rows=len(GRID))
            calibrate = steering_kind(vector) == "static" and (len(vector.layers) == 1 or layer in vector.layers)
        except UserError as exc:
            if exc.key != "request_too_large":
                raise
            calibrate = False  # a long prompt: the vector's own range, rather than a sweep over budget
        if not calibrate:
            rng = vector.alpha_range
            return float(max(abs(rng[0]), abs(rng[1]))) if rng else 1.0
        direction = vector.direction(layer if layer in vector.directions else None)
        try:
            with guard.reserve(needed):
                kl = mean_kl_curve(handle, direction, layer, GRID, (prompt,))
        except expected_errors() as exc:
            raise UserError("explore_failed", detail=said_of(exc)) from None
        return round(alpha_at_kl(GRID, kl, KL_AT_MAX), 4)

    def vocab_projection(self, session: str | None, vector_name: str | None, layer: int | None, seed: int = 0,
                         top_k: int = 12) -> pd.DataFrame:
        from ..model.analysis import vocab_projection

        handle = self.models.handle
        vector = self.library.get_vector(session, vector_name, layer, seed)
        if steering_kind(vector) == "input":
            raise UserError("input_dependent_projection")
        direction = vector.direction(layer if layer in vector.directions else None)
        return vocab_projection(handle, direction, top_k=top_k)

    def sampling(self, max_new_tokens: int = 32, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                 repetition_penalty: float = 1.0, seed: int = 0, greedy: bool | None = None,
                 max_delta_logit: float = 0.0, stop=(), alternatives: int = 5, unsteered: bool = True,
                 counterfactual: bool = True):
        from ..model.generation import GenerationError, Sampling

        number = self.shared.guard.number
        stop = [stop] if isinstance(stop, str) else stop
        if not isinstance(stop, (list, tuple)) or len(stop) > MAX_STOP_STRINGS:
            raise UserError("bad_stop", limit=MAX_STOP_STRINGS)
        # a stop string of white space is a stop string ("\n" is OpenAI clients' commonest): only "" is none
        stop = tuple(guards.text(x, "stop", MAX_STOP_CHARS, allow_empty=True) for x in stop)
        if any(x == "" for x in stop):
            raise UserError("text_empty", what="stop")
        s = Sampling(max_new_tokens=number(max_new_tokens, "max_new_tokens", integer=True, low=1,
                                           high=self.shared.policy.max_new_tokens),
                     temperature=0.0 if guards.flag(greedy or False, "greedy") else
                     number(temperature, "temperature", low=0, high=MAX_TEMPERATURE),
                     top_k=number(top_k or 0, "top_k", integer=True, low=0, high=MAX_VOCAB_TOP_K),
                     top_p=number(top_p, "top_p", low=0, high=1),
                     repetition_penalty=number(repetition_penalty, "repetition_penalty", low=0,
                                               high=MAX_REPETITION_PENALTY),
                     seed=self.shared.guard.seed(seed),
                     max_delta_logit=number(max_delta_logit or 0.0, "max_delta_logit", low=0,
                                            high=MAX_DELTA_LOGIT_LIMIT), stop=stop,
                     alternatives=number(alternatives, "top_logprobs", integer=True, low=0, high=MAX_ALTERNATIVES),
                     # the rows beside the steered one (issue #49): the API asks for them only when it answers
                     # with them (compare, Δlogit in log-probabilities); the page always shows both
                     unsteered=guards.flag(unsteered, "unsteered"),
                     counterfactual=guards.flag(counterfactual, "counterfactual"))
        try:
            s.validate()  # the open ends: top-p and the repetition penalty above 0
        except GenerationError as exc:
            raise UserError("bad_sampling", detail=first_line(exc)) from None
        return s

    def delta_limit(self, session: str | None, vector_name: str | None, requested=None) -> float:
        """The Δlogit limit a generation steers under: ``requested`` where given (0 = off), else the vector's own
        bound (a constrained TSV vector states the one it was calibrated to), else off.

        ``requested`` is checked with the other sampling values (:meth:`sampling`); ``None`` or ``""`` is "not
        given" (an empty field, or a client that sends the arguments from before the limit existed).
        """
        from ..steering_spec import Spec

        if requested is not None and requested != "":
            return requested
        if isinstance(vector_name, Spec):  # several vectors: the tightest bound any of them states
            bounds = [self.delta_limit(session, None if t.random else t.source) for t in vector_name.terms]
            return min([b for b in bounds if b > 0], default=0.0)
        if not vector_name or vector_name == RANDOM:
            return 0.0
        own = self.library.get_vector(session, vector_name).max_delta_logit
        return own if own is not None else 0.0

    def stream_generate(self, session: str | None, prompt: str, vector_name: str | None, layer: int | None,
                        alpha: float, relative: bool = True, seed: int = 0, sampling=None,
                        supersede: bool = False) -> Iterator[Frame]:
        """Unsteered and steered continuations, yielded as snapshots while they decode.

        The request joins the engine's decode batch beside every other
        session's generations (each gets exactly what it would get alone).
        This generator yields the newest snapshot whenever the consumer asks
        (intermediate ones are skipped if the consumer is slower than the
        model); closing it early drops the request's rows at the next step.
        A session has at most ``policy.generations_per_session`` at once; with ``supersede`` (the page's
        Explore generations) the newest cancels every older one (Sessions.generation_slot), and each
        one it cancelled ends without a final frame.
        """
        settings = {"vector": vector_name or RANDOM, "layer": layer, "alpha": alpha, "relative": relative,
                    "seed": seed}
        yield from self.stream_generate_for(session, prompt, self._one(vector_name, layer, alpha, relative, seed),
                                            sampling, settings, supersede)

    def stream_generate_for(self, session: str | None, prompt: str, steering, sampling=None,
                            settings: dict | None = None, supersede: bool = False,
                            turn: bool = False) -> Iterator[Frame]:
        """:meth:`stream_generate` for a steering spec of one or more terms; ``settings`` (the one-vector
        request's, where it was one) is kept with the last generation for Save result.  ``turn``: a chat turn's
        generation, which takes the place of the page's Explore generations at the session's cap (they are
        hidden while chatting) and is never cancelled by one.  The page's generations wait ``policy.page_wait_s``
        for a place (those they cancelled still count until they unwind); an API caller's are refused at once."""
        from ..model.engine import EngineBusy
        from ..model.generation import Request, row_kinds
        from ..steering_spec import parse

        sampling = sampling or self.sampling()
        guard = self.shared.guard
        s = self.shared.find(session)
        engine = self.models.engine()
        # the unsteered side this session decoded last time for the same prompt and sampling: then only the
        # steered and counterfactual rows decode (unsteered_memo)
        memo_key = unsteered_memo.key(prompt, sampling)
        kept_side = unsteered_memo.recall(s.cache, engine.handle, memo_key)
        decoded = dataclasses.replace(sampling, unsteered=False) if kept_side is not None else sampling
        # its rows (the page's three: unsteered, steered, counterfactual) over the prompt and every new token
        needed = guard.prompt(self.models.handle, prompt, rows=len(row_kinds(decoded)),
                              new_tokens=sampling.max_new_tokens)
        steers = self.library.steers_for(session, steering)
        try:
            request = Request.make(engine.handle, prompt, steers, decoded)
        except expected_errors() as exc:
            raise UserError("generation_failed", detail=said_of(exc)) from None
        if kept_side is not None:
            request.result.unsteered = kept_side

        def keep_unsteered(result) -> None:
            if kept_side is None and request.done and not request.cancelled:
                unsteered_memo.remember(s.cache, engine.handle, memo_key, result.unsteered)
        # the KV cache is what a generation keeps while it decodes; its prefill's scratch is bounded per request,
        # and the decode batch holds at most policy.batch_requests of them
        wait_s = self.shared.policy.page_wait_s if turn or supersede else 0.0
        with self.shared.sessions.generation_slot(s, supersede or turn, supersedable=supersede, wait_s=wait_s) \
                as hold, guard.reserve(needed.kv):
            try:
                ticket = engine.submit(request)
            except EngineBusy as exc:
                raise UserError("busy", detail=first_line(exc)) from None
            hold(ticket)
            kept = {"prompt": prompt, **(settings or {}), "steering": parse(steering).as_dict(),
                    "sampling": dataclasses.asdict(sampling)}
            yield from _frames(s, prompt, ticket, kept, len(request.ids), keep_unsteered)

    def sweep(self, session: str | None, prompt: str, vector_name: str | None, layer: int | None,
              alpha_max: float = 1.0, relative: bool = True, seed: int = 0, points: int = 21,
              target: str | None = None, alphas=None, held=None) -> pd.DataFrame:
        """Dose-response over α in [-alpha_max, alpha_max] (user units) from one batched pass, or over the
        given ``alphas`` (the CLI's list).  ``held``: a steering spec of other terms applied unchanged at every α
        (the page's added vectors), or None."""
        from ..model.analysis import sweep
        from ..model.hooks import Steer

        guard, limit = self.shared.guard, self.shared.policy.max_sweep_points
        if alphas is None:
            points = guard.number(points, "points", integer=True, low=3, high=limit)
            alpha_max = abs(guard.alpha(alpha_max, "alpha_max"))
            if alpha_max == 0:
                raise UserError("number_not_positive", what="alpha_max", value="0")
            alphas = [alpha_max * (2 * i / (points - 1) - 1) for i in range(points)]
        elif not isinstance(alphas, (list, tuple)) or not 1 <= len(alphas) <= limit:
            raise UserError("bad_alphas", limit=limit)
        alphas = [guard.alpha(a) for a in alphas]
        needed = guard.prompt(self.models.handle, prompt, rows=len(alphas))  # one row per α
        target = guards.text(target, "target", MAX_TARGET_CHARS, allow_empty=True).strip() or None
        unit = self.library.steers(session, vector_name, layer, 1.0, relative, seed)
        if len(unit) != 1 or not isinstance(unit[0], Steer) or unit[0].vector is None:
            raise UserError("sweep_unsupported")
        steer = unit[0]
        scale = float(steer.alpha.reshape(-1)[0])
        handle = self.models.handle
        others = self.library.steers_for(session, held) if held is not None else []
        if not all(isinstance(s, Steer) for s in others):
            # the prefix is cached below the lowest steered block, where only residual steers can act
            raise UserError("sweep_unsupported")
        try:
            with guard.reserve(needed):
                frame = sweep(handle, prompt, steer.vector, steer.layer, [a * scale for a in alphas],
                              positions=steer.positions, target=target, held=others)
        except expected_errors() as exc:
            raise UserError("explore_failed", detail=said_of(exc)) from None
        frame = frame.rename(columns={"alpha": "raw_alpha"})
        frame.insert(0, "alpha", alphas)
        return frame


def last_frame(frames: Iterator[Frame]) -> Frame | None:
    """A whole generation: the final frame of a stream (each frame before it is the one the consumer skipped)."""
    frame = None
    for frame in frames:
        pass
    return frame


def _frames(s: Session, prompt: str, ticket, settings: dict | None = None, prompt_tokens: int = 0,
            on_final=None) -> Iterator[Frame]:
    """A ticket's events as frames (the newest each time), then the final one; errors as one line each.
    ``on_final(result)`` runs before the final frame goes out (whoever reads the frames may stop there)."""
    from ..model.engine import EngineBusy, EngineTimeout

    def frame(result, done: bool) -> Frame:
        return Frame(prompt=prompt, unsteered_text=result.unsteered.text, steered_text=result.steered.text,
                     unsteered_tokens=list(result.unsteered.tokens), steered_tokens=list(result.steered.tokens),
                     done=done, steps=result.steps, prompt_tokens=prompt_tokens,
                     unsteered_finished=result.unsteered.finished, steered_finished=result.steered.finished)

    last = None
    try:
        for event in ticket.newest():
            last = event.result
            yield frame(last, False)
    except EngineTimeout as exc:
        raise UserError("generation_timeout", detail=first_line(exc)) from None
    except EngineBusy as exc:  # the model was replaced while this request waited
        raise UserError("busy", detail=first_line(exc)) from None
    except Exception as exc:  # noqa: BLE001 - whatever the engine met for this request, in one line
        raise UserError("generation_failed", detail=said_of(exc)) from None
    finally:
        ticket.cancel()
    if last is not None and not ticket.superseded:  # a superseded generation's partial text is not a result
        if on_final is not None:
            on_final(last)
        final = frame(last, True)
        s.last_generation = {**final.as_dict(), "settings": settings or {}}  # what Save result keeps
        yield final
