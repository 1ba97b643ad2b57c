"""How well L2S steers: per-pair teacher-forced margins for each source, and the held-out comparison table.

Sources: ``none`` (α = 0), ``mean`` (Mean-S), ``l2s`` (g's prediction) and
``p2s`` (the true target, the oracle that bounds what a predictor can do).
"""
from __future__ import annotations

from typing import Callable, Sequence

import pandas as pd
import torch
from torch import nn

from ...messages import Said
from ...model.capture import forward
from ...model.hooks import Steer, StepState, steering
from ...model.units import relative_scale
from ...vector import SteeringVector
from .activations import encode, extract
from .pairs import Pair, join_text
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
            progress(start / max(len(jobs), 1), Said("progress_scoring_rows", done=start, total=len(jobs)))
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
        # The rows' vectors are computed already (the fn ignores its context), so the hook reads its context at
        # the steered block itself: in one teacher-forced pass a later context layer would not exist yet when
        # the generated positions are steered, while generation reads it at prefill, before them.
        steer = Steer(layer=layer, fn=lambda _ctx, t=per_row: t.to(_ctx.device),
                      context_layer=min(context_layer, layer), alpha=torch.tensor(rows_alpha), positions=positions)
        state = StepState(prompt_len=P)
        with torch.inference_mode(), steering(handle, [steer], state):
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


def budget_alphas(vectors: torch.Tensor, budget_norm: float, steps: int) -> list[float]:
    """Raw multipliers whose steered vectors have mean norm ``budget_norm · k / steps``, k = 1..steps."""
    norm = float(vectors.norm(dim=-1).mean())
    if not norm > 0:
        return [0.0] * steps
    return [budget_norm * k / steps / norm for k in range(1, steps + 1)]


def residual_weights(steps: int) -> list[float]:
    """The weights β tried for g's input-dependent part: 0, 1/steps, …, 1 (``steps`` = 0: only 1, g as trained)."""
    return [1.0] if steps <= 0 else [k / steps for k in range(steps + 1)]


def calibrate(handle, vector: SteeringVector, pairs: Sequence[Pair], contexts: torch.Tensor, budget: float,
              steps: int, limit: int | None = None,
              progress: Callable[[float, str], None] | None = None, residual_steps: int = 0) -> dict:
    """α per source (Mean-S, L2S) that maximises the mean margin gain on ``pairs`` (the validation split) under a
    norm budget: the mean norm of the added vectors stays within ``budget · n_{L*}`` (relative units).

    The candidates are ``steps`` evenly spaced mean norms up to the budget, so both sources are tried at the same
    strengths.  For L2S the weight β of g's input-dependent part (steering adds ``z̄ + β·(g − z̄)``) is chosen
    with α, over :func:`residual_weights` (``residual_steps``): with a few dozen training inputs g's per-input
    part can be noise that costs behaviour, and β = 0 (Mean-S itself) lets validation say so.  β = 0 shares
    Mean-S's rows, so it costs no extra pass.  Returns ``{"alphas": {source: raw multiplier},
    "residual_weight": β, "table": records}``; ties go to the smaller β, then the smaller α.
    """
    layer, context_layer = layers_of(vector)
    scale = relative_scale(handle, layer)
    net = mlp_of(vector)
    with torch.no_grad():
        pred = net(contexts)
    mean = vector.directions[layer].unsqueeze(0).expand_as(pred)
    weights = residual_weights(residual_steps)
    # β's candidates as sources of their own; β = 0 is Mean-S (same vectors, so the same α grid and margins).
    shrunk = {b: net.target_mean + b * (pred - net.target_mean) for b in weights if b > 0}
    per_source = {"mean": mean, **{f"l2s~{b:g}": v for b, v in shrunk.items()}}
    k = len(pairs) if not limit else min(int(limit), len(pairs))
    grid = {s: budget_alphas(v, budget * scale, steps) for s, v in per_source.items()}
    candidates = {f"{s}@{j}": a * v[:k] for s, v in per_source.items() for j, a in enumerate(grid[s])}
    effect = steering_effect(handle, pairs[:k], candidates, layer, context_layer, 1.0, positions=vector.positions,
                             progress=progress)
    by_source = effect.groupby("source", sort=False)
    gains, rates = by_source["margin_gain"].mean(), by_source["greedy_positive"].mean()
    rows, best = [], {}
    l2s_unit = unit_scale(handle, vector, True)

    def add(source: str, weight: float | None, candidate: str) -> None:
        norm = float(per_source[candidate].norm(dim=-1).mean())
        for j, a in enumerate(grid[candidate]):
            name = f"{candidate}@{j}"
            rows.append({"source": source, "residual_weight": weight, "raw_alpha": a, "relative_alpha": a / l2s_unit,
                         "relative_norm": a * norm / scale, "margin_gain": float(gains[name]),
                         "positive_rate": float(rates[name])})
            if source not in best or rows[-1]["margin_gain"] > best[source]["margin_gain"]:
                best[source] = rows[-1]

    add("mean", None, "mean")
    for b in weights:  # ascending, so a tie keeps the smaller weight
        add("l2s", b, "mean" if b == 0 else f"l2s~{b:g}")
    return {"alphas": {s: r["raw_alpha"] for s, r in best.items()},
            "residual_weight": best["l2s"]["residual_weight"], "table": rows, "n_pairs": k}


