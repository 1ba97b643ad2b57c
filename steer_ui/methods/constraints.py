"""lm_head constraints: keep a learned steering vector from blowing up the logits.

The failure they prevent: a vector added to the residual stream reaches the
unembedding through the skip connections almost unchanged.  If it lines up
with one token's unembedding row, that token's logit moves by hundreds and
the steered model emits it forever.  Two penalties, both zero while the
steering is gentle:

* :func:`logit_penalty`: the excess of |Δlogit| over ``max_change``, as a
  hinge, per token, on the *centred* change (:func:`centred`: Δlogit minus
  its mean over the vocabulary), so a change that moves every logit alike,
  which moves no probability, costs nothing.  Training applies it to the real
  Δlogit at the positions it names (steered vs unsteered run of the blocks
  after L, through the final norm) and to the *direct path*: the vector added
  straight to the final residual (:func:`direct_delta_logits`).
* :func:`kl_penalty`: KL(p_unsteered ‖ p_steered) of the next-token
  distribution.

Both take plain tensors so other code (the Concepts tab's "logit explosion
and its fix" demo) can reuse them.  :func:`constrain_vector` rotates an
existing vector, at a fixed α, until its max |Δlogit| and KL are bounded,
keeping it as close in direction to the original as the bounds allow.

Both TSV and :func:`constrain_vector` train through the frozen model cheaply
on the frozen-prefix engine (:mod:`steer_ui.model.prefix`), under the names
they have always used: :func:`cache_prefix` runs the texts once and keeps,
per batch, the output of block L and the arguments every later block was
called with; :func:`run_suffix` re-runs only the blocks after L on
``h_L + added`` (with autograd when ``added`` needs it).
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from ..messages import Said
from ..model.architecture import centred, with_dense_unembedding  # centred: the bound's measure, as generation's
from ..model.prefix import Prefix, for_texts
from ..model.units import NEUTRAL_PROMPTS, relative_scale

Progress = Callable[[float, str], None]

DEFAULT_MAX_CHANGE = 2.0
REDUCTIONS = ("mean", "sum", "max")


# ------------------------------------------------------------------ penalties
def logit_penalty(delta_logits: torch.Tensor, max_change: float = DEFAULT_MAX_CHANGE,
                  reduction: str = "mean") -> torch.Tensor:
    """Hinge on the centred |Δlogit| above ``max_change``: zero when every token moves less than that.

    ``delta_logits``: (vocab,) or (rows, vocab); centred first
    (:func:`centred`), so adding the same constant to a row's changes leaves
    the penalty unchanged.  ``reduction`` over the
    vocabulary: ``mean`` (the excess averaged over all tokens), ``sum`` (the
    total excess; one exploding token is not diluted by a 262k vocabulary) or
    ``max`` (the worst token only).  Rows are averaged.
    """
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got '{reduction}'")
    if max_change < 0:
        raise ValueError(f"max_change must be >= 0, got {max_change}")
    excess = F.relu(centred(delta_logits.float()).abs() - float(max_change))
    if excess.ndim == 1:
        excess = excess.unsqueeze(0)
    if reduction == "mean":
        per_row = excess.mean(-1)
    elif reduction == "sum":
        per_row = excess.sum(-1)
    else:
        per_row = excess.max(-1).values
    return per_row.mean()


def kl_penalty(logp_unsteered: torch.Tensor, logp_steered: torch.Tensor) -> torch.Tensor:
    """Mean over rows of KL(p_unsteered ‖ p_steered), in nats; inputs are log-probabilities (…, vocab)."""
    logp_unsteered, logp_steered = logp_unsteered.float(), logp_steered.float()
    kl = (logp_unsteered.exp() * (logp_unsteered - logp_steered)).sum(-1)
    return kl.reshape(-1).mean()


def direct_delta_logits(handle, added: torch.Tensor, final_residual: torch.Tensor | None = None) -> torch.Tensor:
    """Δlogit from adding ``added`` straight to the final residual stream (the skip-connection path).

    With ``final_residual`` (rows, hidden): logits(norm(h + added)) −
    logits(norm(h)), through the model's final norm, which is what sets the
    scale on models whose residual norm grows to thousands.  Without it:
    ``added · W_Uᵀ`` (no norm), meaningful only for models without a final
    norm or at unit residual scale.  Returns (rows, vocab) or (vocab,).
    """
    arch = handle.arch
    if final_residual is None:
        w = arch.unembedding
        return torch.matmul(w.float(), added.float().to(w.device))
    h = final_residual.to(handle.dtype)
    steered = arch.logits(arch.final_hidden(h + added.to(h.device, h.dtype)))
    with torch.no_grad():
        base = arch.logits(arch.final_hidden(h))
    return steered - base


def top_offenders(handle, delta_logits: torch.Tensor, k: int = 10) -> list[dict]:
    """The ``k`` tokens with the largest |Δlogit| (max over rows), with their signed change."""
    d = delta_logits.detach().float()
    if d.ndim == 1:
        d = d.unsqueeze(0)
    worst_row = d.abs().argmax(0)
    signed = d.gather(0, worst_row.unsqueeze(0))[0]
    top = torch.topk(signed.abs(), min(k, signed.numel()))
    return [{"token": handle.tokenizer.decode([int(i)]), "token_id": int(i), "delta_logit": float(signed[i])}
            for i in top.indices]


# ---------------------------------------------------- cached frozen prefix
# The frozen-prefix engine (steer_ui.model.prefix) under the names TSV and
# constrain_vector have always used: a batch is a Prefix.
SuffixBatch = Prefix


def cache_prefix(handle, texts: Sequence[str], layer: int, batch_size: int = 16,
                 progress: Progress | None = None, keep_final: bool = False) -> list[SuffixBatch]:
    """Run ``texts`` once through the frozen model; keep what re-running blocks > ``layer`` needs.

    Texts are batched by token length (less padding); each batch's ``index``
    lists its rows' positions in ``texts``.  ``keep_final`` also keeps the
    unsteered final residual at every position (for answer log-probabilities).
    """
    return for_texts(handle, texts, layer, batch_size=batch_size, progress=progress, keep_final_all=keep_final)


def run_suffix(handle, batch: SuffixBatch, added: torch.Tensor | None) -> torch.Tensor:
    """Final residual (before the final norm) at the last position after adding ``added`` to block L's output.

    ``added``: (hidden,) added at every position, or (rows, hidden) per row,
    or None.  Gradients flow to ``added`` when it requires them.
    """
    return batch.final(added)


def run_suffix_all(handle, batch: SuffixBatch, added: torch.Tensor | None) -> torch.Tensor:
    """Like :func:`run_suffix` but the final residual at every position: (rows, seq, hidden), float.

    What a penalty at the positions where a steered model generates needs
    (the answer tokens, not only the last one the detector reads), so every
    block runs on every position (:meth:`Prefix.final_everywhere`).
    """
    with handle.lock:
        return batch.final_everywhere(added)


def logits_of(handle, final_residual: torch.Tensor) -> torch.Tensor:
    """Next-token logits (rows, vocab) from final residuals (rows, hidden)."""
    arch = handle.arch
    return arch.logits(arch.final_hidden(final_residual.to(handle.dtype)))


# Full-vocabulary logits of 64 to 128 positions at a time (chunk_bounds): 128 × 262,144 floats is 128 MB on Gemma 3.
PENALTY_CHUNK = 64


def chunk_bounds(n: int, size: int = PENALTY_CHUNK) -> list[tuple[int, int]]:
    """``n`` positions as (start, end) chunks of at most ``2 · size``, equal in size, each above ``size`` when n is.

    Why not plain ``size``-row chunks: the CPU unembedding times its kernels
    once per new row count up to 64 (:func:`steer_ui.model.architecture.unembed`),
    and a ragged last chunk of every batch would pay that timing over and
    over; chunks above 64 rows use one kernel without timing.
    """
    if n <= 0:
        return []
    k = max(1, -(-n // (2 * size)))
    edges = [round(i * n / k) for i in range(k + 1)]
    return list(zip(edges[:-1], edges[1:]))


def _unembedding_mean(handle) -> torch.Tensor:
    """mean_t W_U[t] (hidden,) float, computed once per model: the gradient of the mean logit without a soft-cap."""
    cached = handle.__dict__.get("_unembedding_mean")
    if cached is None:
        with torch.no_grad():
            cached = handle.arch.unembedding.float().mean(0)
        handle.__dict__["_unembedding_mean"] = cached
    return cached


def _logit_grad(handle, coeff: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """∂/∂normed of Σ coeff ⊙ logits(normed), (n, hidden), from the logits already computed (no autograd).

    Through the unembedding and, where the model has one, the soft-cap
    (``cap·tanh(u/cap)``, whose derivative is ``1 − (z/cap)²`` at output ``z``).
    """
    arch = handle.arch
    if arch.logit_softcap:
        coeff = coeff * (1 - (logits / arch.logit_softcap) ** 2)
    w = arch.unembedding
    return (coeff.to(w.dtype) @ w).float()


def _hinge_value_and_grad(handle, delta: torch.Tensor, logits: torch.Tensor, max_change: float,
                          reduction: str) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`logit_penalty` of a (n, vocab) Δlogit and its gradient w.r.t. the steered normed state (n, hidden).

    Δlogit = logits(steered) − logits(unsteered); ``logits``: the steered ones.
    The centring's adjoint subtracts each row's mean coefficient.  For
    ``max`` without a soft-cap the coefficient is one token per row, so the
    gradient is W_U[t*] − mean(W_U), with no pass over the vocabulary.
    """
    n = delta.shape[0]
    if reduction == "max":
        # the worst centred change from the row's max, min and mean: no (n, vocab) temporaries
        worst, t, sign = _worst_centred(delta)
        excess = F.relu(worst - float(max_change))
        value = excess.mean()
        sign = sign * (excess > 0).float() / n
        if not handle.arch.logit_softcap:
            w = handle.arch.unembedding
            rows = w.index_select(0, t.to(w.device)).float() - _unembedding_mean(handle).to(w.device)
            return value, (sign.to(w.device).unsqueeze(1) * rows).to(delta.device)
        coeff = torch.zeros_like(delta).scatter_(1, t.unsqueeze(1), sign.unsqueeze(1))
    else:
        c = centred(delta)
        excess = F.relu(c.abs() - float(max_change))
        coeff = (excess > 0).float() * c.sign()
        value = (excess.mean(-1) if reduction == "mean" else excess.sum(-1)).mean()
        coeff = coeff / (n * (c.shape[-1] if reduction == "mean" else 1))
    coeff = coeff - coeff.mean(-1, keepdim=True)  # the centring's adjoint
    return value, _logit_grad(handle, coeff, logits)


