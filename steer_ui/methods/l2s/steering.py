"""How an L2S vector steers: g's input-dependent hook, Mean-S, the P2S oracle, in one α unit.

Raw α = 1 adds the predicted target itself.  Relative α is
``α · n_{L*} / ‖z‖_avg``: g's output is *not* normalised per input (its norm is
part of what it predicts) but divided by one constant, the mean norm of the
training targets, so α = 1 makes the average predicted vector as long as a
typical residual at L* while inputs keep their different lengths.  Mean-S and
P2S use the same factor, so one α means the same thing for all three sources.
"""
from __future__ import annotations

from typing import Callable, Sequence

import pandas as pd
import torch
from torch import nn

from ...messages import Said
from ...model.hooks import Steer, SteeringError
from ...model.units import check_alpha, relative_scale
from ...vector import SteeringVector, VectorError
from .activations import LAYER_WORDS, check_layer, extract, prompt_contexts
from .mlp import SteeringMLP
from .pairs import L2SError, Pair

NAME = "l2s"


def mlp_of(vector: SteeringVector) -> SteeringMLP:
    """The MLP stored in an L2S vector's extras (rebuilt per call: microseconds, and never stale)."""
    if vector.method != NAME:
        raise L2SError.from_key("l2s_not_l2s", name=vector.name or vector.method, method=vector.method)
    net = SteeringMLP.from_tensors(vector.extras, vector.hyperparameters.get("activation", "tanh"))
    if net.sizes[0] != vector.hidden_size or net.sizes[2] != vector.hidden_size:
        raise VectorError.from_key("l2s_mlp_size", inputs=net.sizes[0], outputs=net.sizes[2],
                                   hidden=vector.hidden_size)
    return net


def layers_of(vector: SteeringVector) -> tuple[int, int]:
    """(L*, L′) of an L2S vector."""
    hp = vector.hyperparameters
    layer = int(hp.get("layer", vector.layer))
    return layer, int(hp.get("context_layer", layer))


def unit_scale(handle, vector: SteeringVector, relative: bool) -> float:
    """Raw multiplier per unit of α: 1 in raw units, n_{L*} / mean‖z‖ in relative units."""
    if not relative:
        return 1.0
    norm = float(vector.hyperparameters.get("target_norm_mean") or 0.0)
    if not norm > 0:
        norm = float(mlp_of(vector).target_mean.norm())
    if not norm > 0:
        raise SteeringError.from_key("l2s_no_target_scale")
    return relative_scale(handle, layers_of(vector)[0]) / norm


def check_positions(layer: int, context_layer: int, positions: str, setting: str = "positions",
                    context_setting: str = "context layer") -> None:
    """Prompt positions can be steered only from a context read at or below the steered block; ``setting`` and
    ``context_setting`` name what the caller calls those choices, so the message names what it accepts."""
    if positions in ("all", "prompt") and context_layer > layer:
        if context_setting in LAYER_WORDS:  # a plain word, said in the page's language (a setting's name is as is)
            context_setting = Said(LAYER_WORDS[context_setting])
        raise SteeringError.from_key("l2s_context_after", context_layer=context_layer, layer=layer, setting=setting,
                                     context_setting=context_setting)


def _check_fits(handle, vector: SteeringVector) -> tuple[int, int]:
    """(L*, L′) once both exist in the loaded model and g's width matches it."""
    if vector.hidden_size != handle.arch.hidden_size:
        raise SteeringError.from_key("l2s_hidden_size", name=vector.name or vector.method, size=vector.hidden_size,
                                     model=handle.model_id, hidden=handle.arch.hidden_size)
    layer, context_layer = layers_of(vector)
    return check_layer(handle, layer, "layer"), check_layer(handle, context_layer, "context layer")


def _g(net: SteeringMLP) -> Callable[[torch.Tensor], torch.Tensor]:
    def g(context: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            m = net.to(context.device)
            return m(context.float())
    return g


def _scaled(handle, vector: SteeringVector, alpha: float, relative: bool) -> float:
    return check_alpha(alpha) * unit_scale(handle, vector, relative)


def build_steers(handle, vector: SteeringVector, alpha: float, relative: bool = False,
                 positions: str | None = None) -> list[Steer]:
    """One input-dependent Steer: ``fn=g`` reads the prompt's last token at L′, adds α·g(·) at L*."""
    alpha = check_alpha(alpha)
    net = mlp_of(vector)
    layer, context_layer = _check_fits(handle, vector)
    positions = positions or vector.positions
    check_positions(layer, context_layer, positions)
    return [Steer(layer=layer, fn=_g(net), context_layer=context_layer,
                  alpha=_scaled(handle, vector, alpha, relative), positions=positions)]


def mean_steers(handle, vector: SteeringVector, alpha: float, relative: bool = False,
                positions: str | None = None) -> list[Steer]:
    """Mean-S: the same vector z̄ for every input, in the same units as :func:`build_steers`."""
    layer, _ = layers_of(vector)
    return [Steer(layer=layer, vector=vector.directions[layer], alpha=_scaled(handle, vector, alpha, relative),
                  positions=positions or vector.positions)]


def p2s_vector(handle, vector: SteeringVector, prompt: str, positive: str, negative: str) -> torch.Tensor:
    """The oracle target z_X = h⁺ − h⁻ for one pair, at the vector's layer and target position."""
    layer, context_layer = layers_of(vector)
    position = vector.hyperparameters.get("position", "mean")
    _, z = extract(handle, [Pair(prompt, positive, negative)], layer, context_layer, position)
    return z[0]


def steer_sources(handle, vector: SteeringVector, alpha: float, prompt: str | None = None,
                  positive: str | None = None, negative: str | None = None, relative: bool = False,
                  positions: str | None = None) -> dict[str, list[Steer]]:
    """Steers for each source the UI can compare: ``mean`` (Mean-S), ``l2s`` (g), and ``p2s`` (the oracle, only
    when the pair's ``prompt``, ``positive`` and ``negative`` are given).  Same α units for all."""
    out = {"mean": mean_steers(handle, vector, alpha, relative, positions),
           "l2s": build_steers(handle, vector, alpha, relative, positions)}
    if prompt is not None and positive and negative:
        layer, _ = layers_of(vector)
        z = p2s_vector(handle, vector, prompt, positive, negative)
        out["p2s"] = [Steer(layer=layer, vector=z, alpha=_scaled(handle, vector, alpha, relative),
                            positions=positions or vector.positions)]
    return out


def predict(handle, vector: SteeringVector, prompts: Sequence[str]) -> torch.Tensor:
    """g(h_{X,L′}) for each prompt: (n, D), raw units (α = 1)."""
    _, context_layer = layers_of(vector)
    with torch.no_grad():
        return mlp_of(vector)(prompt_contexts(handle, list(prompts), context_layer))


def describe(handle, vector: SteeringVector, prompts: Sequence[str]) -> pd.DataFrame:
    """Per prompt: the predicted vector's norm, its norm relative to Mean-S, and its cosine to Mean-S —
    how input-dependent the steering really is."""
    pred = predict(handle, vector, prompts)
    layer, _ = layers_of(vector)
    mean = vector.directions[layer]
    return pd.DataFrame({
        "prompt": list(prompts),
        "predicted_norm": pred.norm(dim=-1).tolist(),
        "norm_over_mean": (pred.norm(dim=-1) / mean.norm().clamp_min(1e-12)).tolist(),
        "cosine_to_mean": nn.functional.cosine_similarity(pred, mean.unsqueeze(0), dim=-1).tolist(),
    })
