"""TSV's maths on tensors: class probabilities, Sinkhorn pseudo-labels, confident rows, EMA prototypes.

Pure functions of tensors (no model, no data frames), after Park et al.
(ICML 2025): two prototypes on the unit sphere, μ_hallucinated (class 0)
and μ_truthful (class 1), give p(c | r) = softmax_c(κ μ_cᵀ r).
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F

from .data import TSVError


def class_probs(reps: torch.Tensor, prototypes: torch.Tensor, kappa: float) -> torch.Tensor:
    """p(c | r) = softmax(κ μ_cᵀ r) for L2-normalised r and μ: (rows, 2), on ``reps``' device."""
    protos = F.normalize(prototypes.to(reps.device, reps.dtype), dim=-1)
    return (kappa * F.normalize(reps, dim=-1) @ protos.T).softmax(-1)


def sinkhorn(logits: torch.Tensor, marginals: torch.Tensor, epsilon: float = 0.05,
             iterations: int = 3) -> torch.Tensor:
    """Soft pseudo-labels (rows, classes) by Sinkhorn–Knopp optimal transport.

    ``logits``: κ·similarities (rows, classes).  The cost is the model's
    log-probability scaled by 1/ε; rows are alternately rescaled so class
    totals match ``marginals`` (proportions summing to 1) and each sample's
    labels sum to 1, which is the last step, so per-sample sums are exact and
    class totals approximate after few iterations.  Worked in the log domain
    (ε = 0.05 turns log-probabilities into exponents of hundreds).
    """
    marginals = torch.as_tensor(marginals, dtype=torch.float64, device=logits.device).reshape(-1)
    if marginals.numel() != logits.shape[1] or (marginals <= 0).any():
        raise TSVError(f"sinkhorn needs one positive marginal per class, got {marginals.tolist()}")
    marginals = marginals / marginals.sum()
    n = logits.shape[0]
    log_q = (logits.double().log_softmax(-1) / epsilon).T  # (classes, rows)
    for _ in range(iterations):
        log_q = log_q - torch.logsumexp(log_q, dim=1, keepdim=True) + marginals.log().unsqueeze(1)
        log_q = log_q - torch.logsumexp(log_q, dim=0, keepdim=True) - math.log(n)
    return (log_q.exp() * n).T.float()


def select_confident(probs: torch.Tensor, pseudo: torch.Tensor, k: int,
                     class_dist: Sequence[float]) -> torch.Tensor:
    """Indices of the ``k`` most confident pseudo-labelled rows, split across classes by ``class_dist``.

    A row belongs to the class its transport plan favours; confidence is low
    cross-entropy between the plan and the model's prediction (the paper's
    entropy criterion).  A class with fewer rows than its quota gives all it
    has; the quota is not refilled from the other class, so the selection
    keeps the exemplars' balance rather than the model's bias.
    """
    pseudo = pseudo.to(probs.device)
    ce = -(pseudo * (probs + 1e-8).log()).sum(1)
    hard = pseudo.argmax(1)
    chosen = []
    for c, share in enumerate(class_dist):
        members = (hard == c).nonzero(as_tuple=True)[0]
        quota = min(len(members), int(round(k * float(share))))
        if quota > 0:
            chosen.append(members[torch.topk(ce[members], quota, largest=False).indices])
    return torch.cat(chosen) if chosen else torch.zeros(0, dtype=torch.long, device=probs.device)


def ema_prototypes(prototypes: torch.Tensor, reps: torch.Tensor, weights: torch.Tensor,
                   decay: float = 0.99) -> torch.Tensor:
    """μ ← normalise(decay·μ + (1 − decay)·weighted class mean of normalised reps).

    ``weights`` (rows, classes): one-hot labels or soft pseudo-labels.  A class
    with no weight in the batch keeps its prototype.  The result lives on
    ``reps``' device (the prototypes and weights are moved there: a model on
    a GPU gives its representations there, whatever made the labels).
    """
    reps = F.normalize(reps.detach().float(), dim=-1)
    protos = F.normalize(prototypes.to(reps.device).float(), dim=-1)
    weights = weights.detach().to(reps.device).float()
    totals = weights.sum(0)
    means = (weights.T @ reps) / (totals.unsqueeze(1) + 1e-8)
    updated = F.normalize(decay * protos + (1 - decay) * means, dim=-1)
    return torch.where(totals.unsqueeze(1) > 0, updated, protos)
