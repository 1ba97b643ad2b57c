"""Shared pieces of the classic methods: probes, scores, layer choice, α range, the record.

Conventions (all methods):

* activations come from :func:`steer_ui.data.activations.extract` on the
  labelled view of the dataset (pairs give a label-1 and a label-0 row each);
* the train/test split is by group (:func:`steer_ui.data.split_indices`);
  directions are fitted on train rows only and every number labelled
  ``test_*`` is measured on the held-out groups;
* when no layer is given, the layer is chosen by grouped cross-validation
  *inside the training split* (never by test scores);
* directions point toward the positive class (label 1 / the pair's
  ``positive``).  Raw α = 1 moves an activation by the distance between the
  class means measured along the direction; relative α is handled by
  :mod:`steer_ui.model.units` (fraction of the layer's residual norm).
"""
from __future__ import annotations

import math
import time
from typing import Any, Callable, Sequence

import numpy as np
import torch

from ..data import Dataset, DatasetError, split_indices
from ..data.activations import Activations, extract
from ..messages import Said
from ..model.units import NEUTRAL_PROMPTS
from ..vector import SteeringVector
from .base import Progress

TEST_FRACTION = 0.25
KL_BOUND = 1.0  # nats, mean over the sweep prompts
ALPHA_GRID = (0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0)  # relative units
SWEEP_PROMPTS = NEUTRAL_PROMPTS[:2]


def one_blas_thread():
    """Many tiny BLAS calls (a probe per layer or head) run several times faster on one thread than on
    several that spin-wait for each other on a busy CPU."""
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=1, user_api="blas")


def clean(obj: Any) -> Any:
    """JSON-safe: NaN/inf -> None, numpy scalars -> Python."""
    if isinstance(obj, dict):
        return {k: clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean(v) for v in obj]
    if isinstance(obj, (np.floating, float)):
        return float(obj) if math.isfinite(float(obj)) else None
    if isinstance(obj, np.integer):
        return int(obj)
    return obj


def sub_progress(progress: Progress, lo: float, hi: float) -> Progress:
    """Map a callback's [0, 1] onto [lo, hi] of an outer one."""
    return lambda f, m: progress(lo + (hi - lo) * float(f), m)


# ------------------------------------------------------------------ data
def prepare(handle, dataset: Dataset, position: str | int = "last", template: str | None = None,
            site: str = "resid", seed: int = 0, test_fraction: float = TEST_FRACTION,
            progress: Progress | None = None) -> tuple[Dataset, Activations, list[int], list[int]]:
    """(labelled dataset, activations of every row, train indices, test indices)."""
    labelled = dataset.as_labelled()
    train_idx, test_idx = split_indices(labelled, test_fraction=test_fraction, seed=seed)
    acts = extract(handle, labelled, position=position, template=template, site=site, progress=progress)
    return labelled, acts, train_idx, test_idx


TRAINING_SPLIT, TEST_SPLIT = Said("split_training"), Said("split_test")  # a split's name, said in the page's language


def check_binary(y: np.ndarray, where: str) -> None:
    """Refused unless ``y`` holds both classes; ``where`` names the split (:data:`TRAINING_SPLIT`, ...)."""
    if len(np.unique(y)) < 2:
        raise DatasetError.from_key("method_single_class", where=where)


# ------------------------------------------------------------------ scores
def auroc(scores, labels) -> float:
    from sklearn.metrics import roc_auc_score

    labels = np.asarray(labels)
    if len(np.unique(labels)) < 2:
        return float("nan")
    return float(roc_auc_score(labels, np.asarray(scores, dtype=np.float64)))


def fit_probe(x: np.ndarray, y: np.ndarray, c: float = 1.0, seed: int = 0):
    """Standardised L2 logistic regression: returns a fitted sklearn pipeline (scaler, classifier)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    model = make_pipeline(StandardScaler(), LogisticRegression(C=c, max_iter=2000, random_state=seed))
    model.fit(x, y)
    return model


def probe_weight(model) -> np.ndarray:
    """The probe's normal vector in activation space: w_std / σ (the decision function is w·x + b)."""
    scaler, clf = model[0], model[-1]
    scale = np.where(scaler.scale_ > 0, scaler.scale_, 1.0)
    return clf.coef_[0] / scale


