"""Training a TSV: cache the frozen blocks once, two stages of gradient steps on one vector, then the report.

Stage 1 trains on a few labelled exemplars; Sinkhorn pseudo-labels pick
confident unlabelled rows; stage 2 trains on both (Park et al., ICML 2025).
Our additions: the lm_head constraints of :mod:`steer_ui.methods.constraints`
(a hinge on the centred |Δlogit| above ``max_logit_change``, real and
direct-path, and a KL term) at the positions where a steered model generates
the answer (:func:`generation_positions`; the detector's last position is
left free), so the vector does not wreck generation; how the bound is made to
hold is ``bound_mode`` (default ``calibrated``: the detector is trained and
read at λ·v, and the saved steering strength s·λ·v is calibrated to the
bound on training rows); and like-for-like baselines on the same held-out
split.

Speed on a CPU: blocks 0..L never see ``v``, so every text is run through the
frozen model once (:func:`~steer_ui.methods.constraints.cache_prefix`); each
step re-runs only blocks L+1.. (:func:`~steer_ui.methods.constraints.run_suffix`).

λ is relative: ``lam`` × the mean residual norm at block L (Gemma 3 270M's
norms grow from ~140 at block 0 to ~35,000 at block 17, so no raw default
fits every layer).  The stored direction is λ·v, the exact vector added, so
steering with it at raw α = 1 is the training strength.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from ...limits import MAX_DELTA_LOGIT_LIMIT
from ...messages import Said
from ...model.architecture import with_dense_unembedding
from ...model.units import relative_scale, to_relative
from ...vector import SteeringVector, dataset_hash
from .. import constraints as C
from ..base import Progress, noop, parse_settings, settings_dict
from ..common import auroc, clean, fit_probe, sub_progress
from .data import CLASSES, TSVError, format_text, pick_exemplars, prefix_text, rows_of, split_groups, subsample_groups
from .maths import class_probs, ema_prototypes, select_confident, sinkhorn
from .settings import TSVSettings, default_layer


def _reps_of(handle, final_residual: torch.Tensor) -> torch.Tensor:
    normed = handle.arch.final_hidden(final_residual.to(handle.dtype)).float()
    return F.normalize(normed, dim=-1)


def _restrict(batches: Sequence[C.SuffixBatch], rows: set[int]) -> list[C.SuffixBatch]:
    """The cached batches cut down to the given dataset rows."""
    out = []
    for b in batches:
        keep = [p for p, i in enumerate(b.index) if i in rows]
        if keep:
            out.append(b if len(keep) == len(b) else b.select(keep))
    return out


def _chunks(parts: list, batch_size: int) -> list[list]:
    """Group cached sub-batches into optimiser steps of about ``batch_size`` rows."""
    steps, cur, n = [], [], 0
    for p in parts:
        cur.append(p)
        n += len(p[0])
        if n >= batch_size:
            steps.append(cur)
            cur, n = [], 0
    if cur:
        steps.append(cur)
    return steps


# ------------------------------------------------------- generation positions
def generation_positions(batch: C.SuffixBatch, n_answer: dict[int, int], rows: int | None = None,
                         where: str = "answer") -> tuple[list[int], list[int]]:
    """(rows, positions) index lists into a batch's (rows, seq) grid: where the constraints act.

    Logits at position j predict token j + 1.  ``answer``: the positions
    whose logits generate the answer, the last prompt token and every answer
    token but the last (for a statement: every token but the last).  The last
    position, the one the detector reads, is not among them: its logits
    would decide what follows the answer.  ``answer_and_end`` adds it;
    ``last`` is it alone.  Rows are left-padded, so the last position is the
    last real token of every row.  ``rows``: the first so many rows only.
    """
    seq = batch.input_ids.shape[1]
    rows = len(batch) if rows is None else min(rows, len(batch))
    lengths = batch.attention_mask.sum(-1).tolist() if batch.attention_mask is not None else [seq] * len(batch)
    r_idx, p_idx = [], []
    for p in range(rows):
        if where == "last":
            positions = [seq - 1]
        else:
            real = int(lengths[p])
            answer = max(1, min(int(n_answer[batch.index[p]]), real - 1))
            positions = list(range(seq - answer - 1, seq - 1)) + ([seq - 1] if where == "answer_and_end" else [])
        r_idx += [p] * len(positions)
        p_idx += positions
    return r_idx, p_idx


def at_positions(x: torch.Tensor, rows: list[int], positions: list[int]) -> torch.Tensor:
    """``x[rows, positions]`` for a (rows, seq, hidden) tensor: (n, hidden) float, on ``x``'s device."""
    return x[torch.tensor(rows, device=x.device), torch.tensor(positions, device=x.device)].float()


def answer_lengths(handle, frame, texts: Sequence[str], template: str, rows: Sequence[int]) -> dict[int, int]:
    """Tokens of each row's answer: the full text's tokens minus the prompt's (BOS alone for a statement)."""
    out = {}
    for i in rows:
        full = len(handle.tokenizer(texts[i]).input_ids)
        pre = prefix_text(frame.prompt[i], template)
        out[i] = max(1, full - (len(handle.tokenizer(pre).input_ids) if pre else 1))
    return out


@dataclass
class _Run:
    """One training run's result (the main one, its with/without-constraints twin, a sweep candidate)."""

    v: torch.Tensor
    prototypes: torch.Tensor
    curves: list[dict]
    pseudo: dict
    constrained: bool
    steering_scale: float = 1.0  # the steering strength is steering_scale·λ·v; the detector reads λ·v


