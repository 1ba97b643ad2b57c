"""Train L2S on contrastive pairs: split by group, extract targets, fit g, score on the held-out groups."""
from __future__ import annotations

from typing import Any

import torch

from ...data import group_split
from ...messages import Said
from ...model.units import to_relative
from ...vector import SteeringVector, dataset_hash
from ..base import Progress, noop, parse_settings, settings_dict
from .activations import check_layer, extract
from .evaluation import calibrate, compare_heldout, cosines, recommendation, table_rows
from .mlp import default_hidden, fit_mlp
from .pairs import L2SError, as_pairs
from .settings import L2SSettings
from .steering import NAME, check_positions

# Settings recorded in the vector's hyperparameters (the rest are described by the vector itself or the report).
_RECORDED = ("seed", "epochs", "patience", "lr", "weight_decay", "batch_size", "cos_weight", "decoder_init",
             "test_fraction", "val_fraction", "norm_budget", "calibration_steps", "residual_steps")


def default_layer(num_layers: int) -> int:
    """L* default: a third of the depth (block 6 of Gemma 3 270M's 18, chosen on the validation split of the
    capitals pairs: see docs/l2s.md)."""
    return max(0, min(num_layers - 1, int(round((num_layers - 1) / 3))))


def train(handle, dataset, settings: L2SSettings | None = None, progress: Progress | None = None,
          **values: Any) -> tuple[SteeringVector, dict]:
    """Train L2S on contrastive pairs; returns (vector, report).

    ``settings`` is an :class:`L2SSettings`; from Python, keyword ``values``
    (``layer=6, epochs=50``) may be given instead.  Either way they pass the
    same validation as the CLI's and the API's.  Groups are split three ways, seeded:
    ``test_fraction`` held out (only scored), then ``val_fraction`` of the rest
    for early stopping and α calibration, the rest for fitting.  ``layer`` (L*)
    defaults to a third of the depth, ``context_layer`` (L′) to L*.

    The report carries the per-epoch losses (``loss_curve``), the α calibration
    on the validation split (``calibration``), the held-out behaviour of no
    steering, Mean-S, L2S and P2S at the same norm budget (``margin_gain``,
    ``positive_rate``, ``table``), and ``recommendation``: a plain sentence
    saying whether L2S beat mean steering here, for the UI to show.
    """
    if settings is not None and values:
        raise TypeError("give either an L2SSettings or keyword settings, not both")
    # An instance built in Python is checked against the same bounds as one parsed from a request.
    st = parse_settings(L2SSettings, values if settings is None else settings_dict(settings))
    progress = progress or noop
    n_layers, D = handle.arch.num_layers, handle.arch.hidden_size
    layer = check_layer(handle, default_layer(n_layers) if st.layer is None else st.layer, "layer")
    context_layer = check_layer(handle, layer if st.context_layer is None else st.context_layer, "context layer")
    check_positions(layer, context_layer, st.steer_positions, setting="steer_positions",
                    context_setting="context_layer")
    hidden = default_hidden(D) if st.hidden is None else int(st.hidden)

    pairs = as_pairs(dataset)
    groups = [p.group for p in pairs]
    if len(set(groups)) < 3:
        raise L2SError.from_key("l2s_groups", count=len(set(groups)))
    fit_idx, test_idx = group_split(groups, None, st.test_fraction, st.seed)
    sub, val_sub = group_split([groups[i] for i in fit_idx], None, st.val_fraction, st.seed + 1)
    train_idx, val_idx = [fit_idx[j] for j in sub], [fit_idx[j] for j in val_sub]

    progress(0.0, Said("progress_l2s_activations", n=len(pairs), context_layer=context_layer, layer=layer))
    contexts, targets = extract(handle, pairs, layer, context_layer, st.position, st.extract_batch,
                                progress=lambda f, m: progress(0.3 * f, m))
    net, fit = fit_mlp(contexts, targets, train_idx, val_idx, hidden, st.activation, epochs=st.epochs,
                       patience=st.patience, lr=st.lr, weight_decay=st.weight_decay, batch_size=st.batch_size,
                       cos_weight=st.cos_weight, seed=st.seed, decoder_init=st.decoder_init,
                       progress=lambda f, m: progress(0.3 + 0.2 * f, m))
    mean_s = targets[train_idx].mean(0)
    target_norm_mean = float(targets[train_idx].norm(dim=-1).mean())
    frame_hash = getattr(dataset, "content_hash", None)
    if frame_hash is None:
        frame_hash = dataset_hash([[p.prompt, p.positive, p.negative, p.group] for p in pairs])
    recorded = settings_dict(st)
    vector = SteeringVector(
        directions={layer: mean_s},
        hidden_size=D,
        method=NAME,
        model_id=handle.model_id,
        model_type=handle.model_type,
        positions=st.steer_positions,
        name=f"l2s L{layer}<-L{context_layer}",
        hyperparameters={
            "layer": layer, "context_layer": context_layer, "position": st.position, "hidden": hidden,
            "layer_sizes": net.sizes, "activation": st.activation, "target_norm_mean": target_norm_mean,
            "mean_s_norm": float(mean_s.norm()),
            **{k: recorded[k] for k in _RECORDED},
            "split_counts": {"train": len(train_idx), "validation": len(val_idx), "test": len(test_idx)},
        },
        dataset_hash=frame_hash,
        extras=net.state_tensors(),
    )
    # The slider's range (relative units): up to raw α = 2, i.e. twice the average target, where the true shift
    # itself already overshoots on the capitals pairs.  The α to use is the calibrated one (report, below).
    reach = to_relative(handle, 2.0 * target_norm_mean, layer)
    vector.alpha_range = (-reach, reach)

    limit = st.eval_limit
    val_pairs, test_pairs = [pairs[i] for i in val_idx], [pairs[i] for i in test_idx]
    n_val = min(len(val_idx), limit or len(val_idx))
    progress(0.5, Said("progress_l2s_calibrating", n=n_val))
    calibration = calibrate(handle, vector, val_pairs, contexts[val_idx], st.norm_budget, st.calibration_steps,
                            limit=limit, progress=lambda f, m: progress(0.5 + 0.25 * f, m),
                            residual_steps=st.residual_steps)
    # The kept weight of g's input-dependent part lives in the MLP itself (its output scale), so every consumer
    # of the vector (hooks, export, predict, held-out scoring below) steers with the calibrated g.
    weight = calibration["residual_weight"]
    with torch.no_grad():
        net.target_scale.mul_(weight)
    vector.extras.update(net.state_tensors())
    vector.hyperparameters["residual_weight"] = weight
    vector.hyperparameters["calibrated_raw_alpha"] = calibration["alphas"]
    progress(0.75, Said("progress_l2s_scoring", n=min(len(test_idx), limit or len(test_idx))))
    held = compare_heldout(handle, vector, test_pairs, alphas=calibration["alphas"],
                           contexts=contexts[test_idx], targets=targets[test_idx], limit=limit,
                           progress=lambda f, m: progress(0.75 + 0.25 * f, m))
    beats, advice = recommendation(held, st.norm_budget)
    with torch.no_grad():
        val_pred = net(contexts[val_idx])
    val_cos = float(cosines(val_pred, targets[val_idx]).mean())
    val_mean_cos = float(cosines(mean_s.unsqueeze(0).expand(len(val_idx), -1), targets[val_idx]).mean())
    summary = {k: held[k] for k in ("l2s_cosine", "mean_cosine", "l2s_mse", "mean_mse", "margin_gain",
                                    "positive_rate", "alpha", "steered_norm", "n", "n_steered")}
    vector.metrics = {"heldout": summary, "validation": {"l2s_cosine": val_cos, "mean_cosine": val_mean_cos},
                      "best_epoch": fit.best_epoch, "l2s_beats_mean": beats}
    report = {
        "layer": layer, "context_layer": context_layer, "position": st.position, "hidden": hidden,
        "splits": {"train": len(train_idx), "validation": len(val_idx), "test": len(test_idx),
                   "test_groups": sorted({groups[i] for i in test_idx})},
        "fit": fit.as_dict(),
        "loss_curve": loss_curve(fit),
        "norm_budget": st.norm_budget,
        "calibration": calibration["table"],
        "validation": {"l2s_cosine": val_cos, "mean_cosine": val_mean_cos},
        **{k: v for k, v in held.items() if k not in ("per_input", "per_pair_effect")},
        "table": table_rows(held),
        "per_input": held["per_input"].to_dict("records"),
        "l2s_beats_mean": beats,
        "recommendation": advice,
    }
    progress(1.0, Said("progress_l2s_trained", l2s=f"{held['margin_gain']['l2s']:+.3f}",
                       mean=f"{held['margin_gain']['mean']:+.3f}"))
    return vector, report


def loss_curve(fit) -> list[dict]:
    """Per-epoch train and validation loss as records (epoch 0: the starting point, Mean-S, validation only),
    with the rounding of ``fit.as_dict()``."""
    losses = fit.as_dict()
    train_loss, val_loss = losses["train_loss"], losses["val_loss"]
    rows = [{"epoch": 0, "train_loss": None, "validation_loss": val_loss[0]}] if val_loss else []
    rows += [{"epoch": e, "train_loss": t, "validation_loss": v}
             for e, (t, v) in enumerate(zip(train_loss, val_loss[1:]), start=1)]
    return rows
