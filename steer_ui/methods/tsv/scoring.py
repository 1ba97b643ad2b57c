"""Detection with a trained TSV: check the vector, then p(truthful) per (prompt, answer) and the AUROC.

A vector may come from a file anyone made, so everything it carries that
scoring uses (prototypes, κ, the template) is checked before the model runs.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F

from ...model.capture import forward, left_pad
from ...model.hooks import StepState, steering
from ...messages import said_of
from ...vector import SteeringVector, refused
from ..base import static_steers
from ..common import auroc, clean
from .data import PROMPT_TEMPLATE, TSVError, format_text, has_labels, rows_of, template_pieces, unlabelled_rows
from .maths import class_probs

MAX_KAPPA = 1000.0  # the settings' bound: softmax(κ·cos) saturates long before
# the detector's strength over the saved (steering) direction: 1 / the calibrated steering scale (training's
# calibration stops at 1e-6)
MAX_DETECTOR_ALPHA = 1e6


def check_vector(handle, vector: SteeringVector) -> None:
    """Refuse, in one line, a vector that is not a usable TSV for ``handle``'s model; runs nothing."""
    if vector.method != "tsv" or "prototypes" not in vector.extras:
        raise refused("tsv_not_tsv", name=vector.name or vector.method, method=vector.method,
                      extras=sorted(vector.extras))
    if len(vector.layers) != 1:
        raise refused("tsv_one_layer", layers=vector.layers)
    hidden = handle.arch.hidden_size
    if vector.hidden_size != hidden:
        raise refused("tsv_hidden_size", name=vector.name or vector.method, size=vector.hidden_size,
                      model=handle.model_id, hidden=hidden)
    protos = vector.extras["prototypes"]
    if not isinstance(protos, torch.Tensor) or tuple(protos.shape) != (2, hidden):
        shape = tuple(protos.shape) if isinstance(protos, torch.Tensor) else type(protos).__name__
        raise refused("tsv_prototypes_shape", shape=shape, hidden=hidden)
    if not torch.isfinite(protos).all():
        raise refused("tsv_prototypes_not_finite")
    if not torch.isfinite(vector.direction(vector.layer)).all():
        raise refused("tsv_direction_not_finite")
    detector_alpha = vector.hyperparameters.get("detector_alpha", 1.0)
    if isinstance(detector_alpha, bool) or not isinstance(detector_alpha, (int, float)) \
            or not math.isfinite(detector_alpha) or not 1.0 <= detector_alpha <= MAX_DETECTOR_ALPHA:
        raise refused("tsv_detector_alpha", limit=f"{MAX_DETECTOR_ALPHA:g}", value=repr(str(detector_alpha)[:40]))
    kappa = vector.hyperparameters.get("kappa", 10.0)
    if isinstance(kappa, bool) or not isinstance(kappa, (int, float)) or not math.isfinite(kappa) \
            or not 0 < kappa <= MAX_KAPPA:
        raise refused("tsv_kappa", limit=f"{MAX_KAPPA:g}", value=repr(str(kappa)[:40]))
    try:
        template_pieces(vector.hyperparameters.get("template", PROMPT_TEMPLATE))
    except TSVError as exc:
        raise refused("tsv_stored_template", detail=said_of(exc)) from None


def score(handle, vector: SteeringVector, pairs: Sequence[tuple[str, str]], batch_size: int = 16) -> list[float]:
    """p(truthful) for each (prompt, answer) under the trained vector and prototypes (prompt may be '')."""
    check_vector(handle, vector)
    # The stored direction is the steering vector s·λ·v; the detector reads λ·v, the training strength, at every
    # position: raw α = detector_alpha = 1 / s (1 for vectors trained before the two strengths).
    hp = vector.hyperparameters
    steers = static_steers(handle, vector, float(hp.get("detector_alpha", 1.0)), positions="all")
    template = hp.get("template", PROMPT_TEMPLATE)
    kappa = float(hp.get("kappa", 10.0))
    texts = []
    for n, pair in enumerate(pairs):
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            head = len(f"pair {n}: expected (prompt, answer), got ")  # the English line stays at most 200 characters
            raise TSVError.from_key("tsv_pair_shape", n=n, pair=repr(pair)[:max(200 - head, 0)])
        if not str(pair[1]).strip():
            raise TSVError.from_key("tsv_pair_empty", n=n)
        texts.append(format_text(pair[0], pair[1], template))
    if not texts:
        return []
    # The hooked model, not the training cache: detection works from a saved file alone, and the unit
    # tests check that both paths give the same scores.
    tok = handle.tokenizer
    token_rows = [tok(t).input_ids for t in texts]
    if any(len(r) == 0 for r in token_rows):
        raise TSVError.from_key("tsv_no_tokens")
    prototypes = vector.extras["prototypes"]
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    scores = [0.0] * len(texts)
    for start in range(0, len(order), batch_size):
        index = order[start:start + batch_size]
        ids, mask, positions = left_pad([token_rows[i] for i in index], tok.pad_token_id or 0)
        with torch.inference_mode(), steering(handle, steers, StepState(prompt_len=None)):
            out = forward(handle, ids, mask, positions)
        reps = F.normalize(out.last_hidden_state[:, -1, :].float(), dim=-1).cpu()
        p = class_probs(reps, prototypes, kappa)
        for row, i in enumerate(index):
            scores[i] = float(p[row, 1])
    return scores


def detect(handle, vector: SteeringVector, dataset) -> dict:
    """Score every (prompt, answer) of ``dataset``; AUROC when it has both labels (None otherwise)."""
    check_vector(handle, vector)
    labelled = has_labels(dataset)
    if labelled:
        rows = rows_of(dataset)
        labels = rows.label.tolist()
    else:
        rows = unlabelled_rows(dataset)
        labels = [None] * len(rows)
    scores = score(handle, vector, list(zip(rows.prompt, rows.completion)))
    return {"auroc": clean(auroc(scores, labels)) if labelled else None,
            "scores": [{"prompt": p, "answer": a, "score": s, "label": lab}
                       for p, a, s, lab in zip(rows.prompt, rows.completion, scores, labels)],
            "rows": len(scores)}
