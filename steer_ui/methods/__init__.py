"""Steering-vector methods; every one returns the shared :class:`~steer_ui.vector.SteeringVector`.

Entry points used by the CLI, the UI and the benchmark:

* :func:`probe_layers` — per-layer probes with held-out AUROC / accuracy and a
  recommended layer;
* :func:`train` — ``mean-diff``, ``probe``, ``pca``, ``iti`` (this package)
  and, by delegation, ``tsv`` and ``l2s``;
* :func:`train_from_args` — the CLI's ``train`` command.

The pure maths of each method lives in its module (``mean_diff.direction``,
``probe.direction``, ``pca.direction``, ``iti.head_accuracy`` …); the
pipeline here does the data handling shared by all of them (see
:mod:`steer_ui.methods.common` for the conventions).
"""
from __future__ import annotations

import math
import sys
from typing import Any, Callable

import numpy as np
import torch

from ..data import Dataset, DatasetError, split_indices
from ..vector import SteeringVector
from .common import (KL_BOUND, TEST_FRACTION, Timer, check_binary, choose_layer, choose_layer_on_train, layer_scores,
                     make_record, noop, prepare, projection_metrics, residual_alpha_range, sub_progress)

Progress = Callable[[float, str], None]
METHODS = ("mean-diff", "probe", "pca", "iti", "tsv", "l2s")
_ALIASES = {"mean_diff": "mean-diff", "meandiff": "mean-diff", "caa": "mean-diff", "mass-mean": "mean-diff",
            "pca_diff": "pca", "pca-diff": "pca"}


def _clean(obj: Any) -> Any:
    """JSON-safe: NaN/inf -> None, numpy scalars -> Python."""
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, (np.floating, float)):
        return float(obj) if math.isfinite(float(obj)) else None
    if isinstance(obj, np.integer):
        return int(obj)
    return obj