def projection_metrics(direction: torch.Tensor, x: torch.Tensor, y: np.ndarray, train_idx: Sequence[int],
                       test_idx: Sequence[int]) -> dict[str, float]:
    """AUROC and accuracy of ``x · direction`` (threshold: midpoint of the train class means)."""
    scores = (x.double() @ direction.double()).numpy()
    tr, te = np.asarray(train_idx), np.asarray(test_idx)
    mid = 0.5 * (scores[tr][y[tr] == 1].mean() + scores[tr][y[tr] == 0].mean())
    # the names spelled out: the page shows each in words by its name (plots/results in steer_ui/locales)
    out = {}
    for auroc_name, accuracy_name, idx in (("train_auroc", "train_accuracy", tr), ("test_auroc", "test_accuracy", te)):
        out[auroc_name] = auroc(scores[idx], y[idx])
        out[accuracy_name] = float(((scores[idx] > mid).astype(int) == y[idx]).mean())
    return out


def class_separation(direction: torch.Tensor, x: torch.Tensor, y: np.ndarray) -> float:
    """Distance between the class means along the unit direction (positive if + points to class 1)."""
    u = direction / direction.norm().clamp_min(1e-12)
    proj = x.double() @ u.double()
    yt = torch.as_tensor(y)
    return float(proj[yt == 1].mean() - proj[yt == 0].mean())


# ------------------------------------------------------------------ α range
def alpha_range_from_kl(kl_at: Callable[[list[float]], np.ndarray], grid: Sequence[float] = ALPHA_GRID,
                        bound: float = KL_BOUND) -> tuple[tuple[float, float], list[dict[str, float]]]:
    """Largest |α| on each side whose mean KL stays under ``bound``.

    ``kl_at(alphas)`` returns the mean KL (nats) to the unsteered next-token
    distribution for each α.  Returns ((low, high), table).
    """
    alphas = [-a for a in reversed(grid)] + list(grid)
    kl = np.asarray(kl_at(alphas), dtype=float)
    table = [{"alpha": float(a), "kl": float(k)} for a, k in zip(alphas, kl)]
    by_alpha = dict(zip(alphas, kl))

    def reach(sign: float) -> float:
        # Walk out from 0 and stop before the first α that breaks the bound (the range stays contiguous).
        best = grid[0]
        for a in grid:
            if not by_alpha[sign * a] <= bound:  # NaN counts as breaking it
                break
            best = a
        return sign * best

    return (float(reach(-1.0)), float(reach(1.0))), table


def residual_alpha_range(handle, direction: torch.Tensor, layer: int, prompts: Sequence[str] = SWEEP_PROMPTS,
                         bound: float = KL_BOUND) -> tuple[tuple[float, float], list[dict[str, float]]]:
    """Recommended relative α range for a residual direction at ``layer`` (see :func:`alpha_range_from_kl`)."""
    from ..model.analysis import mean_kl_curve

    return alpha_range_from_kl(lambda alphas: mean_kl_curve(handle, direction, layer, alphas, prompts), bound=bound)


# ------------------------------------------------------------------ record
def make_record(handle, method: str, directions: dict[int, torch.Tensor], dataset: Dataset, *,
                hyperparameters: dict[str, Any], metrics: dict[str, Any], alpha_range: tuple[float, float] | None,
                extras: dict[str, torch.Tensor] | None = None, site: str | None = None, name: str = "") -> SteeringVector:
    kwargs: dict[str, Any] = {}
    if site:
        kwargs["site"] = site
    return SteeringVector(
        directions=directions, hidden_size=handle.arch.hidden_size, method=method, model_id=handle.model_id,
        model_type=handle.model_type, name=name or f"{method} · {dataset.source}",
        hyperparameters=hyperparameters, dataset_hash=dataset.content_hash, metrics=metrics,
        alpha_range=alpha_range, extras=extras or {}, **kwargs,
    )


class Timer:
    def __init__(self) -> None:
        self.start = time.perf_counter()

    def __call__(self) -> float:
        return round(time.perf_counter() - self.start, 3)
