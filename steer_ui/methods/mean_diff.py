"""Mean difference (CAA / mass-mean shift): v = mean(h | positive) − mean(h | negative).

With contrastive pairs every pair gives one positive and one negative row, so
this is also the mean of the paired differences (CAA).  ``normalize=True``
stores the unit vector; raw, α = 1 moves an activation from the negative
class mean to the positive one.
"""
from __future__ import annotations

import numpy as np
import torch

from .residual import ResidualMethod


def direction(x: torch.Tensor, y: np.ndarray, normalize: bool = False) -> tuple[torch.Tensor, dict]:
    """``x``: (rows, hidden) activations at one layer; ``y``: 0/1 labels.  Returns (vector, info)."""
    x = torch.as_tensor(x, dtype=torch.float64)
    yt = torch.as_tensor(np.asarray(y))
    if not ((yt == 1).any() and (yt == 0).any()):
        raise ValueError("mean difference needs rows of both classes")
    vec = x[yt == 1].mean(0) - x[yt == 0].mean(0)
    raw_norm = float(vec.norm())
    if normalize:
        vec = vec / vec.norm().clamp_min(1e-12)
    return vec.float(), {"raw_norm": raw_norm}


class MeanDiff(ResidualMethod):
    name = "mean-diff"
    label = "Mean difference (CAA)"

    def fit(self, x, y, train_idx, dataset, labelled, settings):
        vec, info = direction(x[train_idx], y[train_idx], normalize=settings.normalize)
        return vec, info, []


METHOD = MeanDiff()
