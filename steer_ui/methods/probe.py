"""Probe direction: the weight of a logistic-regression probe, mapped back to activation space.

The probe is fitted on standardised features (z = (h − μ) / σ, L2 penalty),
so its decision function is ``w·z + b = (w / σ)·h + b′``: the normal of the
decision boundary in activation space is ``w / σ``.  That is the stored
direction, oriented toward the positive class and scaled so raw α = 1 moves
an activation by the distance between the class means along it
(``normalize=True``: unit length instead).
"""
from __future__ import annotations

import numpy as np
import torch

from .common import class_separation, fit_probe, probe_weight

METHOD = "probe"
DEFAULTS = {"normalize": False, "C": 1.0}


def direction(x: torch.Tensor, y: np.ndarray, normalize: bool = False, C: float = 1.0,
              seed: int = 0) -> tuple[torch.Tensor, dict]:
    x = torch.as_tensor(x, dtype=torch.float64)
    y = np.asarray(y)
    model = fit_probe(x.numpy(), y, c=C, seed=seed)
    w = torch.as_tensor(probe_weight(model), dtype=torch.float64)
    unit = w / w.norm().clamp_min(1e-12)
    sep = class_separation(unit, x, y)
    if sep < 0:  # a probe always points to class 1 on its training data; guard against degenerate fits
        unit, sep = -unit, -sep
    vec = unit if normalize else unit * sep
    info = {"train_probe_accuracy": float(model.score(x.numpy(), y)), "class_separation": sep}
    return vec.float(), info
