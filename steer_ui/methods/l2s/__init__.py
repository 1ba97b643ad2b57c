"""L2S, Learning to Steer: input-dependent steering vectors (Parekh et al., NeurIPS 2025).

A mean steering vector pushes every input the same way.  L2S instead
*predicts* a vector for each input from the input itself:

* **P2S target** (prompt-to-steer, the oracle).  For a contrastive pair
  ``(prompt X, positive, negative)`` the target at layer L* is
  ``z_X = h⁺ − h⁻``, the difference of the residual stream at the output of
  block L* for ``X + positive`` and ``X + negative``, read as the mean over
  the completion tokens (``position="mean"``, for short completions whose
  every token carries the answer) or at the last one (``position="last"``,
  for long completions whose meaning settles at their end).
* **Context** ``h_{X,L′}``: the residual at block L′ of the last prompt token,
  the one the model's first answer token is predicted from.
* **g**, a two-layer MLP ``Linear(D→H) → tanh → Linear(H→D)``, maps the
  context to the target, fitted to ``z − z̄`` so an untrained g *is* Mean-S.
* **Mean-S**: ``z̄``, the mean training target, stored as the vector's
  ``directions[L*]`` so exports to tools that know nothing of L2S carry it.

At inference g runs once per prompt, through the core input-dependent hook
(``Steer(fn=g, context_layer=L′)``), and ``α · g(h_{X,L′})`` is added at L*,
by default at *all* positions (the first answer token is predicted at the last
prompt position).  Steering prompt positions needs L′ <= L*; with
``positions="generated"`` any L′ works.

One job per module: :mod:`.pairs` (the input), :mod:`.activations` (targets
and contexts), :mod:`.mlp` (g and its fit), :mod:`.steering` (hooks and α
units), :mod:`.evaluation` (margins and the held-out table),
:mod:`.settings` and :mod:`.training`.

Storage (native safetensors): ``extras`` hold ``l2s.encoder.weight``,
``l2s.encoder.bias``, ``l2s.decoder.weight``, ``l2s.decoder.bias``,
``l2s.input_mean``, ``l2s.input_scale``, ``l2s.target_mean``,
``l2s.target_scale``; ``hyperparameters`` hold the sizes, activation, L*, L′,
the target position and the training settings.
"""
from __future__ import annotations

from ...model.hooks import SteeringError
from ...vector import SteeringVector
from ..base import Progress
from .activations import TARGET_POSITIONS, extract, prompt_contexts
from .evaluation import SOURCES, calibrate, compare_heldout, recommendation, steering_effect, table_rows
from .mlp import ACTIVATIONS, DECODER_INITS, FitReport, SteeringMLP, default_hidden, fit_mlp
from .pairs import L2SError, Pair, as_pairs, join_text
from .settings import L2SSettings
from .steering import (NAME, build_steers, describe, layers_of, mean_steers, mlp_of, p2s_vector, predict,
                       steer_sources, unit_scale)
from .training import default_layer, train


class L2SMethod:
    """The registry's L2S: vectors that are a function of the prompt (``steering = "input"``)."""

    name = NAME
    label = "L2S (input-dependent)"
    Settings = L2SSettings
    steering = "input"

    def train(self, handle, dataset, settings: L2SSettings, progress: Progress) -> tuple[SteeringVector, dict]:
        return train(handle, dataset, settings, progress)

    def steers(self, handle, vector: SteeringVector, alpha: float, *, layer: int | None = None,
               relative: bool = False, positions: str | None = None) -> list:
        # g was fitted to targets at L*; it predicts nothing meaningful for another block.
        steered, _ = layers_of(vector)
        if layer is not None and int(layer) != steered:
            raise SteeringError.from_key("l2s_layer_only", layer=steered)
        return build_steers(handle, vector, alpha, relative=relative, positions=positions)


METHOD = L2SMethod()

__all__ = ["ACTIVATIONS", "DECODER_INITS", "FitReport", "L2SError", "L2SMethod", "L2SSettings", "METHOD", "Pair", "SOURCES",
           "SteeringMLP", "TARGET_POSITIONS", "as_pairs", "build_steers", "calibrate", "compare_heldout", "default_hidden",
           "default_layer", "describe", "extract", "fit_mlp", "join_text", "layers_of", "mean_steers", "mlp_of",
           "p2s_vector", "predict", "prompt_contexts", "recommendation", "steer_sources", "steering_effect", "table_rows",
           "train", "unit_scale"]
