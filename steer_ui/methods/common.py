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
  :func:`steer_ui.steering.build_steers` (fraction of the layer's residual norm).
"""
from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import numpy as np
import torch

from ..data import Dataset, DatasetError, split_indices
from ..data.activations import Activations, extract
from ..model.analysis import NEUTRAL_PROMPTS
from ..vector import SteeringVector

Progress = Callable[[float, str], None]
TEST_FRACTION = 0.25
KL_BOUND = 1.0  # nats, mean over the sweep prompts
ALPHA_GRID = (0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0)  # relative units
SWEEP_PROMPTS = NEUTRAL_PROMPTS[:2]


def one_blas_thread():
    """Many tiny BLAS calls (a probe per layer or head) run several times faster on one thread than on
    several that spin-wait for each other on a busy CPU."""
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=1, user_api="blas")


def noop(_f: float, _m: str) -> None:
    pass


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


def check_binary(y: np.ndarray, where: str) -> None:
    if len(np.unique(y)) < 2:
        raise DatasetError(f"the {where} has a single class; a probe needs true and false rows on each side of "
                           "the split (add rows or groups)")


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
    out = {}
    for name, idx in (("train", tr), ("test", te)):
        out[f"{name}_auroc"] = auroc(scores[idx], y[idx])
        out[f"{name}_accuracy"] = float(((scores[idx] > mid).astype(int) == y[idx]).mean())
    return out


def class_separation(direction: torch.Tensor, x: torch.Tensor, y: np.ndarray) -> float:
    """Distance between the class means along the unit direction (positive if + points to class 1)."""
    u = direction / direction.norm().clamp_min(1e-12)
    proj = x.double() @ u.double()
    yt = torch.as_tensor(y)
    return float(proj[yt == 1].mean() - proj[yt == 0].mean())


# ------------------------------------------------------------------ layers
def grouped_cv_splits(y: np.ndarray, train_idx: Sequence[int], groups: Sequence[str], seed: int = 0,
                      folds: int = 3) -> list[tuple[np.ndarray, np.ndarray]]:
    """Stratified grouped K-fold inside the train split (positions into ``train_idx``); folds with one class dropped."""
    from sklearn.model_selection import StratifiedGroupKFold

    tr = np.asarray(train_idx)
    g = np.asarray(groups)[tr]
    n_folds = int(min(folds, len(np.unique(g))))
    if n_folds < 2:
        return []
    splitter = StratifiedGroupKFold(n_splits=n_folds, shuffle=True, random_state=seed)
    return [(f, v) for f, v in splitter.split(np.zeros(len(tr)), y[tr], g)
            if len(np.unique(y[tr][f])) == 2 and len(np.unique(y[tr][v])) == 2]


def _cv_auroc(x_train: np.ndarray, y_train: np.ndarray, splits, c: float, seed: int) -> float:
    scores = [auroc(fit_probe(x_train[f], y_train[f], c=c, seed=seed).predict_proba(x_train[v])[:, 1], y_train[v])
              for f, v in splits]
    return float(np.mean(scores)) if scores else float("nan")


def layer_scores(acts: Activations, y: np.ndarray, train_idx: Sequence[int], test_idx: Sequence[int],
                 groups: Sequence[str], seed: int = 0, folds: int = 3, progress: Progress | None = None,
                 c: float = 1.0) -> list[dict[str, Any]]:
    """Per layer: held-out probe AUROC/accuracy, mean-difference AUROC and a grouped CV AUROC on train."""
    progress = progress or noop
    tr, te = np.asarray(train_idx), np.asarray(test_idx)
    check_binary(y[tr], "training split")
    check_binary(y[te], "test split")
    splits = grouped_cv_splits(y, tr, groups, seed, folds)
    rows = []
    with one_blas_thread():
        for layer in range(acts.num_layers):
            x = acts.layer(layer).numpy().astype(np.float64)
            prob = fit_probe(x[tr], y[tr], c=c, seed=seed).predict_proba(x[te])[:, 1]
            mean_diff = x[tr][y[tr] == 1].mean(0) - x[tr][y[tr] == 0].mean(0)
            rows.append({
                "layer": layer,
                "auroc": auroc(prob, y[te]),
                "accuracy": float(((prob > 0.5).astype(int) == y[te]).mean()),
                "mean_diff_auroc": auroc(x[te] @ mean_diff, y[te]),
                "cv_auroc": _cv_auroc(x[tr], y[tr], splits, c, seed),
            })
            progress((layer + 1) / acts.num_layers, f"probing layer {layer + 1}/{acts.num_layers}")
    return rows


def choose_layer(rows: list[dict[str, Any]], tolerance: float = 0.005) -> int:
    """The earliest layer whose train-split CV AUROC is within ``tolerance`` of the best one.

    Earlier layers leave more of the network to act on a steered direction, and
    the plateau of near-perfect probes usually spans many layers.
    """
    cv = np.array([r["cv_auroc"] for r in rows], dtype=float)
    if np.isnan(cv).all():  # too few groups for CV: fall back to the middle of the network
        return len(rows) // 2
    best = np.nanmax(cv)
    return int(np.flatnonzero(cv >= best - tolerance)[0])


def choose_layer_on_train(acts: Activations, y: np.ndarray, train_idx: Sequence[int], groups: Sequence[str],
                          seed: int = 0, progress: Progress | None = None) -> tuple[int, list[dict[str, Any]]]:
    """Pick a layer from the train split only (grouped CV of a probe on each layer)."""
    progress = progress or noop
    tr = np.asarray(train_idx)
    splits = grouped_cv_splits(y, tr, groups, seed)
    if not splits:
        return acts.num_layers // 2, []
    rows = []
    with one_blas_thread():
        for layer in range(acts.num_layers):
            x = acts.layer(layer).numpy().astype(np.float64)[tr]
            rows.append({"layer": layer, "cv_auroc": _cv_auroc(x, y[tr], splits, 1.0, seed)})
            progress((layer + 1) / acts.num_layers, f"choosing a layer: {layer + 1}/{acts.num_layers}")
    return choose_layer(rows), rows


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
    from ..model.analysis import sweep

    unit = direction / direction.norm().clamp_min(1e-12)
    scale = handle.relative_scale(layer)

    def kl_at(alphas: list[float]) -> np.ndarray:
        total = np.zeros(len(alphas))
        for p in prompts:
            frame = sweep(handle, p, unit, layer, [a * scale for a in alphas])
            total += frame["kl"].to_numpy()
        return total / len(prompts)

    return alpha_range_from_kl(kl_at, bound=bound)


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
