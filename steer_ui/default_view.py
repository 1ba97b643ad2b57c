"""The view a fresh page opens on: a named vector trained from bundled data, at a layer and α that change the
text visibly while it stays fluent, and a slider whose range is calibrated on the measured dose-response.

At the first start on a model (seconds on the embedded Gemma 3 270M; cached with the model's other caches):

1. a mean-difference vector is trained on ``assets/datasets/sentiment_pairs.csv`` (40 positive/negative
   continuations of the same prompts) at a few candidate blocks around the first half of the depth;
2. for each block, one batched sweep measures the next-token KL(unsteered ‖ steered) over α (relative units) on
   a few prompts; the slider's default maximum is the α where the mean KL reaches :data:`KL_AT_MAX` nats;
3. at a few fractions of that maximum, greedy continuations of :data:`PROMPT` are scored for fluency: the mean
   log-probability of the steered text under the *unsteered* model (a drop of more than
   :data:`FLUENCY_DROP` nats per token from the unsteered text's own counts as broken, and so does a text that
   loops: fewer distinct tokens than :data:`MIN_DISTINCT` of the unsteered text's share);
4. the block and α with the largest KL among fluent, visibly different continuations win.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from .messages import Said
from .model.units import on_alpha_grid
from .paths import cache_root
from .plots import READABLE_KL
from .steerability import distinct_share, mean_logprob
from .vector import SteeringVector

DATA = Path(__file__).resolve().parents[1] / "assets" / "datasets" / "sentiment_pairs.csv"
NAME = "positive sentiment (default)"
PROMPT = "My favourite thing about the weekend is"
CALIBRATION_PROMPTS = (PROMPT, "The weather today is", "When I opened the letter, I")
KL_AT_MAX = READABLE_KL  # nats: strong but, on the models we tried, still readable
FLUENCY_DROP = 1.5  # nats per token below the unsteered text's mean log-probability
# Repetition is predictable, so a looping text scores as fluent: it must also keep this share of distinct tokens
# (relative to the unsteered text's own share).
MIN_DISTINCT = 0.75
DEPTHS = (0.25, 0.35, 0.45)  # candidate blocks, as fractions of the depth
FRACTIONS = (0.3, 0.45, 0.6)  # of the calibrated maximum, for the default α
GRID = tuple(float(a) for a in np.geomspace(0.01, 4.0, 25))  # relative α for the KL sweep
TOKENS = 16
VERSION = 1
Progress = Callable[[float, str], None]


@dataclass
class DefaultView:
    layer: int
    alpha: float  # relative units
    alpha_max: float  # relative units: where the mean KL reaches KL_AT_MAX
    prompt: str = PROMPT
    name: str = NAME
    calibration: list[dict] = field(default_factory=list)

    def __post_init__(self):
        # α on the slider's step grid for ±alpha_max (a cached view too), so the α box and the slider agree (#52)
        self.alpha = on_alpha_grid(self.alpha, self.alpha_max)


def alpha_at_kl(alphas: Sequence[float], kl: Sequence[float], target: float) -> float:
    """The smallest α (log-interpolated on the grid) where the KL curve first reaches ``target``."""
    for i, (a, k) in enumerate(zip(alphas, kl)):
        if k >= target:
            if i == 0:
                return float(a)
            a0, k0 = alphas[i - 1], kl[i - 1]
            t = (target - k0) / max(k - k0, 1e-12)
            return float(math.exp(math.log(a0) + t * (math.log(a) - math.log(a0))))
    return float(alphas[-1])


def fluency(handle, prompt: str, text: str) -> float:
    """Mean log-probability per token of ``text`` after ``prompt`` under the unsteered model; a text of nothing
    but whitespace counts as broken (−inf)."""
    if not text.strip():
        return float("-inf")
    return mean_logprob(handle, prompt, text)


def calibrate(handle, progress: Progress | None = None) -> tuple[DefaultView, SteeringVector]:
    """Train the default vector at candidate blocks and pick the block and α (see the module docstring)."""
    from .data import load_dataset
    from .methods import train
    from .model.analysis import mean_kl_curve
    from .model.generation import Sampling, side_by_side
    from .steering import build_steers

    progress = progress or (lambda _f, _m: None)
    dataset = load_dataset(DATA)
    n = handle.arch.num_layers
    layers = sorted({min(n - 1, max(0, int(round(d * n)))) for d in DEPTHS})
    rows, best = [], None
    for i, layer in enumerate(layers):
        progress(i / len(layers), Said("progress_default_calibrating", block=layer))
        vector, _report = train(handle, dataset, "mean-diff", layer=layer)
        kl = mean_kl_curve(handle, vector.direction(), layer, GRID, CALIBRATION_PROMPTS)
        alpha_max = alpha_at_kl(GRID, kl, KL_AT_MAX)
        for fraction in FRACTIONS:
            alpha = alpha_max * fraction
            steers = build_steers(handle, vector, alpha, relative=True)
            result = side_by_side(handle, PROMPT, steers, Sampling(max_new_tokens=TOKENS))
            base, steered = result.unsteered.text, result.steered.text
            drop = fluency(handle, PROMPT, base) - fluency(handle, PROMPT, steered)
            varied = (distinct_share([t.token for t in result.steered.tokens]) or 0.0) / max(
                distinct_share([t.token for t in result.unsteered.tokens]) or 0.0, 1e-9)
            kl_here = float(np.interp(math.log(alpha), np.log(GRID), kl))
            fluent = steered != base and drop <= FLUENCY_DROP and varied >= MIN_DISTINCT
            row = {"layer": layer, "alpha": alpha, "alpha_max": alpha_max, "kl": kl_here, "fluency_drop": drop,
                   "distinct_ratio": varied, "fluent": fluent, "steered": steered, "unsteered": base}
            rows.append(row)
            if fluent and (best is None or kl_here > best[0]["kl"]):
                best = (row, vector)
    if best is None:  # nothing fluent and different: the gentlest setting of the middle block still shows a change
        row = min((r for r in rows if r["layer"] == layers[len(layers) // 2]), key=lambda r: r["alpha"])
        best = (row, train(handle, dataset, "mean-diff", layer=row["layer"])[0])
    row, vector = best
    view = DefaultView(layer=row["layer"], alpha=round(row["alpha"], 4), alpha_max=round(row["alpha_max"], 4),
                       calibration=rows)
    vector.name = NAME
    vector.alpha_range = (-view.alpha_max, view.alpha_max)
    progress(1.0, Said("progress_default_ready", block=view.layer, alpha=f"{view.alpha:g}",
                       alpha_max=f"{view.alpha_max:g}"))
    return view, vector


def _cache_path(handle) -> Path:
    from .model.identity import model_fingerprint

    key = hashlib.sha256(f"{VERSION}|{model_fingerprint(handle)}|{hashlib.sha256(DATA.read_bytes()).hexdigest()}"
                         .encode()).hexdigest()[:24]
    return cache_root() / "default_view" / key


def load_or_calibrate(handle, progress: Progress | None = None) -> tuple[DefaultView, SteeringVector]:
    """The cached default view of this model, or a fresh calibration saved for the next start."""
    folder = _cache_path(handle)
    try:
        view = DefaultView(**json.loads((folder / "view.json").read_text()))
        return view, SteeringVector.load(folder / "vector.safetensors")
    except (OSError, ValueError, TypeError):
        pass
    view, vector = calibrate(handle, progress)
    tmp = folder.with_name(folder.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    vector.save(tmp / "vector.safetensors")
    (tmp / "view.json").write_text(json.dumps(asdict(view)))
    if not folder.exists():
        tmp.rename(folder)
    return view, vector