def _worst_centred(delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per row of a (n, vocab) Δlogit: max |centred Δlogit|, the token where it is, and its sign (±1)."""
    mean = delta.mean(-1)
    hi, lo = delta.max(-1), delta.min(-1)
    up, down = hi.values - mean, mean - lo.values
    above = up >= down
    return torch.where(above, up, down), torch.where(above, hi.indices, lo.indices), above.float() * 2 - 1


def _with_grad(value: torch.Tensor, grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``value`` as a number whose gradient w.r.t. ``x`` is ``grad`` (a first-order surrogate: exact value and gradient)."""
    return value.detach() + (grad.to(x.device, x.dtype) * (x - x.detach())).sum()


def _chunk_penalty(handle, base_final: torch.Tensor, steered_final: torch.Tensor, added: torch.Tensor,
                   max_change: float, reduction: str, use_logit: bool, use_kl: bool
                   ) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(logit term, KL term, max |centred real Δlogit|) of one chunk of positions.

    Every pass over the vocabulary runs without autograd: the values and
    their exact gradients w.r.t. the normed states are computed here, and
    autograd carries them back through the final norm only
    (:func:`_with_grad`).  Costs three logit passes (unsteered, steered,
    direct path) and one for the KL gradient; the old autograd version paid
    seven (with checkpointing) plus the elementwise work of backward.
    """
    arch = handle.arch
    zero = steered_final.new_zeros(())
    normed_s = arch.final_hidden(steered_final.to(handle.dtype))
    with torch.no_grad():
        base_logits = logits_of(handle, base_final)
        steered_logits = arch.logits(normed_s.detach())
        delta = steered_logits - base_logits
        worst = float(_worst_centred(delta)[0].max())
    logit_term, kl_term = zero, zero
    if use_logit:
        with torch.no_grad():
            real, real_grad = _hinge_value_and_grad(handle, delta, steered_logits, max_change, reduction)
        logit_term = _with_grad(real, real_grad, normed_s)
        # the direct path (direct_delta_logits): the vector added straight to the unsteered final residual
        normed_d = arch.final_hidden(base_final.to(handle.dtype) + added.to(base_final.device, handle.dtype))
        with torch.no_grad():
            direct_logits = arch.logits(normed_d.detach())
            direct, direct_grad = _hinge_value_and_grad(handle, direct_logits - base_logits, direct_logits,
                                                        max_change, reduction)
        logit_term = logit_term + _with_grad(direct, direct_grad, normed_d)
    if use_kl:
        with torch.no_grad():
            # KL(p_b ‖ p_s) = logZ_s − logZ_b − Σ p_b Δz, with fewer (n, vocab) temporaries than kl_penalty
            lse_b, lse_s = base_logits.logsumexp(-1, keepdim=True), steered_logits.logsumexp(-1, keepdim=True)
            p_b = (base_logits - lse_b).exp_()
            kl = (lse_s - lse_b)[:, 0].sub_((p_b * delta).sum(-1)).mean()
            # ∂ KL / ∂ steered logits = (p_s − p_b), averaged over the rows
            coeff = (steered_logits - lse_s).exp_().sub_(p_b).div_(delta.shape[0])
            kl_grad = _logit_grad(handle, coeff, steered_logits)
        kl_term = _with_grad(kl, kl_grad, normed_s)
    return logit_term.float(), kl_term.float(), worst


def penalties(handle, base_final: torch.Tensor, steered_final: torch.Tensor, added: torch.Tensor,
              max_change: float, reduction: str, use_logit: bool, use_kl: bool) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(logit penalty, KL penalty, max |centred real Δlogit|) over positions given as final residuals (n, hidden).

    Both penalties are means over the ``n`` positions, with exact values and
    gradients (w.r.t. ``steered_final`` and ``added``).  The full-vocabulary
    logits are computed a chunk of positions at a time (:func:`chunk_bounds`) without
    autograd (:func:`_chunk_penalty`), so memory stays that of one chunk.
    """
    zero = steered_final.new_zeros(())
    n = steered_final.shape[0]
    if not (use_logit or use_kl) or n == 0:
        return zero, zero, float("nan")
    logit_term, kl_term, worst = zero, zero, 0.0
    for start, end in chunk_bounds(n):
        base, steered = base_final[start:end], steered_final[start:end]
        lt, kt, w = _chunk_penalty(handle, base, steered, added, max_change, reduction, use_logit, use_kl)
        share = len(steered) / n
        logit_term = logit_term + share * lt.to(logit_term.device)
        kl_term = kl_term + share * kt.to(kl_term.device)
        worst = max(worst, w)
    return logit_term, kl_term, worst


def penalty_terms(handle, batch: SuffixBatch, added: torch.Tensor, steered_final: torch.Tensor,
                  rows: Sequence[int] | slice, max_change: float, reduction: str,
                  use_logit: bool, use_kl: bool) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(logit penalty, KL penalty, max |centred real Δlogit|) at the last position of some rows of a batch."""
    return penalties(handle, batch.final_last[rows], steered_final[rows], added, max_change, reduction,
                     use_logit, use_kl)


def max_centred_delta(handle, base_final: torch.Tensor, steered_final: torch.Tensor) -> float:
    """max |centred Δlogit| over positions given as final residuals (n, hidden), without gradients; 0 for none."""
    worst = 0.0
    with torch.no_grad():
        for start, end in chunk_bounds(base_final.shape[0]):
            delta = logits_of(handle, steered_final[start:end]) - logits_of(handle, base_final[start:end])
            worst = max(worst, float(_worst_centred(delta)[0].max()))
    return worst


def delta_stats(handle, base_final: torch.Tensor, steered_final: torch.Tensor | Sequence[torch.Tensor],
                added: torch.Tensor | Sequence[torch.Tensor]) -> dict | list[dict]:
    """Per-position Δlogit statistics of final residuals (n, hidden), without gradients.

    ``max_abs`` and ``max_abs_centred`` (n,): the worst token's raw and
    centred |Δlogit|; ``kl`` (n,); ``signed`` (vocab,): each token's change at
    the position where it moved most (for :func:`top_offenders`);
    ``direct_max``: the worst direct-path |Δlogit|.  Several steered versions
    of the same positions (lists of ``steered_final`` and ``added``) share one
    unsteered pass and give a list of dicts.
    """
    many = isinstance(steered_final, (list, tuple))
    steered_list = list(steered_final) if many else [steered_final]
    added_list = list(added) if many else [added]
    outs = [{"max_abs": [], "max_abs_centred": [], "kl": [], "signed": None, "direct_max": 0.0}
            for _ in steered_list]
    arch = handle.arch
    with torch.no_grad():
        for start, end in chunk_bounds(base_final.shape[0]):
            base_h = base_final[start:end].to(handle.dtype)
            base = arch.logits(arch.final_hidden(base_h))
            lb = base.log_softmax(-1)
            pb = lb.exp()
            for out, steered_h, add in zip(outs, steered_list, added_list):
                steered = logits_of(handle, steered_h[start:end])
                delta = steered - base
                out["max_abs"].append(delta.abs().max(-1).values.cpu())
                out["max_abs_centred"].append(centred(delta).abs().max(-1).values.cpu())
                out["kl"].append((pb * (lb - steered.log_softmax(-1))).sum(-1).cpu())
                signed = delta.gather(0, delta.abs().argmax(0, keepdim=True))[0]
                prev = out["signed"]
                out["signed"] = signed if prev is None else torch.where(signed.abs() > prev.abs(), signed, prev)
                # the direct path (direct_delta_logits), sharing the unsteered logits
                direct = arch.logits(arch.final_hidden(base_h + add.to(base_h.device, base_h.dtype))) - base
                out["direct_max"] = max(out["direct_max"], float(direct.abs().max()))
    for out in outs:
        for key in ("max_abs", "max_abs_centred", "kl"):
            out[key] = torch.cat(out[key]) if out[key] else torch.zeros(0)
    return outs if many else outs[0]


def summarise_delta(handle, stats: Sequence[dict], top_k: int = 10) -> dict:
    """The report of :func:`delta_stats` over several groups of positions (e.g. batches)."""
    stats = [s for s in stats if len(s["max_abs"])]
    if not stats:
        return {"max_abs_delta_logit": None, "rows": 0}
    raw = torch.cat([s["max_abs"] for s in stats])
    cen = torch.cat([s["max_abs_centred"] for s in stats])
    worst = stats[0]["signed"]
    for s in stats[1:]:
        worst = torch.where(s["signed"].abs() > worst.abs(), s["signed"], worst)
    return {
        "max_abs_delta_logit": float(raw.max()),
        "max_abs_centred_delta_logit": float(cen.max()),
        "median_max_abs_delta_logit": float(raw.median()),
        "direct_max_abs_delta_logit": max(s["direct_max"] for s in stats),
        "mean_kl": float(torch.cat([s["kl"] for s in stats]).mean()),
        "rows": int(raw.numel()),
        "top_tokens": top_offenders(handle, worst, top_k),
    }


def measure_delta(handle, batches: Sequence[SuffixBatch], added: torch.Tensor, top_k: int = 10,
                  finals: Sequence[torch.Tensor] | None = None) -> dict:
    """max |Δlogit| (raw and centred) at the last position over every cached row, KL, and the top offending tokens.

    ``finals``: the steered final residuals per batch when the caller already
    has them (saves re-running the blocks).
    """
    stats = []
    with torch.no_grad():
        for n, b in enumerate(batches):
            final = finals[n] if finals is not None else run_suffix(handle, b, added)
            stats.append(delta_stats(handle, b.final_last, final, added))
    return summarise_delta(handle, stats, top_k)


# ------------------------------------------------------ constrain a vector
@with_dense_unembedding  # the penalty reads W_U at every step
def constrain_vector(handle, vector, layer: int | None = None, alpha: float = 1.0,
                     prompts: Sequence[str] | None = None, max_change: float = DEFAULT_MAX_CHANGE, *,
                     relative: bool = False, logit_weight: float = 1.0, kl_weight: float = 0.1,
                     reduction: str = "sum", steps: int = 60, lr: float = 0.05, progress: Progress | None = None):
    """Rotate ``vector`` so that, added at ``layer`` with strength ``alpha``, no logit moves more than ``max_change``.

    ``vector``: a :class:`SteeringVector` (its layer unless ``layer`` is given)
    or a 1-D tensor (then ``layer`` is required).  The added vector is
    ``alpha_raw · u/‖u‖`` with ``alpha_raw = alpha`` times ‖v‖ in raw units, or
    times the layer's mean residual norm when ``relative``; only the direction
    ``u`` is optimised (starting from v), so the strength stays what the user
    asked for.  Loss: (1 − cos(u, v)) + logit_weight · (hinge on the real and
    direct-path Δlogit) + kl_weight · KL, on the last position of ``prompts``
    (default: neutral sentences).

    Returns (new vector of the same type and norm as the input, report) where
    the report has before/after max |Δlogit|, KL, top offending tokens, the
    cosine to the original and the loss per step.
    """
    from ..vector import SteeringVector

    if isinstance(vector, SteeringVector):
        layer = vector.layer if layer is None else layer
        original = vector.direction(layer if layer in vector.directions else None).float()
    else:
        original = torch.as_tensor(vector).detach().float().reshape(-1)
        if layer is None:
            raise ValueError("constrain_vector needs a layer when given a bare tensor")
    if original.numel() != handle.arch.hidden_size:
        raise ValueError(f"vector has {original.numel()} values but the model's hidden size is {handle.arch.hidden_size}")
    norm = float(original.norm())
    if norm == 0:
        raise ValueError("the vector is all zeros: nothing to constrain")
    alpha_raw = float(alpha) * (relative_scale(handle, layer) if relative else norm)
    prompts = list(prompts or NEUTRAL_PROMPTS)
    batches = cache_prefix(handle, prompts, layer)
    target = original / norm

    def added_of(u: torch.Tensor) -> torch.Tensor:
        return alpha_raw * u / u.norm().clamp_min(1e-12)

    before = measure_delta(handle, batches, added_of(target))
    u = target.clone().requires_grad_(True)
    opt = torch.optim.Adam([u], lr=lr)
    curve = []
    for step in range(int(steps)):
        opt.zero_grad()
        added = added_of(u)
        total_logit, total_kl, worst = 0.0, 0.0, 0.0
        loss = 1 - F.cosine_similarity(u, target, dim=0)
        for b in batches:
            steered = run_suffix(handle, b, added)
            lt, kt, w = penalty_terms(handle, b, added, steered, slice(None), max_change, reduction,
                                      logit_weight > 0, kl_weight > 0)
            share = len(b) / len(prompts)
            loss = loss + share * (logit_weight * lt + kl_weight * kt)
            total_logit += share * float(lt.detach())
            total_kl += share * float(kt.detach())
            worst = max(worst, w)
        loss.backward()
        opt.step()
        curve.append({"step": step, "loss": float(loss.detach()), "logit_penalty": total_logit, "kl": total_kl,
                      "max_abs_delta_logit": worst, "cosine": float(F.cosine_similarity(u.detach(), target, dim=0))})
        if progress:
            progress((step + 1) / steps,
                     Said("progress_constraining", step=step + 1, steps=steps, worst=f"{worst:.2f}"))
    final_unit = (u.detach() / u.detach().norm()).float()
    after = measure_delta(handle, batches, added_of(final_unit))
    report = {
        "layer": layer, "alpha_raw": alpha_raw, "max_change": max_change,
        "before": before, "after": after,
        "cosine_to_original": float(torch.dot(final_unit, target)),
        "curve": curve,
        "settings": {"logit_weight": logit_weight, "kl_weight": kl_weight, "reduction": reduction,
                     "steps": steps, "lr": lr, "prompts": len(prompts)},
    }
    new_direction = final_unit * norm
    if isinstance(vector, SteeringVector):
        hp = dict(vector.hyperparameters)
        hp["constrained"] = {"max_change": max_change, "alpha_raw": alpha_raw, **report["settings"]}
        metrics = dict(vector.metrics)
        metrics["constrained_max_abs_delta_logit"] = after["max_abs_delta_logit"]
        return vector.with_direction(layer, new_direction, hyperparameters=hp, metrics=metrics), report
    return new_direction, report