def _train_run(handle, st: TSVSettings, lam_raw: float, targets: dict[int, torch.Tensor],
               exemplar_batches, unlabelled_batches, labels: Sequence[int], n_answer: dict[int, int],
               constrained: bool, progress: Progress, span: tuple[float, float]) -> _Run:
    """Stage 1, pseudo-labelling, stage 2 for one constraint setting.

    Every tensor made here lives on the model's device (``handle.device``);
    what the frozen blocks return lives where they put it, and the maths
    functions move their second operand to their first's device.
    """
    hidden, device = handle.arch.hidden_size, handle.device
    rng = random.Random(st.seed)
    v = torch.zeros(hidden, device=device, requires_grad=True)
    opt = torch.optim.AdamW([v], lr=st.lr)
    # "calibrated": the penalties train nothing; the steering strength alone is fitted to the bound afterwards
    use_logit = constrained and st.logit_penalty and st.bound_mode != "calibrated"
    use_kl = constrained and st.kl_penalty and st.bound_mode != "calibrated"
    penalised = use_logit or use_kl
    all_positions = penalised and st.penalty_positions != "last"
    # steering_scale: the penalties act at the steering strength scale·λ·v, in a pass of their own
    separate = penalised and st.bound_mode == "steering_scale"
    scale = 1.0
    target = st.bound_target * st.max_logit_change
    exemplar_rows = [i for b in exemplar_batches for i in b.index]
    if st.prototype_init == "class_means":
        reps = torch.cat([_reps_of(handle, b.final_last) for b in exemplar_batches])
        onehot = torch.stack([targets[i] for i in exemplar_rows])
        prototypes = ema_prototypes(torch.zeros(2, hidden, device=reps.device), reps, onehot, decay=0.0)
    else:
        gen = torch.Generator(device=device).manual_seed(st.seed)
        prototypes = F.normalize(torch.randn(2, hidden, generator=gen, device=device), dim=-1)
    curves: list[dict] = []
    total_epochs = max(1, st.init_epochs + (0 if st.supervised else st.aug_epochs))
    epoch_no = 0

    def run_epochs(parts_all: list[tuple[C.SuffixBatch, torch.Tensor]], epochs: int, stage: int) -> None:
        nonlocal prototypes, epoch_no, scale
        for _ in range(epochs):
            parts = parts_all[:]
            rng.shuffle(parts)
            loss_sum, rows_seen, correct, ex_seen, worst, projections = 0.0, 0, 0, 0, 0.0, 0
            for step in _chunks(parts, st.batch_size):
                opt.zero_grad()
                n_rows = sum(len(b) for b, _ in step)
                budget = min(st.penalty_rows, n_rows)
                step_worst = 0.0
                step_reps, step_targets = [], []
                for b, t in step:
                    added = lam_raw * v
                    if all_positions and not separate:
                        steered_all = C.run_suffix_all(handle, b, added)
                        final = steered_all[:, -1, :]
                    else:
                        final = C.run_suffix(handle, b, added)
                    reps = _reps_of(handle, final)
                    logits = st.kappa * reps @ prototypes.to(reps.device).T
                    t = t.to(reps.device)
                    ce = -(t * logits.log_softmax(-1)).sum()
                    loss = ce / n_rows
                    if penalised and budget > 0:
                        k = min(budget, len(b))
                        budget -= k
                        if separate:  # the penalised rows again, at the steering strength
                            added = scale * lam_raw * v
                            pen = b if k == len(b) else b.select(range(k))
                            if all_positions:
                                steered_all = C.run_suffix_all(handle, pen, added)
                            else:
                                final = C.run_suffix(handle, pen, added)
                        if all_positions:
                            r, pos = generation_positions(b, n_answer, k, st.penalty_positions)
                            # this sub-batch's share of the step's position budget, drawn afresh each step
                            quota = max(1, round(st.penalty_tokens * k / min(st.penalty_rows, n_rows)))
                            if len(r) > quota:
                                keep = sorted(rng.sample(range(len(r)), quota))
                                r, pos = [r[j] for j in keep], [pos[j] for j in keep]
                            base_at, steered_at = at_positions(b.final_all, r, pos), at_positions(steered_all, r, pos)
                        else:
                            base_at, steered_at = b.final_last[:k], final[:k]
                        lt, kt, w = C.penalties(handle, base_at, steered_at, added, st.max_logit_change,
                                                st.logit_reduction, use_logit, use_kl)
                        share = k / min(st.penalty_rows, n_rows)
                        loss = loss + share * (st.logit_weight * lt + st.kl_weight * kt).to(loss.device)
                        step_worst = max(step_worst, w)
                    loss.backward()
                    loss_sum += float(loss.detach()) * n_rows
                    rows_seen += len(b)
                    step_reps.append(reps.detach())
                    step_targets.append(t)
                    pred = logits.detach().argmax(-1).tolist()
                    for p, i in enumerate(b.index):
                        if i in exemplar_set:
                            ex_seen += 1
                            correct += int(pred[p] == int(labels[i]))
                opt.step()
                worst = max(worst, step_worst)
                if separate and step_worst > 0:
                    # the steering scale that, to first order, puts these positions at the target (at most 1)
                    scale = min(1.0, scale * target / step_worst)
                elif penalised and st.bound_mode == "projection" and step_worst > target:
                    # Projection: the hinge alone lets the vector's norm (its strength) outgrow the bound.  The
                    # step's worst centred |Δlogit| was measured at the vector before this step; scale the vector
                    # so that, to first order, it sits at the target on these positions.
                    with torch.no_grad():
                        v.mul_(target / step_worst)
                    projections += 1
                prototypes = ema_prototypes(prototypes, torch.cat(step_reps), torch.cat(step_targets), st.ema)
            epoch_no += 1
            curves.append({"epoch": epoch_no, "stage": stage, "loss": loss_sum / max(rows_seen, 1),
                           "exemplar_accuracy": correct / max(ex_seen, 1), "vector_norm": float(v.detach().norm()),
                           "max_abs_delta_logit_seen": worst if penalised else None,
                           "projections": projections, "steering_scale": scale if separate else None})
            lo, hi = span
            progress(lo + (hi - lo) * epoch_no / total_epochs,
                     Said("progress_tsv_epoch_constrained" if constrained else "progress_tsv_epoch_unconstrained",
                          epoch=epoch_no, epochs=total_epochs, loss=f"{curves[-1]['loss']:.3f}"))

    exemplar_set = set(exemplar_rows)
    ex_parts = [(b, torch.stack([targets[i] for i in b.index])) for b in exemplar_batches]
    run_epochs(ex_parts, st.init_epochs, 1)
    pseudo: dict[str, Any] = {"selected": 0, "counts": {c: 0 for c in CLASSES}}
    if not st.supervised and unlabelled_batches and st.aug_epochs > 0:
        with torch.no_grad():
            reps = torch.cat([_reps_of(handle, C.run_suffix(handle, b, lam_raw * v)) for b in unlabelled_batches])
        rows = [i for b in unlabelled_batches for i in b.index]
        ex_labels = [labels[i] for i in exemplar_rows]
        dist = [max(1e-3, ex_labels.count(c) / len(ex_labels)) for c in (0, 1)]
        logits = st.kappa * reps @ prototypes.to(reps.device).T
        plan = sinkhorn(logits, dist, st.sinkhorn_epsilon, st.sinkhorn_iterations)
        k = min(st.selected, max(2, len(rows) // 2))
        picked = select_confident(logits.softmax(-1), plan, k, dist).tolist()
        soft = {rows[p]: plan[p].to(device) for p in picked}
        hard = {r: int(s.argmax()) for r, s in soft.items()}
        pseudo = {
            "selected": len(soft), "unlabelled": len(rows), "k": k, "class_marginals": dist,
            "counts": {CLASSES[c]: sum(1 for h in hard.values() if h == c) for c in (0, 1)},
            # a diagnostic only: the hidden labels are never used for training
            "accuracy_vs_hidden_labels": (sum(int(labels[r] == h) for r, h in hard.items()) / len(hard))
            if hard else None,
        }
        aug = {**{i: targets[i] for i in exemplar_rows}, **soft}
        parts = [(b, torch.stack([aug[i] for i in b.index]))
                 for b in _restrict(exemplar_batches + unlabelled_batches, set(aug))]
        run_epochs(parts, st.aug_epochs, 2)
    return _Run(v=v.detach().clone(), prototypes=prototypes.detach().clone(), curves=curves, pseudo=pseudo,
                constrained=constrained, steering_scale=scale)


def calibrate_steering_scale(handle, batches, n_answer: dict[int, int], direction: torch.Tensor, scale: float,
                             target: float, where: str = "answer", tries: int = 4) -> tuple[float, list[dict]]:
    """The largest steering scale s ≤ 1 found whose max centred |Δlogit| at the batches' generation positions,
    steering with s·``direction``, is at most ``target``; and every (scale, max) tried.

    Starts from ``scale`` (training's running estimate) and rescales by
    target / measured (aiming 3 % below), as the Δlogit grows about
    linearly with the strength; backs off by 0.8 when a few such tries stay
    above the target.
    """
    def worst_at(s: float) -> float:
        worst = 0.0
        with torch.no_grad():
            for b in batches:
                if where == "last" or b.final_all is None:
                    base, steered = b.final_last, C.run_suffix(handle, b, s * direction)
                else:
                    r, pos = generation_positions(b, n_answer, where=where)
                    base = at_positions(b.final_all, r, pos)
                    steered = at_positions(C.run_suffix_all(handle, b, s * direction), r, pos)
                worst = max(worst, C.max_centred_delta(handle, base, steered))
        return worst

    tried: list[dict] = []
    s = min(1.0, scale)
    for _ in range(tries):
        w = worst_at(s)
        tried.append({"scale": s, "max_abs_delta_logit": w})
        if w <= target and (s >= 1.0 or w >= 0.9 * target):
            break
        s = min(1.0, s * 0.97 * target / max(w, 1e-12))  # aim a little below: the change is not quite linear
    while not any(t["max_abs_delta_logit"] <= target for t in tried) and s > 1e-6:
        s = min(t["scale"] for t in tried) * 0.8
        tried.append({"scale": s, "max_abs_delta_logit": worst_at(s)})
    feasible = [t["scale"] for t in tried if t["max_abs_delta_logit"] <= target]
    return (max(feasible) if feasible else s), tried


def _strengths_note(scale: float, bound_mode: str | None, detector_delta: float | None) -> str:
    """What a run's AUROC and max |Δlogit| are measured at, in words (the Train tab shows it beside them)."""
    if bound_mode is None:
        return "no constraints: detector and steering at the training strength"
    if scale == 1.0:
        return f"one strength for detecting and steering (bound enforced by {bound_mode})"
    trained = "trained without the penalties; " if bound_mode == "calibrated" else ""
    return (f"{trained}two strengths: the AUROC is the detector's, at the training strength λ·v (max |Δlogit| "
            f"{detector_delta:.3g} there; nothing is generated while scoring); max |Δlogit| is at the saved steering "
            f"strength, {scale:.3g} × λ·v, calibrated on training rows to the bound")


def _evaluate(handle, batches, runs: Sequence[tuple[torch.Tensor, torch.Tensor]], kappa: float,
              labels: Sequence[int], n_answer: dict[int, int], top_k: int = 10,
              progress: Progress | None = None) -> list[dict]:
    """Held-out p(truthful) scores, AUROC, and the Δlogit report at the training strength, per run.

    ``runs``: (added vector, prototypes) pairs, evaluated on the same rows in
    one pass over them (the unsteered logits are computed once for all).  The
    score reads the last position of the steered pass over the whole text, as
    training does.  Δlogit is measured at the generation positions
    (:func:`generation_positions`, ``answer``) and, apart, at the last
    position (the detector's, which decides what follows the answer).
    """
    scores = [[] for _ in runs]
    rows, at_answer, at_last = [], [[] for _ in runs], [[] for _ in runs]
    # which (row, answer token) each generation position is, for the positions' report (:func:`bound_check`)
    places: list[tuple[int, int, int]] = []
    with torch.no_grad():
        for k, b in enumerate(batches):
            if progress is not None:  # also how a job's cancel and time limit reach this loop
                progress(0.93, Said("progress_scoring_batch", batch=k + 1, batches=len(batches)))
            r, pos = generation_positions(b, n_answer, where="answer")
            steered_at, finals = [], []
            for n, (added, prototypes) in enumerate(runs):
                steered_all = C.run_suffix_all(handle, b, added)
                finals.append(steered_all[:, -1, :])
                steered_at.append(at_positions(steered_all, r, pos))
                scores[n] += class_probs(_reps_of(handle, finals[-1]), prototypes, kappa)[:, 1].tolist()
            rows += b.index
            first = {}
            for p_row, p in zip(r, pos):
                first.setdefault(p_row, p)  # positions run in order: a row's first predicts its first answer token
                places.append((b.index[p_row], p - first[p_row], int(b.input_ids[p_row, p + 1])))
            added_all = [added for added, _ in runs]
            for n, stats in enumerate(C.delta_stats(handle, at_positions(b.final_all, r, pos), steered_at, added_all)):
                at_answer[n].append(stats)
            for n, stats in enumerate(C.delta_stats(handle, b.final_last, finals, added_all)):
                at_last[n].append(stats)
    y = [labels[i] for i in rows]
    return [{"auroc": auroc(scores[n], y), "scores": dict(zip(rows, scores[n])),
             "delta": C.summarise_delta(handle, at_answer[n], top_k),
             "delta_last": C.summarise_delta(handle, at_last[n], top_k),
             "by_position": (places, torch.cat([s["max_abs_centred"] for s in at_answer[n]]).tolist()
                             if at_answer[n] else [])}
            for n in range(len(runs))]


def bound_check(handle, frame, by_position: tuple[list, list], limit: float, worst: int = 3) -> dict:
    """Where the held-out generation positions keep the |Δlogit| ``limit`` and where they break it.

    ``by_position``: :func:`_evaluate`'s ((row, answer token, token id) per
    position, centred max |Δlogit| per position).  The calibrated bound is
    an empirical margin: a text whose later blocks amplify any push breaks
    it at many of its positions at once, so the report counts rows as well
    as positions and names the ``worst`` rows, each at its worst position.
    """
    places, values = by_position
    over = [(v, place) for place, v in zip(places, values) if v > limit]
    by_row: dict[int, tuple[float, tuple]] = {}
    for place, v in zip(places, values):
        if place[0] not in by_row or v > by_row[place[0]][0]:
            by_row[place[0]] = (v, place)
    ranked = sorted(by_row.values(), key=lambda x: -x[0])[:worst]
    worst_rows = [{"prompt": frame.prompt[row], "answer": frame.completion[row], "answer_token": k,
                   "token": handle.tokenizer.decode([tok]), "max_abs_delta_logit": v} for v, (row, k, tok) in ranked]
    rows_over = len({place[0] for _, place in over})
    highest = max(values, default=0.0)
    broken = ""
    if over:
        w = worst_rows[0]
        answer = w["answer"] if len(w["answer"]) <= 60 else w["answer"][:59] + "…"
        broken = Said("tsv_bound_broken", over=len(over), rows_over=rows_over, rows=len(by_row),
                      worst=f"{w['max_abs_delta_logit']:.2f}", token=w["answer_token"], answer=repr(answer),
                      kept=f"{limit / highest:.2f}")
    note = Said("tsv_bound_held", limit=f"{limit:g}", kept=len(values) - len(over), positions=len(values), broken=broken)
    # What generation with the vector's limit does at the same positions (the Δlogit at a position depends only
    # on the tokens, so teacher-forced positions are what the limit sees): a step over the limit is scaled to it.
    with_limit = {"max_abs_delta_logit": min(highest, limit), "positions_limited": len(over),
                  "least_kept": min(1.0, limit / highest) if highest > 0 else 1.0}
    return {"limit": limit, "positions": len(values), "positions_over": len(over), "rows": len(by_row),
            "rows_over": rows_over, "worst_rows": worst_rows, "with_limit": with_limit, "note": note}


def _answer_logprob(handle, batches, n_answer: dict[int, int]) -> dict[int, float]:
    """Mean log-probability of the answer tokens under the unsteered model (the log-probability baseline)."""
    out = {}
    with torch.no_grad():
        for b in batches:
            r, pos = generation_positions(b, n_answer, where="answer")
            hidden = at_positions(b.final_all, r, pos)
            targets = at_positions(b.input_ids.unsqueeze(-1), r, [j + 1 for j in pos])[:, 0].long()
            logp = torch.cat([C.logits_of(handle, hidden[s:e]).log_softmax(-1)
                              .gather(1, targets[s:e, None].to(hidden.device))[:, 0]
                              for s, e in C.chunk_bounds(len(r))]).tolist()
            for p, i in enumerate(b.index):
                mine = [x for row, x in zip(r, logp) if row == p]
                out[i] = sum(mine) / len(mine)
    return out


def _baselines(handle, st: TSVSettings, train_batches, test_batches, exemplar_rows, labels,
               n_answer) -> dict:
    """AUROC of simple detectors on the same held-out rows.

    Like for like: the probe and the mean difference read what the detector
    reads (the final layer's last-token state after the final norm, without
    the vector), fitted on exactly TSV's exemplars; the probe on every
    training label is the ceiling; the answer's mean token log-probability and
    perplexity need no training.
    """
    import numpy as np

    def feats(batches, attr):
        rows = [i for b in batches for i in b.index]
        return rows, torch.cat([getattr(b, attr).float().cpu() for b in batches]).numpy()

    tr_rows, tr_x = feats(train_batches, "normed_last")
    te_rows, te_x = feats(test_batches, "normed_last")
    tr_y = np.array([labels[i] for i in tr_rows])
    te_y = [labels[i] for i in te_rows]
    ex = np.array([i in set(exemplar_rows) for i in tr_rows])
    out: dict[str, Any] = {}

    def probe(x, y, test_x):
        return auroc(fit_probe(x, y, seed=st.seed).decision_function(test_x), te_y)

    def mean_diff(x, y, test_x):
        return auroc(test_x @ (x[y == 1].mean(0) - x[y == 0].mean(0)), te_y)

    out["probe_exemplars"] = {"auroc": probe(tr_x[ex], tr_y[ex], te_x),
                              "note": f"logistic regression on the final layer's last-token state (what the "
                                      f"detector reads, v = 0), fitted on the {int(ex.sum())} exemplars TSV gets"}
    out["mean_difference_exemplars"] = {"auroc": mean_diff(tr_x[ex], tr_y[ex], te_x),
                                        "note": "projection on mean(truthful) − mean(hallucinated) of the same "
                                                "state, over the same exemplars"}
    out["probe"] = {"auroc": probe(tr_x, tr_y, te_x),
                    "note": f"the same probe fitted on all {len(tr_rows)} labelled training rows (a ceiling: "
                            f"TSV sees {int(ex.sum())} labels)"}
    _, tr_l = feats(train_batches, "layer_last")
    _, te_l = feats(test_batches, "layer_last")
    out["probe_at_block"] = {"auroc": probe(tr_l, tr_y, te_l),
                             "note": f"the full-label probe on block {st.layer}'s last-token output (where the "
                                     f"vector is added)"}
    logprob = _answer_logprob(handle, test_batches, n_answer)
    out["mean_token_logprob"] = {"auroc": auroc([logprob[i] for i in te_rows], te_y),
                                 "note": "the unsteered model's mean log-probability of the answer tokens"}
    # exp(−mean log-prob): a monotone map, so its AUROC is the log-probability's; listed because papers list it
    out["perplexity"] = {"auroc": auroc([-math.exp(-logprob[i]) for i in te_rows], te_y),
                         "note": "the answer's perplexity, low = truthful (a monotone function of the mean "
                                 "log-probability, so the same AUROC)"}
    ex_batches = _restrict(train_batches, set(exemplar_rows))
    ex_reps = torch.cat([_reps_of(handle, b.final_last) for b in ex_batches])
    ex_y = [labels[i] for b in ex_batches for i in b.index]
    protos = ema_prototypes(torch.zeros(2, ex_reps.shape[1], device=ex_reps.device), ex_reps,
                            F.one_hot(torch.tensor(ex_y, device=ex_reps.device), 2).float(), decay=0.0)
    te_reps = torch.cat([_reps_of(handle, b.final_last) for b in test_batches])
    out["prototypes_without_vector"] = {
        "auroc": auroc(class_probs(te_reps, protos, st.kappa)[:, 1].tolist(), te_y),
        "note": "TSV's scoring rule with exemplar class means as prototypes and no vector (v = 0)"}
    return out


def _layer_sweep(handle, st: TSVSettings, frame, texts, labels, exemplar_rows, unlabelled_rows, targets,
                 n_answer, progress: Progress) -> dict:
    """Brief stage-1 trainings at candidate blocks around the paper's depth; per-block validation AUROC.

    The validation rows are unlabelled training rows of groups that hold no
    exemplar (so no question is on both sides); their labels are read for
    this choice only, never for training.  The test split is not touched.
    """
    n_layers = handle.arch.num_layers
    centre = default_layer(n_layers)
    half = st.layer_sweep // 2
    candidates = [b for b in range(centre - half, centre - half + st.layer_sweep) if 0 <= b < n_layers]
    ex_groups = {frame.group[i] for i in exemplar_rows}
    pool = [i for i in unlabelled_rows if frame.group[i] not in ex_groups]
    if len({labels[i] for i in pool}) < 2:
        raise TSVError.from_key("tsv_layer_sweep_one_class")
    groups = sorted({frame.group[i] for i in pool})
    random.Random(st.seed + 11).shuffle(groups)
    keep = set(groups[:max(2, len(groups) // 3)])
    validation = [i for i in pool if frame.group[i] in keep]
    brief = replace(st, init_epochs=st.sweep_epochs, aug_epochs=0, compare=False)
    results = []
    for n, block in enumerate(candidates):
        lo, hi = n / len(candidates), (n + 1) / len(candidates)
        progress(lo, Said("progress_layer_sweep", block=block, n=n + 1, total=len(candidates)))
        lam_raw = st.lam * relative_scale(handle, block)
        ex_b = C.cache_prefix(handle, [texts[i] for i in exemplar_rows], block, batch_size=st.cache_batch,
                              keep_final=st.penalty_positions != "last")
        val_b = C.cache_prefix(handle, [texts[i] for i in validation], block, batch_size=st.cache_batch,
                               keep_final=True)
        for b in ex_b:
            b.index = [exemplar_rows[p] for p in b.index]
        for b in val_b:
            b.index = [validation[p] for p in b.index]
        run = _train_run(handle, replace(brief, layer=block), lam_raw, targets, ex_b, [], labels, n_answer,
                         st.constrained, sub_progress(progress, lo, hi), (0.0, 1.0))
        (e,) = _evaluate(handle, val_b, [(lam_raw * run.v, run.prototypes)], st.kappa, labels, n_answer)
        results.append({"layer": block, "validation_auroc": e["auroc"],
                        "max_abs_delta_logit": e["delta"]["max_abs_centred_delta_logit"]})
    scored = [r for r in results if r["validation_auroc"] == r["validation_auroc"]]  # NaN: one-class validation
    best = max(scored, key=lambda r: r["validation_auroc"])["layer"] if scored else centre
    return {"candidates": results, "best": best, "validation_rows": len(validation),
            "epochs_per_candidate": st.sweep_epochs, "constrained": st.constrained}


@with_dense_unembedding  # the logit-change penalty reads W_U at every step
def train(handle, dataset, settings: TSVSettings, progress: Progress = noop) -> tuple[SteeringVector, dict]:
    """Train a TSV on labelled (prompt, answer, label) rows; returns (SteeringVector, report).

    The rows are split by group (question / entity) into train and held-out
    test; ``exemplars`` training rows keep their labels, the rest are
    unlabelled (``supervised=True``: all keep them).  The report holds the
    per-epoch curves, pseudo-label counts, held-out ``auroc``, ``baselines``
    on the same split, the layer sweep when asked for, and
    ``max_abs_delta_logit`` with and without the constraints (the twin run,
    ``compare=True``) at the generation positions, with the top offending tokens.
    """
    # Checked again here (cheap), so a hand-built TSVSettings meets the same bounds as one from a client.
    st = parse_settings(TSVSettings, settings_dict(settings))
    arch = handle.arch
    if st.layer is not None and not 0 <= st.layer < arch.num_layers:
        raise TSVError.from_key("method_layer_missing", layer=st.layer, last=arch.num_layers - 1)
    frame = rows_of(dataset)
    if st.max_rows:
        frame = subsample_groups(frame, st.max_rows, st.seed)
    labels = frame.label.tolist()
    if len(set(labels)) < 2:
        raise TSVError.from_key("tsv_one_class")
    texts = [format_text(p, a, st.template) for p, a in zip(frame.prompt, frame.completion)]
    train_rows, test_rows = split_groups(frame.group.tolist(), labels, st.test_fraction, st.seed)
    exemplar_rows = train_rows if st.supervised else pick_exemplars(train_rows, labels, st.exemplars, st.seed)
    unlabelled_rows = [i for i in train_rows if i not in set(exemplar_rows)]
    n_answer = answer_lengths(handle, frame, texts, st.template, range(len(texts)))
    targets = {i: F.one_hot(torch.tensor(labels[i], device=handle.device), 2).float() for i in train_rows}

    sweep = None
    if st.layer is None and st.layer_sweep:
        sweep = _layer_sweep(handle, st, frame, texts, labels, exemplar_rows, unlabelled_rows, targets, n_answer,
                             sub_progress(progress, 0.0, 0.3))
        st = replace(st, layer=sweep["best"])
        progress = sub_progress(progress, 0.3, 1.0)
    st = replace(st, layer=default_layer(arch.num_layers) if st.layer is None else st.layer)

    lam_raw = st.lam * relative_scale(handle, st.layer)
    progress(0.01, Said("progress_caching_blocks", layer=st.layer, n=len(texts)))
    # the unsteered final residual at every position: the penalties act at the generation positions
    keep_all = st.penalty_positions != "last"

    def cache(rows, lo, hi, keep_final=keep_all):
        batches = C.cache_prefix(handle, [texts[i] for i in rows], st.layer, batch_size=st.cache_batch,
                                 progress=sub_progress(progress, lo, hi), keep_final=keep_final)
        for b in batches:  # positions in `rows` -> dataset rows
            b.index = [rows[p] for p in b.index]
        return batches

    exemplar_batches = cache(exemplar_rows, 0.01, 0.05)
    unlabelled_batches = cache(unlabelled_rows, 0.05, 0.2) if unlabelled_rows else []
    test_batches = cache(test_rows, 0.2, 0.27, keep_final=True)

    settings_to_run = [st.constrained] + ([not st.constrained] if st.compare else [])
    # validate() allows a sweep only with the logit penalty on, so the main run is constrained and has its bound
    bounds = [b for b in dict.fromkeys(float(b) for b in st.bound_sweep) if b != st.max_logit_change]
    runs: dict[bool, _Run] = {}
    swept: dict[float, _Run] = {}
    if st.bound_mode == "calibrated":
        # the penalties train nothing: every run is the same training (same seed, same draws), done once; the
        # constrained ones differ only in the steering strength calibrated below
        once = _train_run(handle, st, lam_raw, targets, exemplar_batches, unlabelled_batches, labels, n_answer,
                          False, progress, (0.27, 0.92))
        runs = {c: replace(once, constrained=c) for c in settings_to_run}
        swept = {b: replace(once, constrained=True) for b in bounds}
    span = 0.65 / (len(settings_to_run) + len(bounds))
    for n, constrained in enumerate(settings_to_run if not runs else []):
        runs[constrained] = _train_run(handle, st, lam_raw, targets, exemplar_batches, unlabelled_batches, labels,
                                       n_answer, constrained, progress, (0.27 + n * span, 0.27 + (n + 1) * span))
    for n, bound in enumerate(bounds if not swept else [], start=len(settings_to_run)):
        progress(0.27 + n * span, Said("progress_bound_sweep", bound=f"{bound:g}"))
        swept[bound] = _train_run(handle, replace(st, max_logit_change=bound), lam_raw, targets, exemplar_batches,
                                  unlabelled_batches, labels, n_answer, True, progress,
                                  (0.27 + n * span, 0.27 + (n + 1) * span))
    calibration: dict[int, list[dict]] = {}
    if st.bound_mode in ("steering_scale", "calibrated") and st.constrained:
        # the steering strength, calibrated on training rows' generation positions (never the held-out ones)
        pool = sorted(train_rows)
        random.Random(st.seed + 7).shuffle(pool)
        calib_batches = _restrict(exemplar_batches + unlabelled_batches, set(pool[:st.calibration_rows]))
        for bound, run in [(st.max_logit_change, runs.get(True)), *swept.items()]:
            if run is not None:
                progress(0.9, Said("progress_calibrating_bound", bound=f"{bound:g}"))
                run.steering_scale, calibration[id(run)] = calibrate_steering_scale(
                    handle, calib_batches, n_answer, lam_raw * run.v, run.steering_scale,
                    st.bound_target * bound, st.penalty_positions)
    progress(0.93, Said("progress_scoring_held_out"))
    # one pass over the held-out rows for every run: the detector at λ·v, and steering at scale·λ·v where that differs
    everything = [*runs.values(), *swept.values()]
    entries = [(lam_raw * r.v, r.prototypes) for r in everything]
    steering_entry = {}
    for r in everything:
        if r.steering_scale != 1.0:
            steering_entry[id(r)] = len(entries)
            entries.append((r.steering_scale * lam_raw * r.v, r.prototypes))
    scored = _evaluate(handle, test_batches, entries, st.kappa, labels, n_answer, progress=progress)
    detector_eval = {id(r): scored[n] for n, r in enumerate(everything)}
    # what the Δlogit reports are about: the strength the vector steers with
    steer_eval = {id(r): scored[steering_entry.get(id(r), n)] for n, r in enumerate(everything)}
    evals = {c: detector_eval[id(r)] for c, r in runs.items()}
    swept_evals = {b: detector_eval[id(r)] for b, r in swept.items()}
    baselines = _baselines(handle, st, exemplar_batches + unlabelled_batches, test_batches, exemplar_rows, labels,
                           n_answer)
    main = runs[st.constrained]
    main_eval = evals[st.constrained]

    def run_report(e: dict, run: _Run, limit: float) -> dict:
        steer = steer_eval[id(run)]
        d, last = steer["delta"], steer["delta_last"]
        return {"auroc": e["auroc"],
                "note": _strengths_note(run.steering_scale, st.bound_mode if run.constrained else None,
                                        e["delta"]["max_abs_centred_delta_logit"]),
                # the steering strength (scale·λ·v) and the detector's (λ·v, the training strength)
                "steering_scale": run.steering_scale,
                "steering": {"scale": run.steering_scale, "calibration": calibration.get(id(run), []),
                             "auroc_at_steering_strength": steer["auroc"],
                             "vector_norm": float((run.steering_scale * lam_raw * run.v).norm())},
                "detector_strength": {"max_abs_delta_logit": e["delta"]["max_abs_centred_delta_logit"],
                                      "max_abs_raw_delta_logit": e["delta"]["max_abs_delta_logit"],
                                      "mean_kl": e["delta"]["mean_kl"]},
                # at the generation positions, at the steering strength: centred (what the bound is on), then raw
                "max_abs_delta_logit": d["max_abs_centred_delta_logit"],
                "max_abs_raw_delta_logit": d["max_abs_delta_logit"],
                "median_max_abs_delta_logit": d["median_max_abs_delta_logit"],
                "direct_max_abs_delta_logit": d["direct_max_abs_delta_logit"],
                "mean_kl": d["mean_kl"], "top_tokens": d["top_tokens"],
                "last_position": {"max_abs_delta_logit": last["max_abs_centred_delta_logit"],
                                  "max_abs_raw_delta_logit": last["max_abs_delta_logit"], "mean_kl": last["mean_kl"]},
                "vector_norm": float((lam_raw * run.v).norm()), "curves": run.curves,
                "pseudo_labels": run.pseudo,
                "bound_check": bound_check(handle, frame, steer["by_position"], limit) if run.constrained else None}

    run_reports = {("constrained" if c else "unconstrained"): run_report(evals[c], r, st.max_logit_change)
                   for c, r in runs.items()}
    run_reports.update({f"constrained, bound {b:g}": run_report(swept_evals[b], r, b) for b, r in swept.items()})
    # AUROC against the bound, loosest last; the unconstrained run is the bound-free end (None)
    tradeoff = {**swept_evals, st.max_logit_change: evals[True]} if swept else {}
    if swept and False in evals:
        tradeoff[None] = evals[False]
    run_of = {**{b: r for b, r in swept.items()}, st.max_logit_change: runs.get(True), None: runs.get(False)}
    bound_sweep = [{"bound": b, "auroc": e["auroc"], "steering_scale": run_of[b].steering_scale,
                    "max_abs_delta_logit": steer_eval[id(run_of[b])]["delta"]["max_abs_centred_delta_logit"],
                    "mean_kl": steer_eval[id(run_of[b])]["delta"]["mean_kl"]}
                   for b, e in sorted(tradeoff.items(), key=lambda kv: math.inf if kv[0] is None else kv[0])]

    # clean(): AUROC is NaN where the held-out rows have one class; reports and vector metadata are JSON
    report: dict[str, Any] = clean({
        "method": "tsv", "layer": st.layer, "lam": st.lam, "lam_raw": lam_raw,
        "rows": {"total": len(frame), "train": len(train_rows), "test": len(test_rows),
                 "exemplars": len(exemplar_rows), "unlabelled": len(unlabelled_rows),
                 "groups": int(frame.group.nunique())},
        "label_balance": {"truthful": int(sum(labels)), "hallucinated": int(len(labels) - sum(labels))},
        "auroc": main_eval["auroc"],
        "curves": main.curves,
        "pseudo_labels": main.pseudo,
        "baselines": baselines,
        "layer_sweep": sweep,
        "penalty_positions": st.penalty_positions,
        "bound_mode": st.bound_mode,
        "steering_scale": main.steering_scale,
        "max_abs_delta_logit": {
            "where": "held-out generation positions (last prompt token and the answer tokens but the last), "
                     "centred Δlogit, at the steering strength",
            "with_constraints": run_reports["constrained"]["max_abs_delta_logit"] if True in evals else None,
            "without_constraints": run_reports["unconstrained"]["max_abs_delta_logit"] if False in evals else None,
            "limit": st.max_logit_change,
        },
        "top_tokens": steer_eval[id(main)]["delta"]["top_tokens"],
        "held_out": [{"prompt": frame.prompt[i], "answer": frame.completion[i], "label": labels[i],
                      "score": main_eval["scores"][i]} for i in test_rows],
        "runs": run_reports,
        "bound_sweep": bound_sweep,
        "settings": settings_dict(st),
    })
    # The saved direction is the steering vector (steering at raw α = 1 keeps the bound); the detector reads it
    # at raw α = detector_alpha, the training strength λ·v (tsv.score does).
    direction = main.steering_scale * lam_raw * main.v
    rel = to_relative(handle, float(direction.norm()), st.layer)
    hyper = {**settings_dict(st), "lam_raw": lam_raw, "classes": list(CLASSES), "train_alpha_raw": 1.0,
             "detector_alpha": 1.0 / main.steering_scale, "steering_scale": main.steering_scale}
    metrics = {"auroc": report["auroc"],
               "baselines": {k: v["auroc"] for k, v in report["baselines"].items()},
               "max_abs_delta_logit": report["max_abs_delta_logit"],
               "rows": report["rows"]}
    vector = SteeringVector(
        directions={st.layer: direction.cpu()}, hidden_size=arch.hidden_size, method="tsv", model_id=handle.model_id,
        model_type=handle.model_type, positions="all",
        name=f"tsv L{st.layer} ({'constrained' if st.constrained else 'unconstrained'})",
        hyperparameters=hyper,
        # the bound, carried to generation as its Δlogit limit: calibration holds it on the training rows only
        max_delta_logit=(st.max_logit_change if st.constrained and 0 < st.max_logit_change <= MAX_DELTA_LOGIT_LIMIT
                         else None),
        dataset_hash=dataset_hash(list(zip(texts, labels))), metrics=metrics,
        alpha_range=(0.0, round(2 * rel, 6) if rel > 0 else 1.0),
        extras={"prototypes": main.prototypes.cpu()},
    )
    progress(1.0, Said("progress_tsv_trained", auroc=report['auroc']))
    return vector, report
