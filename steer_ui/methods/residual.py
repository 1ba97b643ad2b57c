"""The pipeline shared by the residual-stream methods (mean-diff, probe, PCA).

Activations of every row at every layer (cached), a group split, a layer
chosen on the training split when none is given, a direction fitted on
training rows only, held-out metrics, and the recommended α range from a KL
sweep.  Each method supplies only ``fit`` (its maths) and its settings.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from ..data import Dataset, DatasetError
from ..messages import Said
from ..vector import SteeringVector
from .base import Progress, StaticMethod, setting, settings_dict
from .common import (KL_BOUND, TEST_FRACTION, TRAINING_SPLIT, Timer, check_binary, clean, make_record, prepare,
                     projection_metrics, residual_alpha_range, sub_progress)
from .layers import choose_layer_on_train

MAX_LAYER = 1023  # beyond any model we load; the real bound is checked against the model


@dataclass
class ResidualSettings:
    """Settings every residual-stream method shares."""

    layer: int | None = setting(None, "block whose output is steered; empty: chosen by grouped CV on the "
                                      "training split", minimum=0, maximum=MAX_LAYER)
    position: str = setting("last", "which token's activation stands for a row: the last one or the mean over "
                                    "the completion", choices=("last", "mean"))
    seed: int = setting(0, "seed of the group split (and of anything random)", minimum=0, maximum=2**31 - 1)
    normalize: bool = setting(False, "store a unit vector instead of one as long as the class-mean gap", ui=False)
    test_fraction: float = setting(TEST_FRACTION, "share of groups held out for test metrics", minimum=0.05,
                                   maximum=0.9, ui=False)
    kl_bound: float = setting(KL_BOUND, "mean next-token KL (nats) that bounds the recommended α range",
                              minimum=0.01, maximum=100.0, ui=False)
    template: str | None = setting(None, "row text: a template with {completion} once (and {prompt}); empty: "
                                         "prompt, a space, completion", ui=False, max_length=500)


class ResidualMethod(StaticMethod):
    """Train a fixed direction at one block output; subclasses implement :meth:`fit`."""

    Settings: ClassVar[type] = ResidualSettings

    def fit(self, x: torch.Tensor, y: np.ndarray, train_idx: list[int], dataset: Dataset, labelled: Dataset,
            settings: Any) -> tuple[torch.Tensor, dict, list[str]]:
        """(direction, info for the report, warnings) from the training rows of ``x`` (rows, hidden)."""
        raise NotImplementedError

    def train(self, handle, dataset: Dataset, settings: Any, progress: Progress) -> tuple[SteeringVector, dict]:
        timer = Timer()
        st = settings
        labelled, acts, tr, te = prepare(handle, dataset, position=st.position, template=st.template, seed=st.seed,
                                         test_fraction=st.test_fraction, progress=sub_progress(progress, 0.0, 0.6))
        y = labelled.labels
        check_binary(y[tr], TRAINING_SPLIT)
        layer, layer_rows = st.layer, "given"
        if layer is None:
            layer, layer_rows = choose_layer_on_train(acts, y, tr, labelled.groups, seed=st.seed,
                                                      progress=sub_progress(progress, 0.6, 0.8))
        elif not 0 <= layer < acts.num_layers:
            raise DatasetError.from_key("method_layer_missing", layer=layer, last=acts.num_layers - 1)
        x = acts.layer(layer)
        vec, info, warnings = self.fit(x, y, tr, dataset, labelled, st)
        progress(0.85, Said("progress_alpha_range"))
        metrics = projection_metrics(vec, x, y, tr, te)
        metrics.update(info)
        metrics.update({"train_rows": len(tr), "test_rows": len(te), "norm": float(vec.norm())})
        alpha_range, sweep_table = residual_alpha_range(handle, vec, layer, bound=st.kl_bound)
        hyper = settings_dict(st)
        hyper.pop("layer")
        hyper["layer_selection"] = "train-split grouped CV" if layer_rows != "given" else "given"
        vector = make_record(handle, self.name, {layer: vec}, labelled, hyperparameters=hyper,
                             metrics=clean(metrics), alpha_range=alpha_range)
        vector.dataset_hash = dataset.content_hash
        progress(1.0, Said("progress_residual_trained", method=self.name, layer=layer,
                                auroc=f"{metrics['test_auroc']:.3f}"))
        report = {"method": self.name, "layer": layer, "metrics": metrics, "layer_selection": layer_rows,
                  "alpha_sweep": sweep_table, "alpha_range": list(alpha_range),
                  "warnings": list(labelled.warnings) + warnings, "dataset": dataset.summary(),
                  "activations_cached": acts.from_cache, "seconds": timer()}
        return vector, clean(report)
