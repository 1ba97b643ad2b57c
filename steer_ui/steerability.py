"""Does it steer, or did one prompt get lucky?  One vector over many prompts at once (issue #31).

Per prompt, from one batched side-by-side decode (the engine's, as for many users; ``Sampling.measure``
records what the decode already computes) and, for the concept score, a batched read of both texts up to the
vector's layer:

* ``kl``: KL(unsteered ‖ steered) of the first generated token, nats (the decode's first step).
* ``fluency``: the steered text's mean log-probability per token under the unsteered model (the
  counterfactual row: the unsteered model fed the steered tokens); ``fluency_unsteered`` the same for the
  unsteered text (its own row), so their difference is what steering costs in fluency.
* ``distinct``: the share of distinct tokens in the steered text (1 = no repeats; loops drive it down).
* ``concept_score``: how far the steered text moves along the vector's own concept compared with the
  unsteered text (:func:`readout_for`).  For a direction vector, how far the steered text's own residual at
  the vector's layer, read by the unsteered model, lies along the vector beyond the unsteered text's, in
  standard deviations of the unsteered texts' per-token projections (so 1 = one typical spread); for L2S
  the same along each prompt's own predicted vector g(prompt); for a detector (TSV) its p(truthful) of the
  steered text minus that of the unsteered text.  ``summary["concept_units"]`` says which.

With contrastive pairs (prompt, positive, negative), the behaviour itself: the teacher-forced margin
log p(positive) − log p(negative) at every α of a grid (one batched pass per completion, each α a row), and
each prompt's **steerability**, the least-squares slope of its margin over α (Tan et al., NeurIPS 2024, who
found many inputs *anti-steerable*: their margin moves against α).
"""
from __future__ import annotations

import math
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch

from .model.analysis import residual_reads, teacher_forced
from .messages import Said

MAX_PROMPTS = 64
GRID_POINTS = 9  # α values of a steerability grid, −α max … +α max


@dataclass
class Generated:
    """One prompt's side-by-side generation: the texts, the steered token ids and what the decode measured
    (``Sampling.measure``): the first token's KL and each text's mean log-probability under the unsteered
    model (the steered text's from the counterfactual row)."""
    prompt: str
    unsteered: str
    steered: str
    steered_ids: list[int] = field(default_factory=list)
    kl: float | None = None
    fluency: float | None = None
    fluency_unsteered: float | None = None

    @classmethod
    def of(cls, prompt: str, result) -> "Generated":
        """From a finished :class:`~steer_ui.model.generation.SideBySide` decoded with ``measure``."""
        def mean(values):
            return float(np.mean(values)) if values else None

        steered = result.steered.tokens
        return cls(prompt=prompt, unsteered=result.unsteered.text, steered=result.steered.text,
                   steered_ids=[t.token_id for t in steered], kl=result.first_kl,
                   fluency=mean([t.unsteered_logprob for t in steered if t.unsteered_logprob is not None]),
                   fluency_unsteered=mean([t.logprob for t in result.unsteered.tokens]))


def requests_for(handle, prompts: Sequence[str], steers: Sequence, sampling) -> list:
    """One side-by-side request per prompt, each measuring what the table reads (``Sampling.measure``)."""
    from dataclasses import replace

    from .model.generation import Request

    measuring = replace(sampling, measure=True)
    return [Request.make(handle, prompt, steers, measuring) for prompt in prompts]


def alpha_grid(alpha_max: float, points: int = GRID_POINTS) -> list[float]:
    """``points`` values evenly over [−alpha_max, alpha_max], with 0 exactly in the middle."""
    half = (points - 1) // 2
    return [float(f"{alpha_max * i / half:.12g}") for i in range(-half, half + 1)]


PROGRESS_POLL_S = 0.5  # how often a comparison reports while no prompt finishes (its Cancel is read there)


def generate_all(engine, requests: Sequence, in_flight: int, prompts: Sequence[str],
                 seconds: float | None = None,
                 progress: Callable[[int, int], None] | None = None) -> list[Generated | None]:
    """Every request's final side-by-side result through ``engine``, at most ``in_flight`` of them in the decode
    batch at once (so one comparison never takes the whole batch from other visitors), each place refilled the
    moment its generation ends (continuous batching: a wave no longer waits for its longest member; a visitor who
    asks meanwhile queues before the comparison's next prompt).

    ``seconds``: the whole comparison's time limit.  Past it the prompts still running stop and those not started
    are skipped: their places in the result (which stays aligned with ``requests``) are None, and the caller
    says so.  Without it each generation has the engine's own limit, and no place is None.

    ``progress(done, total)`` is told as prompts finish (and every ``PROGRESS_POLL_S`` meanwhile); raising from it
    (a Cancel) stops the comparison as any failure does.
    """
    from .model.engine import EngineTimeout

    stop = threading.Event()
    deadline = None if seconds is None else time.monotonic() + seconds

    def one(i: int) -> Generated | None:
        if stop.is_set():
            raise RuntimeError("the comparison stopped")
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            return None
        ticket = engine.submit(requests[i], timeout_seconds=left)
        try:
            last = None
            for event in ticket:
                last = event.result
                if stop.is_set():
                    raise RuntimeError("the comparison stopped")
        except EngineTimeout:
            if deadline is None:
                raise
            return None  # the comparison's time is up: this prompt is left out
        finally:
            ticket.cancel()
        if last is None:
            raise RuntimeError("a generation ended without a result")
        return Generated.of(prompts[i], last)

    with ThreadPoolExecutor(max_workers=max(1, min(in_flight, len(requests))),
                            thread_name_prefix="compare") as pool:
        futures = [pool.submit(one, i) for i in range(len(requests))]
        try:
            pending = set(futures)
            while pending:
                _done, pending = wait(pending, timeout=PROGRESS_POLL_S, return_when=FIRST_COMPLETED)
                if progress is not None:
                    progress(len(futures) - len(pending), len(futures))
            return [future.result() for future in futures]
        except BaseException:
            stop.set()  # the others give up their places at their next step
            for future in futures:
                future.cancel()
            raise


