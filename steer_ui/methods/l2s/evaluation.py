"""How well L2S steers: per-pair teacher-forced margins for each source, and the held-out comparison table.

Sources: ``none`` (α = 0), ``mean`` (Mean-S), ``l2s`` (g's prediction) and
``p2s`` (the true target, the oracle that bounds what a predictor can do).
"""
from __future__ import annotations

from typing import Callable, Sequence

import pandas as pd
import torch
from torch import nn

from ...model.capture import forward
from ...model.hooks import Steer, StepState, steering
from ...vector import SteeringVector
from .activations import encode, extract
from .cpu import one_thread
from .pairs import Pair, join_text
from .settings import L2SSettings
from .steering import check_positions, layers_of, mlp_of, unit_scale

SOURCES = ("none", "mean", "l2s", "p2s")


def cosines(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Row-wise cosine similarity of two (n, D) stacks."""
    return nn.functional.cosine_similarity(a, b, dim=-1, eps=1e-12)


def _mse(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a - b).pow(2).mean(-1)


def steering_effect(handle, pairs: Sequence[Pair], vectors: dict[str, torch.Tensor], layer: int, context_layer: int,
                    alpha: float, positions: str = "all", batch_size: int = 16,
                    progress: Callable[[float, str], None] | None = None) -> pd.DataFrame:
    """Per pair and source: teacher-forced log p(positive), log p(negative), their margin, and whether the greedy
    continuation starts with the positive completion, with ``alpha · vectors[source][i]`` added at ``layer``.

    ``vectors``: source name -> (n, D) per-pair vectors (``none`` is implied, α = 0).  Every source goes
    through the core input-dependent hook (one ``Steer(fn=...)`` whose fn returns each row's vector), so this
    measures exactly what generation would do.  The greedy check is exact: a teacher-forced pass on
    prompt+positive predicts each positive token at the next position iff greedy decoding would produce it.
    """
    check_positions(layer, context_layer, positions)
    names = ["none"] + [s for s in vectors if s != "none"]
    D = handle.arch.hidden_size
    jobs = []  # (pair index, source, sign)
    for i in range(len(pairs)):
        for s in names:
            for sign in ("positive", "negative"):
                jobs.append((i, s, sign))
    # Rows of similar length share a batch, so little compute goes to padding.
    jobs.sort(key=lambda j: (len(pairs[j[0]].prompt), len(getattr(pairs[j[0]], j[2]))))
    results = {}
    arch = handle.arch
    for start in range(0, len(jobs), batch_size):
        if progress is not None:  # also how a job's cancel and time limit reach this loop
            progress(start / max(len(jobs), 1), f"scoring steering: {start}/{len(jobs)} rows")
        chunk = jobs[start:start + batch_size]
        prompts, comps, rows_vec, rows_alpha = [], [], [], []
        for i, s, sign in chunk:
            p, c = join_text(pairs[i].prompt, getattr(pairs[i], sign))
            prompts.append(p)
            comps.append(c)
            rows_vec.append(torch.zeros(D) if s == "none" else vectors[s][i].float())
            rows_alpha.append(0.0 if s == "none" else float(alpha))
        ids, mask, pos_ids, P, lengths = encode(handle, prompts, comps)
        per_row = torch.stack(rows_vec)
        steer = Steer(layer=layer, fn=lambda _ctx, t=per_row: t.to(_ctx.device), context_layer=context_layer,
                      alpha=torch.tensor(rows_alpha), positions=positions)
        dev = handle.input_device
        state = StepState(prompt_len=P)
        with torch.inference_mode(), one_thread(dev), steering(handle, [steer], state):
            out = forward(handle, ids, mask, pos_ids)
        hidden = out.last_hidden_state
        # One unembedding call per batch: per-row calls would stream the (vocab × D) matrix once per row.
        where = [(r, P - 1 + t) for r, n in enumerate(lengths) for t in range(n)]
        rows_at = torch.tensor([r for r, _ in where])
        cols_at = torch.tensor([c for _, c in where])
        logits = arch.logits(hidden[rows_at.to(hidden.device), cols_at.to(hidden.device)]).cpu()
        wanted = ids[rows_at, cols_at + 1]
        logp = logits.log_softmax(-1).gather(1, wanted.unsqueeze(1)).squeeze(1)
        hit = logits.argmax(-1) == wanted
        for r, (i, s, sign) in enumerate(chunk):
            sel = rows_at == r
            results[(i, s, sign)] = (float(logp[sel].sum()), bool(hit[sel].all()))
    rows = []
    for i in range(len(pairs)):
        for s in names:
            lp_pos, greedy_pos = results[(i, s, "positive")]
            lp_neg, _ = results[(i, s, "negative")]
            rows.append({"pair": i, "group": pairs[i].group, "source": s, "logp_positive": lp_pos,
                         "logp_negative": lp_neg, "margin": lp_pos - lp_neg, "greedy_positive": greedy_pos})
    frame = pd.DataFrame(rows)
    base = frame[frame.source == "none"].set_index("pair")["margin"]
    frame["margin_gain"] = frame["margin"] - frame["pair"].map(base)
    return frame


def compare_heldout(handle, vector: SteeringVector, pairs: Sequence[Pair], alpha: float | None = None,
                    relative: bool = False, contexts: torch.Tensor | None = None,
                    targets: torch.Tensor | None = None, limit: int | None = None,
                    progress: Callable[[float, str], None] | None = None) -> dict:
    """The held-out table: cosine / MSE of L2S and Mean-S predictions to the true targets, the margin gain and
    greedy-positive rate per source (none, Mean-S, L2S, P2S) at ``alpha``, and per-input predicted norms.

    ``limit``: measure steering on the first ``limit`` pairs only (it costs 8 forward rows per pair); the
    cosines and MSEs always use every pair."""
    layer, context_layer = layers_of(vector)
    hp = vector.hyperparameters
    position = hp.get("position", "mean")
    alpha = float(hp.get("eval_alpha", L2SSettings.eval_alpha) if alpha is None else alpha)
    if contexts is None or targets is None:
        contexts, targets = extract(handle, pairs, layer, context_layer, position)
    net = mlp_of(vector)
    with torch.no_grad():
        pred = net(contexts)
    mean = vector.directions[layer].unsqueeze(0).expand_as(targets)
    raw_alpha = alpha * unit_scale(handle, vector, relative)
    k = len(pairs) if not limit else min(int(limit), len(pairs))
    effect = steering_effect(handle, pairs[:k], {"mean": mean[:k], "l2s": pred[:k], "p2s": targets[:k]}, layer,
                             context_layer, raw_alpha, positions=vector.positions, progress=progress)
    by_source = effect.groupby("source", sort=False)
    l2s_cos, mean_cos = cosines(pred, targets), cosines(mean, targets)
    per_input = pd.DataFrame({
        "group": [p.group for p in pairs],
        "prompt": [p.prompt for p in pairs],
        "target_norm": targets.norm(dim=-1).tolist(),
        "predicted_norm": pred.norm(dim=-1).tolist(),
        "cosine_to_mean": cosines(pred, mean).tolist(),
        "l2s_cosine": l2s_cos.tolist(),
        "mean_cosine": mean_cos.tolist(),
    })
    margins = by_source["margin"].mean()
    gains = by_source["margin_gain"].mean()
    greedy = by_source["greedy_positive"].mean()
    return {
        "n": len(pairs),
        "n_steered": k,
        "alpha": alpha,
        "relative": relative,
        "raw_alpha": raw_alpha,
        "l2s_cosine": float(l2s_cos.mean()),
        "mean_cosine": float(mean_cos.mean()),
        "l2s_mse": float(_mse(pred, targets).mean()),
        "mean_mse": float(_mse(mean, targets).mean()),
        "margin": {s: float(v) for s, v in margins.items()},
        "margin_gain": {s: float(v) for s, v in gains.items() if s != "none"},
        "positive_rate": {s: float(v) for s, v in greedy.items()},
        "predicted_norm_mean": float(pred.norm(dim=-1).mean()),
        "predicted_norm_std": float(pred.norm(dim=-1).std()) if len(pairs) > 1 else 0.0,
        "cosine_to_mean_mean": float(cosines(pred, mean).mean()),
        "per_input": per_input,
        "per_pair_effect": effect,
    }


def table_rows(result: dict) -> list[dict]:
    """The held-out comparison as JSON-safe records (None where a number does not apply)."""
    rows = []
    for s in SOURCES:
        if s not in result["positive_rate"]:
            continue
        rows.append({
            "source": {"none": "no steering", "mean": "Mean-S", "l2s": "L2S", "p2s": "P2S (oracle)"}[s],
            "cosine_to_target": {"mean": result["mean_cosine"], "l2s": result["l2s_cosine"], "p2s": 1.0}.get(s),
            "mse_to_target": {"mean": result["mean_mse"], "l2s": result["l2s_mse"], "p2s": 0.0}.get(s),
            "margin": result["margin"][s],
            "margin_gain": result["margin_gain"].get(s, 0.0),
            "positive_rate": result["positive_rate"][s],
        })
    return rows
