"""Turn a stored :class:`SteeringVector` plus user choices (layer, α, units) into hook specs.

Shared by the CLI, the UI and the benchmark, so "α = 0.5 relative at layer 6"
means the same thing everywhere:

* raw units: add ``α · v`` with v as stored;
* relative units: add ``α · n_L · v / ‖v‖`` where ``n_L`` is the mean residual
  norm at the output of block L (``ModelHandle.layer_norms``).  α = 1 is a
  vector as long as a typical residual at that layer.
"""
from __future__ import annotations

import math

import torch

from .model.hooks import Steer, SteeringError
from .vector import SteeringVector


def check_alpha(alpha) -> float:
    try:
        value = float(alpha)
    except (TypeError, ValueError):
        raise SteeringError(f"alpha must be a number, got {alpha!r}") from None
    if not math.isfinite(value):
        raise SteeringError(f"alpha must be a finite number, got {alpha!r}")
    return value


def check_compatible(handle, vector: SteeringVector) -> None:
    if vector.hidden_size != handle.arch.hidden_size:
        raise SteeringError(
            f"vector '{vector.name or vector.method}' is for hidden size {vector.hidden_size} but the loaded model "
            f"({handle.model_id}) has hidden size {handle.arch.hidden_size}"
        )
    for layer in vector.layers:
        if not 0 <= layer < handle.arch.num_layers:
            raise SteeringError(f"vector targets layer {layer} but the model has layers 0..{handle.arch.num_layers - 1}")


def build_steers(handle, vector: SteeringVector, alpha: float, layer: int | None = None, relative: bool = False,
                 positions: str | None = None) -> list[Steer]:
    """Steers for ``vector`` at its own layer(s), or moved to ``layer`` when given (single-layer vectors)."""
    alpha = check_alpha(alpha)
    check_compatible(handle, vector)
    positions = positions or vector.positions
    if vector.input_dependent:
        from .methods import l2s

        return l2s.build_steers(handle, vector, alpha, relative=relative, positions=positions)
    if vector.method == "iti" and "iti.heads" in vector.extras:  # per-head; without extras: residual directions
        from .methods import iti

        return iti.build_steers(handle, vector, alpha, relative=relative, positions=positions)
    if layer is not None and len(vector.layers) > 1 and layer not in vector.layers:
        raise SteeringError(f"this vector has directions for layers {vector.layers}; pick one of them")
    pairs = [(layer, vector.direction(layer if layer in vector.directions else None))] if layer is not None \
        else list(vector.directions.items())
    steers = []
    for target_layer, direction in pairs:
        if not 0 <= target_layer < handle.arch.num_layers:
            raise SteeringError(f"layer {target_layer} does not exist: the model has layers 0..{handle.arch.num_layers - 1}")
        vec = direction
        a = alpha
        if relative:
            norm = float(direction.norm())
            if norm == 0:
                raise SteeringError("the vector is all zeros; relative units are undefined")
            vec = direction / norm
            a = alpha * handle.relative_scale(target_layer)
        steers.append(Steer(layer=target_layer, vector=vec, alpha=a, positions=positions))
    return steers


def raw_alpha(handle, vector: SteeringVector, alpha: float, layer: int, relative: bool) -> float:
    """The raw multiplier of the unit direction that ``alpha`` means (for display)."""
    alpha = check_alpha(alpha)
    if not relative:
        return alpha * float(vector.direction(layer if layer in vector.directions else None).norm())
    return alpha * handle.relative_scale(layer)


def unit(vec: torch.Tensor) -> torch.Tensor:
    return vec / vec.norm().clamp_min(1e-12)