def distinct_share(token_ids: Sequence[int]) -> float | None:
    return len(set(token_ids)) / len(token_ids) if token_ids else None


SD = "sd"  # concept score units: standard deviations of the unsteered texts' projections
DELTA_P_TRUTHFUL = "delta_p_truthful"  # a detector's p(truthful), steered text minus unsteered text


@dataclass
class Readout:
    """How a vector's concept is read from a text: along ``directions`` (one unit row per prompt) at the output
    of block ``layer``, or by a ``detector`` scoring (prompt, text) pairs; ``units`` is what the page states."""
    units: str
    layer: int | None = None
    directions: torch.Tensor | None = None
    detector: Callable[[list], list] | None = None


def readout_for(handle, vector, unit_steer, prompts: Sequence[str]) -> Readout | None:
    """The vector's own read-out: a detector's score (TSV), L2S's per-prompt vector g(prompt), or the one
    direction of a direction vector; None where there is none (several layers, per-head vectors)."""
    from .methods.base import method_of

    method = method_of(vector) if vector is not None else None
    if method is not None and hasattr(method, "score"):
        return Readout(units=DELTA_P_TRUTHFUL, detector=lambda pairs: method.score(handle, vector, pairs))
    if vector is not None and vector.method == "l2s":
        from .methods.l2s.steering import layers_of, predict

        z = predict(handle, vector, list(prompts)).float().cpu()
        return Readout(units=SD, layer=layers_of(vector)[0], directions=z / z.norm(dim=-1, keepdim=True).clamp_min(1e-12))
    direction = getattr(unit_steer, "vector", None)
    if direction is None or direction.dim() != 1:
        return None
    unit = direction.float().cpu() / direction.float().norm().clamp_min(1e-12)
    return Readout(units=SD, layer=unit_steer.layer, directions=unit.expand(len(prompts), -1))


def mean_logprob(handle, prompt: str, text: str) -> float | None:
    """Mean log-probability per token of ``text`` after ``prompt`` under the unsteered model (None: no text),
    from a teacher-forced pass (the default view reads a text it did not decode)."""
    return float(teacher_forced(handle, prompt, text).logprobs[0].mean()) if text else None


def concept_from_projections(pairs: Sequence[tuple]) -> list[float | None]:
    """Per prompt, from its (unsteered, steered) per-token projections: the steered mean minus the unsteered
    mean over the pooled standard deviation of every unsteered text's per-token projections."""
    unsteered = [u for u, _s in pairs if u is not None]
    pooled = torch.cat(unsteered) if unsteered else None
    spread = float(pooled.std()) if pooled is not None and pooled.numel() >= 2 else 0.0
    if not spread > 0:
        return [None] * len(pairs)
    return [None if u is None or s is None else float((s.mean() - u.mean()) / spread) for u, s in pairs]


def margins(handle, pairs: Sequence, unit_steer, raw_alphas: Sequence[float], held: Sequence = ()) -> np.ndarray:
    """(pairs, alphas) teacher-forced margins log p(positive) − log p(negative) after each pair's prompt, with
    ``unit_steer`` at each raw α (one batched pass per completion: each α a row) and the ``held`` steers (other
    vectors of a spec) unchanged in every row."""
    from .methods.l2s.pairs import join_text

    alphas = torch.tensor([float(a) for a in raw_alphas])
    steer = unit_steer.with_alpha(alphas)
    out = np.zeros((len(pairs), len(alphas)))
    for i, pair in enumerate(pairs):
        totals = []
        for completion in (pair.positive, pair.negative):
            prompt, text = join_text(pair.prompt, completion)
            totals.append(teacher_forced(handle, prompt, text, [steer, *held], rows=len(alphas)).logprobs.sum(-1))
        out[i] = (totals[0] - totals[1]).numpy()
    return out