def compare_heldout(handle, vector: SteeringVector, pairs: Sequence[Pair], alpha: float | None = None,
                    relative: bool = False, contexts: torch.Tensor | None = None,
                    targets: torch.Tensor | None = None, limit: int | None = None,
                    progress: Callable[[float, str], None] | None = None,
                    alphas: dict[str, float] | None = None) -> dict:
    """The held-out table: cosine / MSE of L2S and Mean-S predictions to the true targets, the margin gain and
    greedy-positive rate per source (none, Mean-S, L2S, P2S), and per-input predicted norms.

    Strength: ``alphas`` (source -> raw multiplier, e.g. the validation-calibrated ones; P2S gets the largest
    mean norm the others use, so it bounds them at the same budget), else ``alpha`` for every source (raw, or
    relative with ``relative``), else the vector's calibrated ``hyperparameters["calibrated_raw_alpha"]``,
    else raw 0.5.  ``steered_norm`` reports each source's mean added norm in relative units.

    ``limit``: measure steering on the first ``limit`` pairs only (it costs 8 forward rows per pair); the
    cosines and MSEs always use every pair."""
    layer, context_layer = layers_of(vector)
    hp = vector.hyperparameters
    position = hp.get("position", "mean")
    if contexts is None or targets is None:
        contexts, targets = extract(handle, pairs, layer, context_layer, position)
    net = mlp_of(vector)
    with torch.no_grad():
        pred = net(contexts)
    mean = vector.directions[layer].unsqueeze(0).expand_as(targets)
    sources = {"mean": mean, "l2s": pred, "p2s": targets}
    alphas = alphas if alphas is not None else (None if alpha is not None else hp.get("calibrated_raw_alpha"))
    if alphas is None:
        raw = (0.5 if alpha is None else float(alpha)) * unit_scale(handle, vector, relative)
        alphas = {s: raw for s in sources}
    alphas = {s: float(a) for s, a in alphas.items()}
    if "p2s" not in alphas:
        longest = max(alphas[s] * float(sources[s].norm(dim=-1).mean()) for s in alphas)
        alphas["p2s"] = longest / max(float(targets.norm(dim=-1).mean()), 1e-12)
    k = len(pairs) if not limit else min(int(limit), len(pairs))
    effect = steering_effect(handle, pairs[:k], {s: alphas[s] * v[:k] for s, v in sources.items()}, layer,
                             context_layer, 1.0, positions=vector.positions, progress=progress)
    scale = relative_scale(handle, layer)
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
    for s in sources:  # per pair, for the first k (the steered ones); None after
        gain = effect[effect.source == s].set_index("pair")["margin_gain"]
        per_input[f"margin_gain_{s}"] = [float(gain[i]) if i in gain.index else None for i in range(len(pairs))]
    margins = by_source["margin"].mean()
    gains = by_source["margin_gain"].mean()
    greedy = by_source["greedy_positive"].mean()
    l2s_unit = unit_scale(handle, vector, True)
    return {
        "n": len(pairs),
        "n_steered": k,
        "residual_weight": float(hp.get("residual_weight", 1.0)),
        "alpha": {s: a / l2s_unit for s, a in alphas.items()},  # relative units of this vector
        "raw_alpha": alphas,
        "steered_norm": {s: alphas[s] * float(v[:k].norm(dim=-1).mean()) / scale for s, v in sources.items()},
        "l2s_cosine": float(l2s_cos.mean()),
        "mean_cosine": float(mean_cos.mean()),
        "l2s_mse": float(_mse(pred, targets).mean()),
        "mean_mse": float(_mse(mean, targets).mean()),
        "margin": {s: float(v) for s, v in margins.items()},
        "margin_gain": {s: float(v) for s, v in gains.items() if s != "none"},
        "positive_rate": {s: float(v) for s, v in greedy.items()},
        "l2s_minus_mean": paired_difference(effect, "l2s", "mean"),
        "predicted_norm_mean": float(pred.norm(dim=-1).mean()),
        "predicted_norm_std": float(pred.norm(dim=-1).std()) if len(pairs) > 1 else 0.0,
        "cosine_to_mean_mean": float(cosines(pred, mean).mean()),
        "per_input": per_input,
        "per_pair_effect": effect,
    }


def paired_difference(effect: pd.DataFrame, a: str, b: str) -> dict:
    """Mean per-pair margin gain of source ``a`` minus source ``b``, with its standard error."""
    gain = effect.pivot(index="pair", columns="source", values="margin_gain")
    diff = gain[a] - gain[b]
    n = len(diff)
    se = float(diff.std(ddof=1) / n ** 0.5) if n > 1 else float("nan")
    return {"mean": float(diff.mean()), "se": se, "n": n}


def recommendation(result: dict, budget: float) -> tuple[bool, str]:
    """(whether L2S beat Mean-S, a plain sentence for the user, said by key) from a :func:`compare_heldout` result.

    "Beat" means a paired margin-gain advantage more than twice its standard error: otherwise the simpler,
    input-independent vector is the one to use."""
    gain, diff = result["margin_gain"], result["l2s_minus_mean"]
    numbers = dict(l2s=f"{gain['l2s']:+.2f}", mean=f"{gain['mean']:+.2f}", n=result["n_steered"], budget=f"{budget:g}")
    beats = diff["mean"] > 0 and diff["mean"] > 2 * (diff["se"] if diff["se"] == diff["se"] else float("inf"))
    if beats:
        return True, Said("l2s_verdict_beats", alpha=f"{result['alpha']['l2s']:.3g}", **numbers)
    why = Said("l2s_verdict_weight_zero") if result.get("residual_weight", 1.0) == 0 else ""
    return False, Said("l2s_verdict_not", why=why, **numbers)


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
            "relative_alpha": result["alpha"].get(s, 0.0),
            "steered_norm": result["steered_norm"].get(s, 0.0),
            "margin": result["margin"][s],
            "margin_gain": result["margin_gain"].get(s, 0.0),
            "positive_rate": result["positive_rate"][s],
        })
    return rows
