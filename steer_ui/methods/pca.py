"""PCA of paired differences (repeng's ``pca_diff``), sign-fixed toward the positive class.

For each pair (positive, negative) take d = h⁺ − h⁻ and the first principal
component of the d's.  Like repeng (scikit-learn's PCA) the differences are
centred by default (``center=False`` keeps the mean, so a consistent offset
dominates PC1).  A principal component has no sign: as repeng does, we flip
it when fewer pairs have the positive side projecting higher than the
negative side (ties: by the mean gap).  Raw α = 1
moves an activation by the class-mean distance along the component
(``normalize=True``: unit length instead).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .base import setting
from .common import class_separation
from .residual import ResidualMethod, ResidualSettings


def direction(pos: torch.Tensor, neg: torch.Tensor, normalize: bool = False,
              center: bool = True) -> tuple[torch.Tensor, dict]:
    """``pos``/``neg``: (pairs, hidden) activations of the positive and negative side of each pair."""
    pos = torch.as_tensor(pos, dtype=torch.float64)
    neg = torch.as_tensor(neg, dtype=torch.float64)
    if pos.shape != neg.shape or pos.shape[0] < 2:
        raise ValueError("PCA of differences needs at least two pairs of equal shape")
    diffs = pos - neg
    centred = diffs - diffs.mean(0, keepdim=True) if center else diffs
    _u, s, vh = torch.linalg.svd(centred, full_matrices=False)
    pc = vh[0]
    explained = float((s[0] ** 2) / (s ** 2).sum().clamp_min(1e-30))
    x = torch.cat([pos, neg])
    y = np.r_[np.ones(len(pos), dtype=int), np.zeros(len(neg), dtype=int)]
    gap = (pos - neg) @ pc
    votes = int((gap > 0).sum()) - int((gap < 0).sum())
    sep = class_separation(pc, x, y)
    if votes < 0 or (votes == 0 and sep < 0):
        pc, sep = -pc, -sep
    vec = pc if normalize else pc * abs(sep)  # keep the voted sign; the length is the class gap
    return vec.float(), {"explained_variance_ratio": explained, "class_separation": sep,
                         "pairs": int(len(pos))}


def pair_indices(dataset, labelled, idx: list[int], seed: int) -> tuple[list[int], list[int], str]:
    """Positive and negative row indices forming pairs among ``idx`` (same group), and a warning if paired at random."""
    if dataset.kind == "pairs":  # as_labelled interleaves: row 2i positive, 2i+1 its negative
        pos = [i for i in idx if i % 2 == 0 and i + 1 in set(idx)]
        return pos, [i + 1 for i in pos], ""
    y = labelled.labels
    groups = labelled.groups
    by_group: dict[str, tuple[list[int], list[int]]] = {}
    for i in idx:
        by_group.setdefault(groups[i], ([], []))[0 if y[i] == 1 else 1].append(i)
    pos, neg = [], []
    for p, n in by_group.values():
        if p and n:
            for k in range(max(len(p), len(n))):
                pos.append(p[k % len(p)])
                neg.append(n[k % len(n)])
    if pos:
        return pos, neg, ""
    rng = np.random.default_rng(seed)
    p = [i for i in idx if y[i] == 1]
    n = [i for i in idx if y[i] == 0]
    p, n = list(rng.permutation(p)), list(rng.permutation(n))
    k = max(len(p), len(n))
    return ([int(p[j % len(p)]) for j in range(k)], [int(n[j % len(n)]) for j in range(k)],
            "no group holds both classes: positives and negatives were paired at random for PCA")


@dataclass
class PCASettings(ResidualSettings):
    center: bool = setting(True, "centre the paired differences before the PCA (repeng's pca_diff)", ui=False)


class PCA(ResidualMethod):
    name = "pca"
    label = "PCA of paired differences"
    Settings = PCASettings

    def fit(self, x, y, train_idx, dataset, labelled, settings):
        pos, neg, warn = pair_indices(dataset, labelled, train_idx, settings.seed)
        vec, info = direction(x[pos], x[neg], normalize=settings.normalize, center=settings.center)
        return vec, info, [warn] if warn else []


METHOD = PCA()