def slopes(alphas: Sequence[float], margin_rows: np.ndarray) -> np.ndarray:
    """Each row's least-squares slope of margin over α (nats per unit α)."""
    x = np.asarray(alphas, dtype=float)
    x = x - x.mean()
    return (margin_rows - margin_rows.mean(axis=1, keepdims=True)) @ x / float(x @ x)


def summarise(rows: list[dict], alphas: Sequence[float] | None, alpha: float, steerability: np.ndarray | None,
              margin_rows: np.ndarray | None) -> dict:
    """The numbers a person quotes: how many prompts steer the intended way, how many against, what fluency
    it costs; each a plain number (None where it was not measured)."""
    def mean(values):
        kept = [v for v in values if v is not None and math.isfinite(v)]
        return float(np.mean(kept)) if kept else None

    drops = [r["fluency"] - r["fluency_unsteered"] for r in rows
             if r["fluency"] is not None and r["fluency_unsteered"] is not None]
    summary = {"prompts": len(rows), "alpha": alpha, "alphas": list(alphas) if alphas is not None else None,
               "kl_mean": mean([r["kl"] for r in rows]), "fluency_drop": mean(drops),
               "distinct_mean": mean([r["distinct"] for r in rows]),
               "concept_score_mean": mean([r["concept_score"] for r in rows]),
               "steerability_mean": None, "steerability_std": None, "anti_steerable_share": None,
               "intended_share": None, "flip_share": None, "margin_at_alpha": None}
    if steerability is not None and len(steerability):
        signs = np.sign(margin_rows)
        summary.update(steerability_mean=float(steerability.mean()), steerability_std=float(steerability.std()),
                       anti_steerable_share=float((steerability < 0).mean()),
                       intended_share=float((steerability > 0).mean()),
                       flip_share=float(((signs.min(axis=1) < 0) & (signs.max(axis=1) > 0)).mean()),
                       margin_at_alpha=float(np.mean([np.interp(alpha, alphas, m) for m in margin_rows])))
    return summary


def compare(handle, generated: Sequence[Generated], steers: Sequence, unit_steer=None, scale: float = 1.0,
            pairs: Sequence | None = None, alphas: Sequence[float] | None = None, alpha: float = 0.0,
            progress: Callable[[float, str], None] | None = None, vector=None, held: Sequence = ()) -> dict:
    """``{"rows": [...], "summary": {...}}`` for prompts already generated side by side with ``steers``.

    ``unit_steer``: the vector at raw α 1 when it is one steer (else None: no margins); ``scale``: raw α per
    user α; ``vector``: the steering vector itself, whose method decides the concept read-out
    (:func:`readout_for`).  ``pairs`` (aligned with ``generated``) and ``alphas`` (user units): the margins and
    each prompt's steerability; ``held``: other vectors' steers, unchanged along the margins' α (the page's added
    vectors).
    """
    report = progress or (lambda _f, _m="": None)
    readout = readout_for(handle, vector, unit_steer, [g.prompt for g in generated])
    along = readout is not None and readout.directions is not None
    rows = [{"prompt": g.prompt, "unsteered": g.unsteered, "steered": g.steered, "kl": g.kl, "fluency": g.fluency,
             "fluency_unsteered": g.fluency_unsteered, "distinct": distinct_share(g.steered_ids),
             "concept_score": None} for g in generated]
    if along:  # both texts of every prompt read at the vector's layer, in a few batched passes
        report(0.2, Said("progress_concept_readout"))
        reads = residual_reads(handle, [(g.prompt, t) for g in generated for t in (g.unsteered, g.steered)],
                               readout.layer)
        projections = [tuple(None if r is None else r @ readout.directions[i] for r in reads[2 * i:2 * i + 2])
                       for i in range(len(generated))]
        for row, score in zip(rows, concept_from_projections(projections)):
            row["concept_score"] = score
    elif readout is not None:  # a detector scores both texts of every prompt in one batched call
        report(0.6, Said("progress_detector_scores"))
        both = [(g.prompt, t) for g in generated for t in (g.unsteered, g.steered) if t.strip()]
        scores = dict(zip(both, readout.detector(both))) if both else {}
        for row, g in zip(rows, generated):
            u, s_ = scores.get((g.prompt, g.unsteered)), scores.get((g.prompt, g.steered))
            row["concept_score"] = None if u is None or s_ is None else float(s_) - float(u)
    steerability = margin_rows = None
    if pairs and alphas and unit_steer is not None:
        report(0.8, Said("progress_margins"))
        margin_rows = margins(handle, pairs, unit_steer, [a * scale for a in alphas], held)
        steerability = slopes(alphas, margin_rows)
        for row, m, slope in zip(rows, margin_rows, steerability):
            row["margins"] = [float(v) for v in m]
            row["steerability"] = float(slope)
    report(1.0, Said("progress_done"))
    summary = summarise(rows, alphas, alpha, steerability, margin_rows)
    summary["concept_units"] = readout.units if readout is not None else None
    return {"rows": rows, "summary": summary}
