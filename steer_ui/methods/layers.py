"""Which layer: per-layer probes with held-out scores, and a layer chosen from the training split only."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..data import Dataset
from ..data.activations import Activations
from ..messages import Said
from .base import Progress, noop
from .common import (TEST_FRACTION, TEST_SPLIT, TRAINING_SPLIT, Timer, auroc, check_binary, clean, fit_probe,
                     one_blas_thread, prepare, sub_progress)


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
    check_binary(y[tr], TRAINING_SPLIT)
    check_binary(y[te], TEST_SPLIT)
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
            progress((layer + 1) / acts.num_layers,
                     Said("progress_probing_layer", layer=layer + 1, layers=acts.num_layers))
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
            progress((layer + 1) / acts.num_layers,
                     Said("progress_choosing_layer", layer=layer + 1, layers=acts.num_layers))
    return choose_layer(rows), rows


def probe_layers(handle, dataset: Dataset, position: str | int = "last", seed: int = 0,
                 progress: Progress | None = None, template: str | None = None,
                 test_fraction: float = TEST_FRACTION) -> dict:
    """Logistic probe per layer on the train split; held-out AUROC/accuracy per layer and a recommended layer.

    ``best_layer`` is chosen without looking at the test split: the earliest
    layer whose grouped 3-fold CV AUROC on the train split is within 0.005 of
    the best.  Returns ``{"layers": [{"layer", "auroc", "accuracy",
    "mean_diff_auroc", "cv_auroc"}], "best_layer", ...}``.
    """
    progress = progress or noop
    timer = Timer()
    labelled, acts, tr, te = prepare(handle, dataset, position=position, template=template, seed=seed,
                                     test_fraction=test_fraction, progress=sub_progress(progress, 0.0, 0.7))
    y = labelled.labels
    rows = layer_scores(acts, y, tr, te, labelled.groups, seed=seed, progress=sub_progress(progress, 0.7, 1.0))
    best = choose_layer(rows)
    progress(1.0, Said("progress_best_layer", layer=best))
    return clean({
        "layers": rows,
        "best_layer": best,
        "best_auroc": rows[best]["auroc"],
        "selection": "earliest layer within 0.005 of the best grouped 3-fold CV AUROC on the train split",
        "model": handle.model_id,
        "position": str(position),
        "seed": seed,
        "train_rows": len(tr),
        "test_rows": len(te),
        "test_groups": len({labelled.groups[i] for i in te}),
        "dataset": labelled.summary() | {"source": dataset.source, "schema": dataset.schema},
        "activations_cached": acts.from_cache,
        "seconds": timer(),
    })


