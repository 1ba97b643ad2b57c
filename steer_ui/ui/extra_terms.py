"""Explore with several vectors at once (issue #48): rows added under the main vector, each its own vector, layer
and α, all steering together.

gradio makes components when the page is built, so the page has ``EXTRA_ROWS`` hidden rows and "Add a vector"
reveals the next one.  The rows' values travel as one hidden text, ``extra``: the added terms as a steering spec
(:mod:`steer_ui.steering_spec`, EasySteer's words) written by :func:`compose` from the rows, so every handler, the
panels' keys, the link and a saved result take one more value instead of a dozen.  ``extra`` empty is today's one
vector, exactly.  Each row has its own units (relative or raw: the term's ``normalize``) and its own seed for the
random direction, written into ``extra`` with the term; a term written without them (a link or an API call made
before rows had their own) takes the main row's, as it did then.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace

import gradio as gr

from .. import guards, steering_spec
from ..messages import UserError
from ..service import RANDOM
from .common import AlphaSlider, T, picker_choices
from .request_guard import optional_trailing

EXTRA_ROWS = 3  # four vectors on the page; the spec itself allows steering_spec.MAX_TERMS
MAX_EXTRA_CHARS = 4096  # the added terms' text (a link carries it): short names and numbers, many times over
ALPHA_CLASS = "steer-alpha"  # every α slider of the page, main and added: the typed-α guard's selector (alpha_box)


@dataclass
class Rows:
    add: gr.Button
    remove: gr.Button
    count: gr.Number  # how many rows are shown (hidden)
    extra: gr.Textbox  # the added terms as a spec, "" for none (hidden)
    groups: list = field(default_factory=list)
    vectors: list = field(default_factory=list)
    layers: list = field(default_factory=list)
    alphas: list = field(default_factory=list)
    relatives: list = field(default_factory=list)  # each row's units: relative (True) or raw
    seeds: list = field(default_factory=list)  # each row's seed, for the random direction

    @property
    def inputs(self) -> list:
        """compose's inputs: the count, then each row's vector, layer, α, units and seed."""
        out = [self.count]
        for row in zip(self.vectors, self.layers, self.alphas, self.relatives, self.seeds):
            out += list(row)
        return out


def build(layers: int, middle: int) -> Rows:
    """The hidden rows (under the main α slider) and the buttons that show and hide them."""
    groups, vectors, layer_sliders, alphas, relatives, seeds = [], [], [], [], [], []
    for n in range(2, EXTRA_ROWS + 2):
        with gr.Row(visible=False, elem_id=f"explore-term-{n}", elem_classes="explore-term") as group:
            vectors.append(gr.Dropdown(choices=picker_choices([RANDOM]), value=RANDOM, allow_custom_value=True,
                                       label=T("explore.term_vector"), elem_id=f"explore-vector-{n}", min_width=120))
            layer_sliders.append(gr.Slider(0, layers - 1, value=middle, step=1, label=T("explore.layer"),
                                           elem_id=f"explore-layer-{n}", min_width=120))
            alphas.append(AlphaSlider(-1.0, 1.0, value=0.0, step=0.01, label=T("explore.term_alpha"),
                                      elem_id=f"alpha-slider-{n}", elem_classes=ALPHA_CLASS, min_width=160))
            relatives.append(gr.Checkbox(value=True, label=T("explore.term_relative"), elem_id=f"explore-relative-{n}",
                                         min_width=90))
            seeds.append(gr.Number(value=0, precision=0, minimum=0, label=T("explore.term_seed"),
                                   elem_id=f"explore-seed-{n}", min_width=90))
        groups.append(group)
    with gr.Row():
        add = gr.Button(T("explore.add_vector"), size="sm", elem_id="add-vector-btn")
        remove = gr.Button(T("explore.remove_vector"), size="sm", elem_id="remove-vector-btn", visible=False)
    count = gr.Number(value=0, precision=0, visible=False, elem_id="explore-term-count")
    # an API call written before several vectors existed leaves it off: one vector, as then
    extra = optional_trailing(gr.Textbox(value="", visible=False, elem_id="explore-extra-terms"))
    return Rows(add=add, remove=remove, count=count, extra=extra, groups=groups, vectors=vectors,
                layers=layer_sliders, alphas=alphas, relatives=relatives, seeds=seeds)


def shown(count) -> int:
    try:
        value = float(count or 0)
    except (TypeError, ValueError):
        return 0
    return int(max(0, min(EXTRA_ROWS, value))) if math.isfinite(value) else 0


def compose(count, rows: list) -> str:
    """The shown rows as the added terms' spec text ("" for none); ``rows`` is each row's (vector, layer, α,
    relative, seed): its units always written, its seed for the random direction (a row of three values leaves
    both to the main row's, as links made before rows had their own)."""
    terms = []
    for vector, layer, alpha, *own in rows[:shown(count)]:
        random = not vector or vector == RANDOM
        term = {"source": steering_spec.RANDOM_SOURCE if random else str(vector), "scale": float(alpha or 0.0),
                "layers": [int(float(layer or 0))]}
        if own:
            term["normalize"] = own[0] not in (False, 0, "false", "0")
            if random:
                term["seed"] = seed_of(own[1] if len(own) > 1 else 0)
        terms.append(term)
    return json.dumps({"vectors": terms}, ensure_ascii=False, separators=(",", ":")) if terms else ""


def renamed(extra, names: dict) -> str:
    """``extra`` with each term's source renamed by ``names`` (a saved result's vectors as opened here: ``{name
    as saved: name here}``, :func:`opened_names`), a term whose name maps to None left out, and "" when none is
    left; the text as it was when nothing is renamed or it is no spec."""
    if not names or not isinstance(extra, str) or not extra.strip():
        return extra or ""
    try:
        spec = json.loads(extra)
        spec["vectors"] = [{**term, "source": names.get(term["source"], term["source"])} for term in spec["vectors"]
                           if term["source"] not in names or names[term["source"]] is not None]
    except (ValueError, KeyError, TypeError):
        return extra
    if not spec["vectors"]:
        return ""  # every row left out: no added rows (a spec of none is refused wherever one is read)
    return json.dumps(spec, ensure_ascii=False, separators=(",", ":"))


def opened_names(saved: dict, opened: dict) -> dict:
    """For :func:`renamed`: each of a saved result's own added-row vectors (``saved["term_vectors"]``) by its name
    here as ``opened`` gives it, None where it could not be opened here (its row is then left out: by its saved
    name it could be another vector of the viewer's)."""
    return {name: opened.get(name) for name in saved.get("term_vectors") or {}}


def seed_of(value) -> int:
    """A row's seed box as a seed (the spec's checks bound it again); an empty or unreadable box is 0."""
    try:
        number = float(value or 0)
    except (TypeError, ValueError):
        return 0
    return int(number) if math.isfinite(number) and number >= 0 else 0


def added(extra) -> list:
    """The added terms of ``extra`` (any caller's text: bounded and checked as every spec is); [] for none."""
    if extra is None or (isinstance(extra, str) and not extra.strip()):
        return []
    text = guards.text(extra, "steering", MAX_EXTRA_CHARS)
    return list(steering_spec.parse(text, steering_spec.MAX_TERMS - 1).terms)


def own_units(term: steering_spec.Term, relative, seed) -> steering_spec.Term:
    """``term`` with the main row's units and seed where it gave none of its own (a link made before rows had
    their own units)."""
    return replace(term, normalize=term.normalize if "normalize" in term.given else relative,
                   seed=term.seed if "seed" in term.given else seed)


def held(relative, seed, extra) -> steering_spec.Spec | None:
    """The added terms alone, as they steer (the dose-response holds them while it sweeps the main vector); None
    when nothing was added.  Each has its own units and seed (:func:`own_units`)."""
    terms = added(extra)
    return steering_spec.Spec(tuple(own_units(t, relative, seed) for t in terms)) if terms else None


def full_spec(vector, layer, alpha, relative, seed, extra) -> steering_spec.Spec | None:
    """The whole steering, main row first; None when nothing was added (today's one-vector path, unchanged)."""
    others = held(relative, seed, extra)
    if others is None:
        return None
    source = steering_spec.RANDOM_SOURCE if not vector or vector == RANDOM else vector
    return steering_spec.Spec(steering_spec.one(source, alpha, layer, relative, seed).terms + others.terms)


def any_steering(alpha, extra) -> bool:
    """Whether some term pushes at all (α = 0 everywhere is no steering: the bars say so)."""
    try:
        return float(alpha or 0) != 0 or any(float(t.scale) != 0 for t in added(extra))
    except UserError:
        return True


def moved(before: tuple | None, now: tuple) -> int | None:
    """Which term (1-based) differs between two drawings' terms, for the readout; None when none or unknown."""
    if before is None or len(before) != len(now):
        return None
    changed = [i + 1 for i, (a, b) in enumerate(zip(before, now)) if a != b]
    return changed[0] if len(changed) == 1 else None


def terms_of(vector, layer, alpha, extra) -> tuple:
    """Each term's (name, layer, α) as the readout names them."""
    out = [(RANDOM if not vector or vector == RANDOM else str(vector), layer, float(alpha or 0))]
    for t in added(extra):
        out.append((RANDOM if t.random else t.source, t.layers[0] if t.layers else None, float(t.scale)))
    return tuple(out)