# ------------------------------------------------------------------ probes
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
    progress(1.0, f"best layer {best}")
    return _clean({
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


# ------------------------------------------------------------------ training
def _pair_indices(dataset: Dataset, labelled: Dataset, idx: list[int], seed: int) -> tuple[list[int], list[int], str]:
    """Positive and negative row indices forming pairs among ``idx`` (same group), for PCA."""
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


def _train_residual(handle, dataset: Dataset, method: str, layer: int | None, progress: Progress,
                    hp: dict[str, Any]) -> tuple[SteeringVector, dict]:
    from . import mean_diff, pca, probe

    timer = Timer()
    seed = int(hp.get("seed", 0))
    position = hp.get("position") or "last"
    labelled, acts, tr, te = prepare(handle, dataset, position=position, template=hp.get("template"), seed=seed,
                                     test_fraction=float(hp.get("test_fraction", TEST_FRACTION)),
                                     progress=sub_progress(progress, 0.0, 0.6))
    y = labelled.labels
    check_binary(y[tr], "training split")
    layer_rows: list[dict] | str = "given"
    if layer is None:
        layer, layer_rows = choose_layer_on_train(acts, y, tr, labelled.groups, seed=seed,
                                                  progress=sub_progress(progress, 0.6, 0.8))
    elif not 0 <= int(layer) < acts.num_layers:
        raise DatasetError(f"layer {layer} does not exist: the model has layers 0..{acts.num_layers - 1}")
    layer = int(layer)
    x = acts.layer(layer)
    normalize = bool(hp.get("normalize", False))
    warnings = list(labelled.warnings)
    if method == "mean-diff":
        vec, info = mean_diff.direction(x[tr], y[tr], normalize=normalize)
    elif method == "probe":
        vec, info = probe.direction(x[tr], y[tr], normalize=normalize, C=float(hp.get("C", 1.0)), seed=seed)
    else:
        pos, neg, warn = _pair_indices(dataset, labelled, tr, seed)
        if warn:
            warnings.append(warn)
        vec, info = pca.direction(x[pos], x[neg], normalize=normalize, center=bool(hp.get("center", True)))
    progress(0.85, "measuring the recommended α range")
    metrics = projection_metrics(vec, x, y, tr, te)
    metrics.update(info)
    metrics.update({"train_rows": len(tr), "test_rows": len(te), "norm": float(vec.norm())})
    kl_bound = float(hp.get("kl_bound", KL_BOUND))
    alpha_range, sweep_table = residual_alpha_range(handle, vec, layer, bound=kl_bound)
    hyper = {"position": str(position), "template": hp.get("template"), "seed": seed, "normalize": normalize,
             "test_fraction": float(hp.get("test_fraction", TEST_FRACTION)), "kl_bound": kl_bound,
             "layer_selection": "train-split grouped CV" if layer_rows != "given" else "given"}
    if method == "probe":
        hyper["C"] = float(hp.get("C", 1.0))
    if method == "pca":
        hyper["center"] = bool(hp.get("center", True))
    vector = make_record(handle, method, {layer: vec}, labelled, hyperparameters=hyper, metrics=_clean(metrics),
                         alpha_range=alpha_range)
    vector.dataset_hash = dataset.content_hash
    progress(1.0, f"{method} vector at layer {layer}: test AUROC {metrics['test_auroc']:.3f}")
    report = {"method": method, "layer": layer, "metrics": metrics, "layer_selection": layer_rows,
              "alpha_sweep": sweep_table, "alpha_range": list(alpha_range), "warnings": warnings,
              "dataset": dataset.summary(), "activations_cached": acts.from_cache, "seconds": timer()}
    return vector, _clean(report)


def _train_iti(handle, dataset: Dataset, progress: Progress, hp: dict[str, Any]) -> tuple[SteeringVector, dict]:
    from . import iti
    from .common import alpha_range_from_kl, auroc
    from ..data.activations import head_geometry
    from .common import SWEEP_PROMPTS

    timer = Timer()
    seed = int(hp.get("seed", 0))
    position = hp.get("position") or "last"
    test_fraction = float(hp.get("test_fraction", TEST_FRACTION))
    labelled, acts, tr, te = prepare(handle, dataset, position=position, template=hp.get("template"),
                                     site="heads", seed=seed, test_fraction=test_fraction,
                                     progress=sub_progress(progress, 0.0, 0.5))
    y = labelled.labels
    check_binary(y[tr], "training split")
    num_heads, head_dim = head_geometry(handle)
    heads = acts.heads(num_heads)
    # Validation split inside the train split, by group, for choosing heads.
    train_part = labelled.subset(tr)
    val_fraction = float(hp.get("val_fraction", iti.DEFAULTS["val_fraction"]))
    try:
        fit_local, val_local = split_indices(train_part, test_fraction=val_fraction, seed=seed + 1)
        fit_idx, val_idx = [tr[i] for i in fit_local], [tr[i] for i in val_local]
        if len(np.unique(y[fit_idx])) < 2 or len(np.unique(y[val_idx])) < 2:
            raise DatasetError("single-class validation part")
    except DatasetError:
        fit_idx, val_idx = list(tr), list(tr)
    progress(0.5, f"probing {heads.shape[1] * num_heads} heads")
    accuracy = iti.head_accuracy(heads, y, fit_idx, val_idx, seed=seed)
    k = int(hp.get("top_heads") or iti.DEFAULTS["top_heads"])
    chosen = iti.top_heads(accuracy, k)
    shifts = iti.head_shifts(heads, y, chosen, tr)
    directions = iti.residual_equivalent(handle, chosen, shifts, head_dim)
    scores = iti.score_heads(heads, chosen, shifts).numpy()
    metrics = {"train_auroc": auroc(scores[tr], y[tr]), "test_auroc": auroc(scores[te], y[te]),
               "train_rows": len(tr), "test_rows": len(te), "heads": len(chosen),
               "mean_val_accuracy_chosen": float(np.mean([accuracy[l, h] for l, h in chosen])),
               "best_val_accuracy": float(accuracy.max())}
    hyper = {"position": str(position), "template": hp.get("template"), "seed": seed, "top_heads": len(chosen),
             "num_heads": num_heads, "head_dim": head_dim, "val_fraction": val_fraction,
             "test_fraction": test_fraction, "kl_bound": float(hp.get("kl_bound", KL_BOUND))}
    extras = {iti.HEADS: torch.tensor(chosen, dtype=torch.int64), iti.SHIFTS: shifts,
              iti.ACCURACY: torch.as_tensor(accuracy, dtype=torch.float32)}
    vector = make_record(handle, "iti", directions, labelled, hyperparameters=hyper, metrics=_clean(metrics),
                         alpha_range=None, extras=extras, site="attention_heads")
    vector.dataset_hash = dataset.content_hash
    progress(0.9, "measuring the recommended α range")
    alpha_range, table = alpha_range_from_kl(lambda a: iti.kl_at(handle, vector, SWEEP_PROMPTS, a),
                                             grid=iti.ALPHA_GRID, bound=hyper["kl_bound"])
    vector.alpha_range = alpha_range
    progress(1.0, f"ITI with {len(chosen)} heads: test AUROC {metrics['test_auroc']:.3f}")
    report = {"method": "iti", "layers": vector.layers, "metrics": metrics,
              "heads": [[l, h, float(accuracy[l, h])] for l, h in chosen],
              "heatmap": accuracy.tolist(), "heatmap_axes": {"rows": "layer", "columns": "head",
                                                             "value": "validation accuracy"},
              "alpha_sweep": table, "alpha_range": list(alpha_range), "warnings": list(labelled.warnings),
              "dataset": dataset.summary(), "activations_cached": acts.from_cache, "seconds": timer()}
    return vector, _clean(report)


def train(handle, dataset: Dataset, method: str, layer: int | None = None, progress: Progress | None = None,
          **hyperparameters: Any) -> tuple[SteeringVector, dict]:
    """Train ``method`` on ``dataset`` and return (vector, report).

    Hyperparameters (all optional): ``position`` ("last" | "mean" | token
    index), ``template``, ``seed``, ``test_fraction``, ``kl_bound``;
    ``normalize`` (mean-diff/probe/pca), ``C`` (probe), ``center`` (pca),
    ``top_heads`` and ``val_fraction`` (iti).  ``tsv`` and ``l2s`` are passed
    on to their modules' ``train``.
    """
    method = _ALIASES.get(method, method)
    progress = progress or noop
    if method in ("mean-diff", "probe", "pca"):
        return _train_residual(handle, dataset, method, layer, progress, hyperparameters)
    if method == "iti":
        return _train_iti(handle, dataset, progress, hyperparameters)
    if method == "tsv":
        from . import tsv

        return tsv.train(handle, dataset, layer=layer, progress=progress, **hyperparameters)
    if method == "l2s":
        from . import l2s

        return l2s.train(handle, dataset, layer=layer, progress=progress, **hyperparameters)
    raise DatasetError(f"unknown method '{method}' (choose from {', '.join(METHODS)})")


def _stderr_progress(fraction: float, message: str) -> None:
    print(f"[{fraction:4.0%}] {message}", file=sys.stderr, flush=True)


def train_from_args(handle, dataset: Dataset, args) -> tuple[SteeringVector, dict]:
    """The CLI's ``train``: mean-diff / probe / pca / iti here; tsv and l2s in their own modules."""
    method = _ALIASES.get(args.method, args.method)
    if method == "tsv":
        from . import tsv

        return tsv.train_from_args(handle, dataset, args)
    if method == "l2s":
        from . import l2s

        return l2s.train_from_args(handle, dataset, args)
    hp: dict[str, Any] = {"seed": getattr(args, "seed", 0)}
    if getattr(args, "position", None):
        hp["position"] = args.position
    if method == "iti" and getattr(args, "top_heads", None):
        hp["top_heads"] = args.top_heads
    if method == "iti" and getattr(args, "layer", None) is not None:
        print("note: --layer is ignored by ITI (heads are chosen across all layers)", file=sys.stderr)
        return train(handle, dataset, method, progress=_stderr_progress, **hp)
    return train(handle, dataset, method, layer=getattr(args, "layer", None), progress=_stderr_progress, **hp)


__all__ = ["METHODS", "probe_layers", "train", "train_from_args"]
