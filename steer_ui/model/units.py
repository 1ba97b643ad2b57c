"""α units in one place: raw ↔ relative, and the residual norms that define "relative".

* raw units: add ``α · v`` with v as stored (what repeng, steering-vectors and
  llama.cpp's ``--control-vector-scaled`` multiply by);
* relative units: add ``α · n_L · v / ‖v‖``, where ``n_L`` is the mean residual
  norm at the output of block L over neutral prompts (first token excluded).
  α = 1 is a push as long as a typical residual at that layer, so one α means
  the same strength at every layer (Gemma 3 270M's norms grow ~1000× with depth).
"""
from __future__ import annotations

import hashlib
import json
import math
from typing import Sequence

import torch

from ..numbers import NumberError, parse_number
from ..paths import cache_root
from .capture import capture
from .generation import encode_prompt
from .identity import model_fingerprint

NEUTRAL_PROMPTS = (
    "The weather today is mild, with a light breeze from the west.",
    "She opened the book and began to read the first chapter aloud.",
    "Water boils at one hundred degrees Celsius at sea level.",
    "The train to the city leaves every hour from platform two.",
    "He wrote a short letter to his friend about the summer holidays.",
    "Many people enjoy walking in the park on Sunday mornings.",
)


class AlphaError(ValueError):
    """An α (or a vector to scale by it) that cannot be used."""


def check_alpha(alpha) -> float:
    """α as a finite float, or a one-line error naming what was given."""
    try:
        return float(parse_number(alpha, "alpha"))
    except NumberError as exc:
        raise AlphaError(str(exc)) from None


SLIDER_STEPS = 100  # the α slider: about this many steps on each side of α = 0


def alpha_grid(top: float) -> tuple[float, float]:
    """(end, step) of the α slider spanning about ±``top``: the step is 1, 2 or 5 × 10^k and the end a whole number
    of steps, so the slider's positions (Chromium steps in decimal from its minimum) are exact short decimals
    and its centre is exactly 0; the end is at least ``top`` (with −top + 100·top/100 it was ±1e-16, and α showed as
    0.0749279999999999).  Here rather than in the UI so that the default view's α can sit on the same grid."""
    top = abs(float(top)) if math.isfinite(float(top)) and float(top) != 0 else 1.0
    raw = top / SLIDER_STEPS
    power = 10.0 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw * 0.999)
    step = float(f"{step:.3g}")
    end = float(f"{max(1, math.ceil(top / step - 1e-9)) * step:.12g}")
    return end, step


def on_alpha_grid(alpha: float, top: float) -> float:
    """``alpha`` at the nearest position of the slider that the page draws for a range of ±``top`` (the page draws
    it for the box's value, the end of :func:`alpha_grid`), within that range: an α off the grid showed in the box
    as a value the slider could not take (0.1405 beside steps of 0.005, issue #52)."""
    end, _ = alpha_grid(top)
    _, step = alpha_grid(end)
    return float(f"{max(-end, min(end, round(float(alpha) / step) * step)):.12g}")


def relative_scale(handle, layer: int) -> float:
    """n_L: the mean residual norm at the output of block ``layer`` (relative α = 1 means this long)."""
    return float(handle.layer_norms()[layer])


def to_raw_alpha(handle, alpha: float, layer: int, relative: bool) -> float:
    """The multiplier of a *unit* direction that ``alpha`` means (relative), or ``alpha`` itself (raw)."""
    alpha = check_alpha(alpha)
    return alpha * relative_scale(handle, layer) if relative else alpha


def scaled_direction(handle, direction: torch.Tensor, alpha: float, layer: int,
                     relative: bool) -> tuple[torch.Tensor, float]:
    """(vector, multiplier) such that ``multiplier · vector`` is what ``alpha`` adds at ``layer``.

    Raw: the direction as stored and α.  Relative: the unit direction and α · n_L.
    """
    alpha = check_alpha(alpha)
    if not relative:
        return direction, alpha
    norm = float(direction.double().norm())  # in float64: a float32 norm of large entries overflows to inf
    if norm == 0:
        raise AlphaError("the vector is all zeros; relative units are undefined")
    return (direction.double() / norm).to(direction.dtype), alpha * relative_scale(handle, layer)


def to_relative(handle, raw_norm: float, layer: int) -> float:
    """How long a push of L2 norm ``raw_norm`` is in relative units at ``layer``."""
    return float(raw_norm) / max(relative_scale(handle, layer), 1e-12)


def measure_layer_norms(handle, prompts: Sequence[str] = NEUTRAL_PROMPTS) -> list[float]:
    """Mean L2 norm of the residual stream at each block output over neutral prompts.

    The first position (BOS, often an outlier with a huge norm) is excluded.
    Cached on disk per model (real models only), keyed by the model's
    fingerprint, since every relative α reads it.
    """
    n_layers = handle.arch.num_layers
    key = None
    if not handle.model_id.startswith(("tiny:", "in-memory")):
        digest = hashlib.sha256(f"{model_fingerprint(handle)}|{n_layers}|{handle.dtype}".encode()).hexdigest()[:16]
        key = cache_root() / "norms" / f"{digest}.json"
        if key.is_file():
            try:
                norms = json.loads(key.read_text())["norms"]
                if len(norms) == n_layers:
                    return [float(n) for n in norms]
            except (ValueError, KeyError, TypeError):
                pass
    sums = [0.0] * n_layers
    count = 0
    with handle.lock, torch.inference_mode():
        for p in prompts:
            ids = encode_prompt(handle, p)
            outputs = capture(handle, ids, range(n_layers))
            for i in range(n_layers):
                sums[i] += float(outputs[i][0, 1:].float().norm(dim=-1).sum())
            count += ids.shape[1] - 1
    norms = [s / max(count, 1) for s in sums]
    if key is not None:
        key.parent.mkdir(parents=True, exist_ok=True)
        tmp = key.with_suffix(".tmp")
        tmp.write_text(json.dumps({"model_id": handle.model_id, "norms": norms}))
        tmp.replace(key)
    return norms
