"""One steering spec for several vectors at once, in the vocabulary of EasySteer's OpenAI server (issue #48).

    {"vectors": [{"source": "positive sentiment", "scale": 0.3, "layers": [6], "normalize": true,
                  "apply": {"phases": ["prompt", "generation"]}},
                 {"source": "random", "seed": 3, "scale": -0.1, "layers": [9], "normalize": true}]}

Each term names a vector (``source``: a name from the session's list, a share id, ``"random"`` for the seeded random
direction, or, on the command line only, a vector file), its strength (``scale``; aliases ``alpha``, ``coefficient``),
where it acts (``layers``, alias ``layer``; empty or absent: the vector's own), its units (``normalize``: true is
this app's relative α, a multiple of the layer's typical residual norm; false is raw), and when (``apply.phases``:
the prompt's positions, the generated ones, or both).  Terms at one layer add; terms at different layers act at
theirs; each vector acts through its own method's steers (fixed directions, ITI's heads, L2S's per-input vectors).
Beyond EasySteer's words, ``"apply": {"positions": "last"}`` names the hooks' positions directly (the last prompt
token and the generated ones, which phases cannot say), and ``"special_tokens": true`` beside either steers the
positions of special tokens too (BOS, a chat template's turn markers), which are left alone otherwise, as llama.cpp
control vectors and repeng do not.

This module only reads and bounds the spec's shape (the same rules for the page, the CLI, links, saved results and
the API); what a source names and whether a layer exists is the library room's to check against the model.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from . import guards
from .messages import UserError
from .vector import POSITIONS

MAX_TERMS = 8  # like LoRA slots: a bound on what one request can ask the batch to carry
MAX_SOURCE_CHARS = 200
MAX_SPEC_CHARS = 16_384  # eight terms with long names fit many times over
RANDOM_SOURCE = "random"
PHASES = ("prompt", "generation")
# apply.phases -> the hook's positions (steer_ui.model.hooks.Steer)
POSITIONS_OF = {("prompt",): "prompt", ("generation",): "generated", ("generation", "prompt"): "all"}
PHASES_OF = {"prompt": ["prompt"], "generated": ["generation"], "all": ["prompt", "generation"]}
ALIASES = {"alpha": "scale", "coefficient": "scale", "layer": "layers"}
FIELDS = ("source", "scale", "layers", "normalize", "apply", "seed")


@dataclass(frozen=True)
class Term:
    """One vector of a spec: ``layers`` empty means the vector's own; ``positions`` in the hooks' words, None for
    the vector's own (ITI's, say, steers the last prompt position and the generated ones)."""

    source: str
    scale: Any
    layers: tuple = ()
    normalize: Any = True
    positions: str | None = None
    seed: Any = 0
    special_tokens: bool = False
    # the fields the caller wrote (a page's added row without ``normalize`` takes the main row's units)
    given: frozenset = field(default=frozenset(), compare=False, repr=False)

    @property
    def random(self) -> bool:
        return self.source == RANDOM_SOURCE

    def as_dict(self) -> dict:
        out = {"source": self.source, "scale": self.scale, "layers": list(self.layers), "normalize": self.normalize}
        if self.positions is not None:
            out["apply"] = {"phases": PHASES_OF[self.positions]} if self.positions in PHASES_OF else \
                {"positions": self.positions}
        if self.special_tokens:
            out.setdefault("apply", {})["special_tokens"] = True
        if self.random:
            out["seed"] = self.seed
        return out


@dataclass(frozen=True)
class Spec:
    terms: tuple[Term, ...]

    def as_dict(self) -> dict:
        return {"vectors": [t.as_dict() for t in self.terms]}

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), ensure_ascii=False, separators=(",", ":"))


def parse(value: Any, max_terms: int = MAX_TERMS, max_layer_count: int | None = None,
          layers: int | None = None) -> Spec:
    """A spec from JSON text or an already-parsed object, every field checked; a refusal is one line naming the
    term (1-based) and the field.  ``layers``: the model's block count, where the caller knows it: a layer past
    its last is refused naming it.  ``max_layer_count``: how many layers one term may list (default: the model's
    block count where known, else 64)."""
    max_layer_count = max_layer_count or layers or 64
    if isinstance(value, Spec):
        return value
    if isinstance(value, str):
        text = guards.text(value, "steering", MAX_SPEC_CHARS)
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UserError("steering_not_json", position=exc.pos) from None
    if not isinstance(value, dict) or set(value) != {"vectors"} or not isinstance(value["vectors"], list) \
            or not 1 <= len(value["vectors"]) <= max_terms:
        raise UserError("steering_shape", limit=max_terms)
    return Spec(tuple(_term(i + 1, raw, max_layer_count, layers) for i, raw in enumerate(value["vectors"])))


def one(source: str, scale, layer=None, normalize=True, seed=0, positions: str | None = None) -> Spec:
    """Today's one-vector request (a name, an α, a layer) as a spec of one term, its values as given: the library
    room checks them as it checks every term's (α, layer, units and seed of a caller are not trusted here)."""
    return Spec((Term(source=source, scale=scale, layers=() if layer is None else (layer,), normalize=normalize,
                      positions=positions, seed=seed),))


