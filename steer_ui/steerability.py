"""Does it steer, or did one prompt get lucky?  One vector over many prompts at once (issue #31).

Per prompt, from one batched side-by-side decode (the engine's, as for many users) and a few teacher-forced
passes of the *unsteered* model:

* ``kl``: KL(unsteered ‖ steered) of the first generated token, nats.
* ``fluency``: the steered text's mean log-probability per token under the unsteered model (what the
  counterfactual row reads, for the whole text); ``fluency_unsteered`` the same for the unsteered text, so
  their difference is what steering costs in fluency.
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
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch

from .model.analysis import next_token, teacher_forced

MAX_PROMPTS = 64
GRID_POINTS = 9  # α values of a steerability grid, −α max … +α max


@dataclass
class Generated:
    """One prompt's side-by-side generation (the texts and the steered token ids)."""
    prompt: str
    unsteered: str
    steered: str
    steered_ids: list[int] = field(default_factory=list)


def alpha_grid(alpha_max: float, points: int = GRID_POINTS) -> list[float]:
    """``points`` values evenly over [−alpha_max, alpha_max], with 0 exactly in the middle."""
    half = (points - 1) // 2
    return [float(f"{alpha_max * i / half:.12g}") for i in range(-half, half + 1)]


def generate_all(engine, requests: Sequence, in_flight: int, prompts: Sequence[str]) -> list[Generated]:
    """Every request's final side-by-side result through ``engine``, at most ``in_flight`` of them in the decode
    batch at once (so one comparison never takes the whole batch from other visitors)."""
    out: list[Generated | None] = [None] * len(requests)
    for start in range(0, len(requests), max(1, in_flight)):
        tickets = [(i, engine.submit(requests[i])) for i in range(start, min(len(requests), start + in_flight))]
        try:
            for i, ticket in tickets:
                last = None
                for event in ticket:
                    last = event.result
                if last is None:
                    raise RuntimeError("a generation ended without a result")
                out[i] = Generated(prompt=prompts[i], unsteered=last.unsteered.text, steered=last.steered.text,
                                   steered_ids=[t.token_id for t in last.steered.tokens])
        finally:
            for _i, ticket in tickets:
                ticket.cancel()
    return [g for g in out if g is not None]


def first_token_kl(handle, prompt: str, steers: Sequence) -> float:
    return float(next_token(handle, prompt, steers, top_k=1).kl)


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


def read_text(handle, prompt: str, text: str, layer: int | None = None,
              direction: torch.Tensor | None = None) -> tuple[float | None, torch.Tensor | None]:
    """One teacher-forced pass of the unsteered model over ``text`` after ``prompt``: its mean log-probability
    per token (fluency) and, with ``layer`` and ``direction``, the per-token projections of its residual at that
    block's output on the unit ``direction``.  (None, None) for an empty text."""
    if not text:
        return None, None
    read = teacher_forced(handle, prompt, text, record=layer if direction is not None else None)
    projections = read.residual[0] @ direction if direction is not None else None
    return float(read.logprobs[0].mean()), projections


def mean_logprob(handle, prompt: str, text: str) -> float | None:
    """Mean log-probability per token of ``text`` after ``prompt`` under the unsteered model (None: no text)."""
    return read_text(handle, prompt, text)[0]


def concept_from_projections(pairs: Sequence[tuple]) -> list[float | None]:
    """Per prompt, from its (unsteered, steered) per-token projections: the steered mean minus the unsteered
    mean over the pooled standard deviation of every unsteered text's per-token projections."""
    unsteered = [u for u, _s in pairs if u is not None]
    pooled = torch.cat(unsteered) if unsteered else None
    spread = float(pooled.std()) if pooled is not None and pooled.numel() >= 2 else 0.0
    if not spread > 0:
        return [None] * len(pairs)
    return [None if u is None or s is None else float((s.mean() - u.mean()) / spread) for u, s in pairs]


def margins(handle, pairs: Sequence, unit_steer, raw_alphas: Sequence[float]) -> np.ndarray:
    """(pairs, alphas) teacher-forced margins log p(positive) − log p(negative) after each pair's prompt, with
    ``unit_steer`` at each raw α (one batched pass per completion: each α a row)."""
    from .methods.l2s.pairs import join_text

    alphas = torch.tensor([float(a) for a in raw_alphas])
    steer = unit_steer.with_alpha(alphas)
    out = np.zeros((len(pairs), len(alphas)))
    for i, pair in enumerate(pairs):
        totals = []
        for completion in (pair.positive, pair.negative):
            prompt, text = join_text(pair.prompt, completion)
            totals.append(teacher_forced(handle, prompt, text, [steer], rows=len(alphas)).logprobs.sum(-1))
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
            progress: Callable[[float, str], None] | None = None, vector=None) -> dict:
    """``{"rows": [...], "summary": {...}}`` for prompts already generated side by side with ``steers``.

    ``unit_steer``: the vector at raw α 1 when it is one steer (else None: no margins); ``scale``: raw α per
    user α; ``vector``: the steering vector itself, whose method decides the concept read-out
    (:func:`readout_for`).  ``pairs`` (aligned with ``generated``) and ``alphas`` (user units): the margins and
    each prompt's steerability.
    """
    report = progress or (lambda _f, _m="": None)
    readout = readout_for(handle, vector, unit_steer, [g.prompt for g in generated])
    along = readout is not None and readout.directions is not None
    rows, projections = [], []
    for i, g in enumerate(generated):
        report(i / max(1, len(generated)) * 0.6, f"prompt {i + 1} of {len(generated)}")
        # one pass per text gives its fluency and, for a direction, its projections
        layer, direction = (readout.layer, readout.directions[i]) if along else (None, None)
        fluency_u, proj_u = read_text(handle, g.prompt, g.unsteered, layer, direction)
        fluency_s, proj_s = read_text(handle, g.prompt, g.steered, layer, direction)
        projections.append((proj_u, proj_s))
        rows.append({"prompt": g.prompt, "unsteered": g.unsteered, "steered": g.steered,
                     "kl": first_token_kl(handle, g.prompt, steers), "fluency": fluency_s,
                     "fluency_unsteered": fluency_u, "distinct": distinct_share(g.steered_ids),
                     "concept_score": None})
    if along:
        for row, score in zip(rows, concept_from_projections(projections)):
            row["concept_score"] = score
    elif readout is not None:  # a detector scores both texts of every prompt in one batched call
        report(0.6, "detector scores")
        both = [(g.prompt, t) for g in generated for t in (g.unsteered, g.steered) if t.strip()]
        scores = dict(zip(both, readout.detector(both))) if both else {}
        for row, g in zip(rows, generated):
            u, s_ = scores.get((g.prompt, g.unsteered)), scores.get((g.prompt, g.steered))
            row["concept_score"] = None if u is None or s_ is None else float(s_) - float(u)
    steerability = margin_rows = None
    if pairs and alphas and unit_steer is not None:
        report(0.8, "margins over α")
        margin_rows = margins(handle, pairs, unit_steer, [a * scale for a in alphas])
        steerability = slopes(alphas, margin_rows)
        for row, m, slope in zip(rows, margin_rows, steerability):
            row["margins"] = [float(v) for v in m]
            row["steerability"] = float(slope)
    report(1.0, "done")
    summary = summarise(rows, alphas, alpha, steerability, margin_rows)
    summary["concept_units"] = readout.units if readout is not None else None
    return {"rows": rows, "summary": summary}
