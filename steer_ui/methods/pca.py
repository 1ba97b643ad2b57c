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

import numpy as np
import torch

from .common import class_separation

METHOD = "pca"
DEFAULTS = {"normalize": False, "center": True}


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
