"""Inference-time intervention (ITI; Li et al., 2023) on attention heads.

Site: the input of each block's attention output projection (``o_proj``), the
per-head attention outputs concatenated, ``heads · head_dim`` wide.

Training, on the labelled view of the dataset, train split only:

1. one logistic probe per head (standardised, L2) on a fit part of the train
   split, scored by accuracy on a validation part (split by group too); the
   (layer × head) accuracy table is the heat map in the report;
2. the top-K heads by validation accuracy;
3. for each such head, the mass-mean direction θ̂ = unit(mean⁺ − mean⁻) over
   the train rows and σ, the standard deviation of the train activations
   projected on θ̂.  The stored per-head shift is ``σ · θ̂``.

Applying it: ``α · σ · θ̂`` is added to that head's slice of the o_proj input
(at the chosen positions), for every selected head at once, with one α.

Storage: ``extras["iti.heads"]`` (K, 2) [layer, head], ``extras["iti.shifts"]``
(K, head_dim) the σ·θ̂ per head, ``extras["iti.accuracy"]`` (layers, heads).

Residual-stream equivalent (``directions``), for tools that only know block
outputs (every export format but native, which keeps the per-head data and
steers exactly).  ``W_O · shift_L`` is exactly what the intervention adds to
the attention output, but a vector added at the *block output* is something
else: the block's MLP sees the ITI shift and not the exported one, and Gemma
2/3 normalise the attention output (``post_attention_layernorm``) before the
residual add, so a large shift *replaces* part of the attention output rather
than adding to it, by an amount that differs per token.  No fixed vector can
reproduce that, so :func:`block_output_equivalent` stores the measured
average: the change of block L's output per unit α when only layer L's heads
are shifted, at the vector's largest recommended α, over neutral prompts (the
first token, an outlier in norm, left out).  :func:`export_error` then measures
what is left on other prompts (the next-token log-probabilities' change,
exported vs per-head, all positions steered), and the vector carries it in
``hyperparameters["residual_export"]`` (so in every format's metadata) and in
the note the CLI and the Export tab print (:func:`export_note`).

Units: α multiplies the σ-scaled shifts, so it counts standard deviations of
each head's activation along its direction (the paper's α; on Gemma 3 270M
with 16 heads, α ≈ 10 moves the next-token distribution by about 1 nat of KL).
That is already a relative unit, so ``relative=True`` and raw mean the same
for ITI; its recommended range is measured on :data:`ALPHA_GRID`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from ..data import Dataset, DatasetError, split_indices
from ..messages import Said
from ..model.capture import head_geometry, out_projection_weight
from ..model.hooks import HeadSteer, SteeringError, StepState
from ..model.units import NEUTRAL_PROMPTS
from ..vector import SteeringVector
from .base import Progress, setting, settings_dict, static_steers
from .common import (KL_BOUND, SWEEP_PROMPTS, TEST_FRACTION, TRAINING_SPLIT, Timer, alpha_range_from_kl, auroc,
                     check_binary, clean, fit_probe, make_record, one_blas_thread, prepare, sub_progress)

ALPHA_GRID = (0.5, 1.0, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0)  # σ units
# The residual-stream export is fitted on these and its error measured on SWEEP_PROMPTS (disjoint).
EXPORT_CALIBRATION_PROMPTS = NEUTRAL_PROMPTS[2:]
HEADS, SHIFTS, ACCURACY = "iti.heads", "iti.shifts", "iti.accuracy"


# ------------------------------------------------------------------ training maths
def head_accuracy(heads: torch.Tensor, y: np.ndarray, fit_idx: Sequence[int], val_idx: Sequence[int],
                  seed: int = 0, progress: Progress | None = None) -> np.ndarray:
    """(layers, heads) validation accuracy of one probe per head.  ``heads``: (rows, layers, heads, head_dim)."""
    _rows, layers, n_heads, _d = heads.shape
    fit, val = np.asarray(fit_idx), np.asarray(val_idx)
    acc = np.zeros((layers, n_heads))
    with one_blas_thread():
        for layer in range(layers):
            if progress is not None:  # also how a job's cancel and time limit reach this loop
                progress(layer / layers, Said("progress_probing_heads_of_layer", layer=layer))
            for h in range(n_heads):
                x = heads[:, layer, h, :].numpy().astype(np.float64)
                model = fit_probe(x[fit], y[fit], seed=seed)
                acc[layer, h] = float(model.score(x[val], y[val]))
    return acc


def top_heads(accuracy: np.ndarray, k: int) -> list[tuple[int, int]]:
    """The k best (layer, head) pairs; ties go to the earlier layer, then the lower head."""
    layers, n_heads = accuracy.shape
    order = sorted(((-accuracy[l, h], l, h) for l in range(layers) for h in range(n_heads)))
    return [(l, h) for _a, l, h in order[:max(1, min(k, layers * n_heads))]]


def head_shifts(heads: torch.Tensor, y: np.ndarray, chosen: Sequence[tuple[int, int]],
                train_idx: Sequence[int]) -> torch.Tensor:
    """(K, head_dim) σ·θ̂ for each chosen head, from the train rows."""
    tr = torch.as_tensor(np.asarray(train_idx))
    yt = torch.as_tensor(np.asarray(y))[tr]
    out = []
    for layer, h in chosen:
        x = heads[tr, layer, h, :].double()
        theta = x[yt == 1].mean(0) - x[yt == 0].mean(0)
        unit = theta / theta.norm().clamp_min(1e-12)
        sigma = float((x @ unit).std())
        out.append((unit * sigma).float())
    return torch.stack(out)


def output_projection_shift(handle, chosen: Sequence[tuple[int, int]], shifts: torch.Tensor,
                            head_dim: int) -> dict[int, torch.Tensor]:
    """{layer: W_O · (per-head shifts in their slices)}: exactly what the shift adds to the attention output."""
    by_layer = layer_shifts(chosen, shifts, head_dim, head_geometry(handle)[0])
    return {layer: out_projection_weight(handle, layer) @ vec for layer, vec in by_layer.items()}


def _encode(handle, prompt: str) -> torch.Tensor:
    from ..model.generation import encode_prompt

    return encode_prompt(handle, prompt).to(handle.input_device)


def block_output_equivalent(handle, chosen: Sequence[tuple[int, int]], shifts: torch.Tensor, head_dim: int,
                            alpha: float, prompts: Sequence[str] = EXPORT_CALIBRATION_PROMPTS
                            ) -> dict[int, torch.Tensor]:
    """{layer: mean over tokens of (block L output with layer L's heads shifted by α − without) / α}.

    Only layer L's heads are shifted, so block L's input is the same in both passes and the difference is block
    L's own response to the shift (through its output projection, post-attention norm and MLP).  α is the
    strength the export should be faithful at (the secant, not the tangent: Gemma's norms saturate)."""
    from ..model.capture import recording
    from ..model.hooks import steering

    alpha = float(alpha) or 1.0
    by_layer = layer_shifts(chosen, shifts, head_dim, head_geometry(handle)[0])
    out: dict[int, torch.Tensor] = {}
    for layer, shift in by_layer.items():
        rows = []
        steer = HeadSteer({layer: shift}, torch.tensor([0.0, alpha]), "all")
        for prompt in prompts:
            ids = _encode(handle, prompt).expand(2, -1)
            with torch.inference_mode(), recording(handle, [layer]) as store, \
                    steering(handle, [steer], StepState(prompt_len=None)):
                handle.model.base_model(input_ids=ids, use_cache=False)
            h = store[layer].float().cpu()
            rows.append((h[1, 1:] - h[0, 1:]) / alpha)
        out[layer] = torch.cat(rows).mean(0)
    return out


def _next_token_logp(handle, prompt: str, steers: list) -> torch.Tensor:
    from ..model.hooks import steering

    ids = _encode(handle, prompt)
    with torch.inference_mode(), steering(handle, steers, StepState(prompt_len=ids.shape[1])):
        out = handle.model.base_model(input_ids=ids, use_cache=False)
        logits = handle.arch.logits(out.last_hidden_state[:, -1, :]).float()
    return logits[0].log_softmax(-1).cpu()


def export_error(handle, vector, alpha: float, directions: dict[int, torch.Tensor] | None = None,
                 prompts: Sequence[str] = SWEEP_PROMPTS) -> dict[str, float]:
    """How far the residual-stream ``directions`` (default: the vector's) are from the per-head intervention.

    On each prompt, at ``alpha``, all positions steered: the change of the next-token log-probabilities under
    the per-head intervention (Δ_head) and under the directions added at the block outputs (Δ_residual).
    Returns the mean ``relative_error`` ‖Δ_residual − Δ_head‖ / ‖Δ_head‖ and the mean KL(head-steered ‖
    residual-steered) in nats."""
    from ..model.hooks import Steer

    directions = vector.directions if directions is None else directions
    head = build_steers(handle, vector, alpha, positions="all")
    residual = [Steer(layer=l, vector=d, alpha=float(alpha), positions="all") for l, d in directions.items()]
    errors, kls = [], []
    for prompt in prompts:
        base = _next_token_logp(handle, prompt, [])
        by_head, by_residual = _next_token_logp(handle, prompt, head), _next_token_logp(handle, prompt, residual)
        want = by_head - base
        errors.append(float((by_residual - by_head).norm() / want.norm().clamp_min(1e-12)))
        kls.append(float((by_head.exp() * (by_head - by_residual)).sum()))
    return {"relative_error": float(np.mean(errors)), "kl": float(np.mean(kls))}


def export_note(vector) -> str | None:
    """The sentence the CLI and the Export tab show when an ITI vector leaves as residual-stream directions."""
    info = vector.hyperparameters.get("residual_export")
    if vector.method != "iti" or not isinstance(info, dict):
        return None
    try:
        err, kl, alpha = float(info["relative_error"]), float(info["kl"]), float(info["alpha"])
    except (KeyError, TypeError, ValueError):
        return None
    # by key, so the Export tab says it in the visitor's language (its str() is the English the CLI prints)
    return Said("export_note_iti", error=f"{100 * err:.0f}", kl=f"{kl:.3g}", alpha=f"{alpha:g}")


def layer_shifts(chosen: Sequence[tuple[int, int]], shifts: torch.Tensor, head_dim: int,
                 num_heads: int) -> dict[int, torch.Tensor]:
    """{layer: (heads · head_dim) vector with each chosen head's shift in its slice, zeros elsewhere}."""
    out: dict[int, torch.Tensor] = {}
    for (layer, h), shift in zip(chosen, shifts):
        vec = out.setdefault(int(layer), torch.zeros(num_heads * head_dim))
        vec[h * head_dim:(h + 1) * head_dim] += shift.float()
    return out


def score_heads(heads: torch.Tensor, chosen: Sequence[tuple[int, int]], shifts: torch.Tensor) -> torch.Tensor:
    """Per-row truthfulness score: Σ over chosen heads of the projection on σθ̂ / σ² (= θ̂·x / σ)."""
    total = torch.zeros(heads.shape[0], dtype=torch.float64)
    for (layer, h), shift in zip(chosen, shifts):
        s2 = max(float(shift.double().pow(2).sum()), 1e-24)
        total += heads[:, layer, h, :].double() @ shift.double() / s2
    return total


# ------------------------------------------------------------------ intervention
def shifts_of(vector) -> tuple[list[tuple[int, int]], torch.Tensor, int]:
    """(chosen heads, (K, head_dim) shifts, num_heads) stored in an ITI vector."""
    if HEADS not in vector.extras or SHIFTS not in vector.extras:
        raise SteeringError.from_key("iti_no_head_data")
    heads = [(int(l), int(h)) for l, h in vector.extras[HEADS].tolist()]
    shifts = vector.extras[SHIFTS].float()
    num_heads = int(vector.hyperparameters.get("num_heads", 0))
    if not num_heads:
        raise SteeringError.from_key("iti_no_num_heads")
    return heads, shifts, num_heads


def check_vector(handle, vector) -> None:
    """Refuse, at import, per-head data that does not fit the loaded model (one-line :class:`SteeringError`).

    A vector without per-head data passes: it steers through its residual-stream directions.
    """
    if HEADS not in vector.extras and SHIFTS not in vector.extras:
        return
    if HEADS not in vector.extras or SHIFTS not in vector.extras:
        raise SteeringError.from_key("iti_one_of_two", heads=HEADS, shifts=SHIFTS)
    heads, shifts = vector.extras[HEADS], vector.extras[SHIFTS]
    layers = handle.arch.num_layers
    model_heads, head_dim = head_geometry(handle)
    num_heads = vector.hyperparameters.get("num_heads")
    if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads != model_heads:
        raise SteeringError.from_key("iti_num_heads", value=str(num_heads)[:20], heads=model_heads)
    if heads.dtype.is_floating_point or heads.dtype == torch.bool or heads.ndim != 2 or heads.shape[1] != 2:
        raise SteeringError.from_key("iti_heads_shape", tensor=HEADS, dtype=str(heads.dtype), shape=tuple(heads.shape))
    k = heads.shape[0]
    if not 1 <= k <= layers * model_heads:
        raise SteeringError.from_key("iti_heads_count", tensor=HEADS, count=k, heads=layers * model_heads)
    bad_layer = ((heads[:, 0] < 0) | (heads[:, 0] >= layers)).nonzero()
    if len(bad_layer):
        raise SteeringError.from_key("iti_heads_layer", tensor=HEADS, layer=int(heads[bad_layer[0, 0], 0]),
                                     last=layers - 1)
    bad_head = ((heads[:, 1] < 0) | (heads[:, 1] >= model_heads)).nonzero()
    if len(bad_head):
        raise SteeringError.from_key("iti_heads_head", tensor=HEADS, head=int(heads[bad_head[0, 0], 1]),
                                     last=model_heads - 1)
    if not shifts.dtype.is_floating_point or tuple(shifts.shape) != (k, head_dim):
        raise SteeringError.from_key("iti_shifts_shape", tensor=SHIFTS, k=k, size=head_dim, dtype=str(shifts.dtype),
                                     shape=tuple(shifts.shape))
    if not torch.isfinite(shifts).all():
        raise SteeringError.from_key("iti_shifts_not_finite", tensor=SHIFTS)


def build_steers(handle, vector, alpha: float, relative: bool = False, positions: str | None = None) -> list:
    """One :class:`HeadSteer` applying ``vector``'s heads with ``alpha`` in σ units (``relative`` changes nothing)."""
    heads, shifts, num_heads = shifts_of(vector)
    model_heads, head_dim = head_geometry(handle)
    if model_heads != num_heads or shifts.shape[1] != head_dim:
        raise SteeringError.from_key("iti_geometry", heads=num_heads, size=shifts.shape[1], model_heads=model_heads,
                                     model_size=head_dim)
    return [HeadSteer(layer_shifts(heads, shifts, head_dim, num_heads), float(alpha), positions or vector.positions)]


def kl_at(handle, vector, prompts: Sequence[str], alphas: Sequence[float]) -> np.ndarray:
    """Mean next-token KL to the unsteered distribution for each α, one batched forward per prompt."""
    from ..model.generation import encode_prompt
    from ..model.hooks import steering

    base = build_steers(handle, vector, 1.0)[0]
    total = np.zeros(len(alphas))
    row_alpha = torch.tensor([0.0] + [float(a) * float(base.scalar_alpha) for a in alphas])
    for p in prompts:
        ids = encode_prompt(handle, p).to(handle.input_device).expand(len(row_alpha), -1)
        with torch.inference_mode(), steering(handle, [base.with_alpha(row_alpha)], StepState(prompt_len=None)):
            out = handle.model.base_model(input_ids=ids, use_cache=False)
            logits = handle.arch.logits(out.last_hidden_state[:, -1, :]).float()
        logp = logits.log_softmax(-1)
        kl = (logp[0].exp() * (logp[0] - logp[1:])).sum(-1)
        total += kl.cpu().numpy()
    return total / len(prompts)


@dataclass
class ITISettings:
    position: str = setting("last", "which token's head activations stand for a row", choices=("last", "mean"))
    seed: int = setting(0, "seed of the group splits", minimum=0, maximum=2**31 - 1)
    top_heads: int = setting(16, "how many heads (by validation accuracy) to steer", minimum=1, maximum=4096)
    val_fraction: float = setting(0.25, "share of training groups used to rank the heads", minimum=0.05,
                                  maximum=0.9, ui=False)
    test_fraction: float = setting(TEST_FRACTION, "share of groups held out for test metrics", minimum=0.05,
                                   maximum=0.9, ui=False)
    kl_bound: float = setting(KL_BOUND, "mean next-token KL (nats) that bounds the recommended α range",
                              minimum=0.01, maximum=100.0, ui=False)
    template: str | None = setting(None, "row text template with {completion} once (and {prompt})", ui=False,
                                   max_length=500)
    steer_positions: str = setting("last", "where the heads are steered: the last prompt token and every generated "
                                           "one (honest_llama's choice), or all positions",
                                   choices=("last", "all"))


class ITI:
    """Per-head steering; heads are chosen across all layers, so there is no layer setting."""

    name = "iti"
    label = "ITI (attention heads)"
    Settings = ITISettings
    steering = "heads"

    def train(self, handle, dataset: Dataset, settings: Any, progress: Progress) -> tuple[SteeringVector, dict]:
        timer = Timer()
        st = settings
        seed, position, test_fraction = st.seed, st.position, st.test_fraction
        labelled, acts, tr, te = prepare(handle, dataset, position=position, template=st.template,
                                         site="heads", seed=seed, test_fraction=test_fraction,
                                         progress=sub_progress(progress, 0.0, 0.5))
        y = labelled.labels
        check_binary(y[tr], TRAINING_SPLIT)
        num_heads, head_dim = head_geometry(handle)
        heads = acts.heads(num_heads)
        # Validation split inside the train split, by group, for choosing heads.
        train_part = labelled.subset(tr)
        val_fraction = st.val_fraction
        try:
            fit_local, val_local = split_indices(train_part, test_fraction=val_fraction, seed=seed + 1)
            fit_idx, val_idx = [tr[i] for i in fit_local], [tr[i] for i in val_local]
            if len(np.unique(y[fit_idx])) < 2 or len(np.unique(y[val_idx])) < 2:
                raise DatasetError("single-class validation part")
        except DatasetError:
            fit_idx, val_idx = list(tr), list(tr)
        progress(0.5, Said("progress_probing_heads", n=heads.shape[1] * num_heads))
        accuracy = head_accuracy(heads, y, fit_idx, val_idx, seed=seed, progress=sub_progress(progress, 0.5, 0.85))
        k = st.top_heads
        chosen = top_heads(accuracy, k)
        shifts = head_shifts(heads, y, chosen, tr)
        directions = output_projection_shift(handle, chosen, shifts, head_dim)  # replaced below, once α is known
        scores = score_heads(heads, chosen, shifts).numpy()
        metrics = {"train_auroc": auroc(scores[tr], y[tr]), "test_auroc": auroc(scores[te], y[te]),
                   "train_rows": len(tr), "test_rows": len(te), "heads": len(chosen),
                   "mean_val_accuracy_chosen": float(np.mean([accuracy[l, h] for l, h in chosen])),
                   "best_val_accuracy": float(accuracy.max())}
        hyper = {**settings_dict(st), "top_heads": len(chosen), "num_heads": num_heads, "head_dim": head_dim}
        extras = {HEADS: torch.tensor(chosen, dtype=torch.int64), SHIFTS: shifts,
                  ACCURACY: torch.as_tensor(accuracy, dtype=torch.float32)}
        vector = make_record(handle, "iti", directions, labelled, hyperparameters=hyper, metrics=clean(metrics),
                             alpha_range=None, extras=extras, site="attention_heads")
        vector.positions = st.steer_positions
        vector.dataset_hash = dataset.content_hash
        progress(0.9, Said("progress_alpha_range"))
        alpha_range, table = alpha_range_from_kl(lambda a: kl_at(handle, vector, SWEEP_PROMPTS, a),
                                                 grid=ALPHA_GRID, bound=hyper["kl_bound"])
        vector.alpha_range = alpha_range
        progress(0.95, Said("progress_iti_export"))
        export_alpha = float(alpha_range[1])
        vector.directions = block_output_equivalent(handle, chosen, shifts, head_dim, export_alpha)
        export = {"alpha": export_alpha, **export_error(handle, vector, export_alpha), "approximate": True,
                  "positions": "all", "how": "mean change of each block's output per unit α (secant at α)"}
        naive = export_error(handle, vector, export_alpha, directions=directions)
        export["output_projection_relative_error"] = naive["relative_error"]
        vector.hyperparameters["residual_export"] = export
        progress(1.0, Said("progress_iti_trained", heads=len(chosen), auroc=f"{metrics['test_auroc']:.3f}"))
        report = {"method": "iti", "layers": vector.layers, "metrics": metrics,
                  "heads": [[l, h, float(accuracy[l, h])] for l, h in chosen],
                  "heatmap": accuracy.tolist(), "heatmap_axes": {"rows": "layer", "columns": "head",
                                                                 "value": "validation accuracy"},
                  "alpha_sweep": table, "alpha_range": list(alpha_range), "residual_export": export,
                  "warnings": list(labelled.warnings) + [export_note(vector)],
                  "dataset": dataset.summary(), "activations_cached": acts.from_cache, "seconds": timer()}
        return vector, clean(report)

    def steers(self, handle, vector, alpha: float, *, layer: int | None = None, relative: bool = False,
               positions: str | None = None) -> list:
        if HEADS not in vector.extras:  # e.g. imported from a residual-only format: its directions still steer
            return static_steers(handle, vector, alpha, layer=layer, relative=relative, positions=positions)
        return build_steers(handle, vector, alpha, relative=relative, positions=positions)

    def check(self, handle, vector) -> None:
        """Called by formats.read_vector on import: the per-head data must fit the loaded model."""
        check_vector(handle, vector)

    def export_note(self, vector) -> str | None:
        """Called by formats.export_notes for every format but native: how approximate the directions are."""
        return export_note(vector)


METHOD = ITI()
