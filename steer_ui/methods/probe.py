"""Probe direction: the weight of a logistic-regression probe, mapped back to activation space.

The probe is fitted on standardised features (z = (h − μ) / σ, L2 penalty),
so its decision function is ``w·z + b = (w / σ)·h + b′``: the normal of the
decision boundary in activation space is ``w / σ``.  That is the stored
direction, oriented toward the positive class and scaled so raw α = 1 moves
an activation by the distance between the class means along it
(``normalize=True``: unit length instead).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .base import setting
from .common import class_separation, fit_probe, probe_weight
from .residual import ResidualMethod, ResidualSettings


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


@dataclass
class ProbeSettings(ResidualSettings):
    C: float = setting(1.0, "inverse L2 strength of the logistic regression", minimum=1e-6, maximum=1e6, ui=False)


class Probe(ResidualMethod):
    name = "probe"
    label = "Logistic probe"
    Settings = ProbeSettings

    def fit(self, x, y, train_idx, dataset, labelled, settings):
        vec, info = direction(x[train_idx], y[train_idx], normalize=settings.normalize, C=settings.C,
                              seed=settings.seed)
        return vec, info, []


METHOD = Probe()