def _layer(value: Any, model_layers: int | None) -> int:
    """One term's layer: a whole number from 0, and within the model where its block count is known (checked first:
    a 31-digit layer sent to /v1 was refused with "at most 9.22337e+18", int64's bound, not the model's)."""
    if model_layers is not None and isinstance(value, (int, float)) and not isinstance(value, bool) \
            and math.isfinite(value) and value > model_layers - 1:
        raise UserError("bad_layer", layer=f"{value:g}" if isinstance(value, float) else str(value)[:40],
                        last=model_layers - 1)
    return int(guards.number(value, "layer", integer=True, low=0))


def _term(n: int, raw: Any, max_layer_count: int, model_layers: int | None) -> Term:
    if not isinstance(raw, dict):
        raise UserError("steering_term_not_object", term=n)
    fields: dict[str, Any] = {}
    for key, item in raw.items():
        name = ALIASES.get(key, key)
        if name not in FIELDS:
            raise UserError("steering_unknown_field", term=n, field=str(key)[:40])
        if name in fields:  # "alpha" and "scale" both given: which one was meant?
            raise UserError("steering_field_twice", term=n, field=name)
        fields[name] = item
    source = fields.get("source")
    if not isinstance(source, str) or not source.strip():
        raise UserError("steering_no_source", term=n)
    source = guards.text(source, "vector", MAX_SOURCE_CHARS).strip()
    if "scale" not in fields:
        raise UserError("steering_no_scale", term=n)
    scale = float(guards.number(fields["scale"], "alpha"))
    layers = fields.get("layers", [])
    if layers is None:
        layers = []
    if isinstance(layers, (int, float)) and not isinstance(layers, bool):
        layers = [layers]
    if not isinstance(layers, list) or len(layers) > max_layer_count:
        raise UserError("steering_bad_layers", term=n, limit=max_layer_count)
    layers = tuple(dict.fromkeys(_layer(x, model_layers) for x in layers))
    normalize = guards.flag(fields.get("normalize", True), "relative")
    positions, special_tokens = None, False  # no "apply": where the vector's own method steers
    if "apply" in fields:
        apply = fields["apply"]
        only_special = isinstance(apply, dict) and set(apply) == {"special_tokens"}
        if isinstance(apply, dict) and "special_tokens" in apply:
            special_tokens = guards.flag(apply["special_tokens"], "special_tokens")
            apply = {k: v for k, v in apply.items() if k != "special_tokens"}
        if only_special:
            pass  # the vector's own positions
        elif isinstance(apply, dict) and set(apply) == {"positions"} and apply["positions"] in POSITIONS:
            positions = apply["positions"]  # this app's own words, for what phases cannot say ("last")
        else:
            phases = apply.get("phases") if isinstance(apply, dict) and set(apply) == {"phases"} else None
            if not isinstance(phases, list) or not phases or any(p not in PHASES for p in phases):
                raise UserError("steering_bad_phases", term=n)
            positions = POSITIONS_OF[tuple(sorted(set(phases)))]
    seed = int(guards.number(fields.get("seed", 0), "seed", integer=True, low=0, high=2 ** 63 - 1))
    return Term(source=source, scale=scale, layers=layers, normalize=normalize, positions=positions, seed=seed,
                special_tokens=bool(special_tokens), given=frozenset(fields))
