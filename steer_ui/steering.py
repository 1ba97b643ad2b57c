"""Turn a stored :class:`SteeringVector` plus user choices (layer, α, units) into hook specs.

Shared by the service, the CLI and the benchmark, so "α = 0.5 relative at
layer 6" means the same thing everywhere.  α units live in
:mod:`steer_ui.model.units`; how a vector acts (fixed directions, per input,
per head) is its method's ``steers`` (:mod:`steer_ui.methods.base`).
"""
from __future__ import annotations

from .messages import english
from .methods.base import build_steers as _method_steers, method_of
from .model.hooks import Steer, SteeringError
from .model.units import check_alpha
from .vector import SteeringVector


def _refused(key: str, **params) -> SteeringError:
    return SteeringError(english(key, **params), key, **params)


def check_compatible(handle, vector: SteeringVector) -> None:
    if vector.hidden_size != handle.arch.hidden_size:
        raise _refused("steering_hidden_size", label=vector.name or vector.method, size=vector.hidden_size,
                       model=handle.model_id, model_size=handle.arch.hidden_size)
    for layer in vector.layers:
        if not 0 <= layer < handle.arch.num_layers:
            raise _refused("steering_layer_out_of_range", layer=layer, last=handle.arch.num_layers - 1)


def steering_kind(vector: SteeringVector) -> str:
    """``static`` (fixed directions), ``input`` (per prompt, e.g. L2S) or ``heads`` (per attention head, ITI)."""
    method = method_of(vector)
    return method.steering if method is not None else "static"


def build_steers(handle, vector: SteeringVector, alpha: float, layer: int | None = None, relative: bool = False,
                 positions: str | None = None, special_tokens: bool = False) -> list[Steer]:
    """Steers for ``vector`` at its own layer(s), or moved to ``layer`` when given (single-layer vectors).

    ``special_tokens``: steer positions holding special tokens too (BOS, turn markers), as llama.cpp control
    vectors, repeng and steering-vectors do; by default they are left alone (:mod:`steer_ui.model.hooks`)."""
    alpha = check_alpha(alpha)
    check_compatible(handle, vector)
    steers = _method_steers(handle, vector, alpha, layer=layer, relative=relative, positions=positions)
    for s in steers:  # every method's steers carry the flag (Steer, HeadSteer)
        s.special_tokens = bool(special_tokens)
    return steers
