"""One truth per view (issue #36): every result panel records the settings it was computed from, and the page
marks it stale the moment the controls no longer have those settings.

A handler that draws a panel group also returns :func:`made_for` for it: an HTML element carrying the inputs it
was called with (``data-key``, JSON), the view whose controls it answers to (``data-view``) and a note, hidden
until the page finds the controls changed.  The page's script (:func:`js_check` per view, run on every change of
one of its controls, and whenever a panel's element is replaced) compares each panel's key with its view's
controls, field by field, and toggles the note.  So a panel either shows numbers for the controls as they are,
or says plainly that it was made for other settings.

Views and their panel groups (the field names are the handlers' argument names):

* Explore: ``bars`` (the next-token bars, the Δlogit chart and the readout, from ``next_token``), ``generations``
  (both generations, the per-token chart and the token table, from ``generate``), ``dose`` (the dose-response
  chart, from ``sweep`` and its α marker).
* Train: ``train`` (status, curves, results table and report: the method, its layer and its settings) and
  ``probe`` (the per-layer probe chart: the position and seed it ran with).
* Detect: ``detect`` (summary, scores, histogram: the vector, the typed answers or the file).
* Many prompts: ``compare`` (summary, both charts, the table: the prompts, the Explore settings it ran with and
  its token count).
"""
from __future__ import annotations

import html
import json
import math
from typing import Any

from . import i18n

STEERING = ("prompt", "vector", "layer", "alpha", "relative", "vector_seed")
SAMPLING = ("greedy", "temperature", "top_k", "top_p", "repetition", "max_tokens", "seed", "delta_limit")
# the vectors added under the main one (ui/extra_terms.py), as one text: last, as the handlers take it, so a panel
# made before a term was added or moved is stale like one made for another α
EXTRA = ("extra",)
PANELS = {
    "bars": STEERING + ("whole_vocabulary",) + EXTRA,
    "generations": STEERING + SAMPLING + EXTRA,
    "dose": STEERING + ("alpha_max", "target", "extended") + EXTRA,
    # Many prompts: its own inputs and the Explore settings it runs with
    "compare": ("prompts", "use_dataset", "vector", "layer", "alpha", "relative", "vector_seed", "alpha_max",
                "max_tokens") + EXTRA,
    "detect": ("vector", "answers", "file"),
    # "train" and "probe": the method, its layer and its own settings, named per method (train_tab names them)
}
# every control of Explore the page reads, in the order its check receives their values (explore_tab wires them so)
CONTROLS = STEERING + ("whole_vocabulary",) + SAMPLING + ("alpha_max", "target", "extended") + EXTRA


def made_for_inputs(lang: str, panel: str, inputs, fields: tuple | None = None) -> str:
    """:func:`made_for` from an event's inputs in their wiring order (which is ``PANELS[panel]``'s)."""
    return made_for(lang, panel, dict(zip(PANELS[panel], inputs)), fields)


# the note's key in i18n per panel: what a person does to bring the panel up to date
NOTES = {"bars": "stale_bars", "generations": "stale_generations", "dose": "stale_dose", "train": "stale_train",
         "probe": "stale_probe", "detect": "stale_detect", "compare": "stale_compare"}
# the view each panel answers to (Explore's are the default)
VIEW_OF = {"train": "train", "probe": "train", "detect": "detect", "compare": "compare"}
# parts of a panel group that sit far from its note, and say so themselves (their element ids): the per-token chart
# is a screen below the generations' note, and a reader scrolled to it saw the old generation's tokens unmarked
ALSO = {"generations": ("per-token-delta",)}


def _plain(value: Any) -> Any:
    """A control's value as JSON both sides read alike: numbers as float, empty as None."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return float(value) if math.isfinite(float(value)) else str(value)
    if isinstance(value, (list, tuple)):  # a table's rows, as the page's script writes them (see js_check)
        return json.dumps([[_cell(c) for c in row] for row in value], separators=(",", ":"), ensure_ascii=False)
    return str(value)


def _cell(value: Any) -> Any:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return None
    return value.item() if hasattr(value, "item") else value


def key_of(panel: str, values: dict, fields: tuple | None = None) -> dict:
    """The key of ``panel`` drawn from ``values`` (the handler's inputs by name); ``fields``: only those (a saved
    result's panels claim the steering settings they were saved with, not the page's sampling controls)."""
    return {name: _plain(values.get(name)) for name in (fields or PANELS[panel])}


class MadeFor(str):
    """The page's element for a panel's key (the HTML itself), carrying the key as data for an API client: an
    API answer holds what the panel was made for, not the page's markup (see :func:`for_caller`)."""

    data: str = ""


def made_for(lang: str, panel: str, values: dict, fields: tuple | None = None) -> MadeFor:
    """The element recording what ``panel`` was just computed from (its stale note in ``lang``).  ``fields``
    defaults to ``PANELS[panel]``; panels outside Explore name theirs (their controls are per method or per
    table)."""
    settings = key_of(panel, values, fields)
    key = html.escape(json.dumps(settings, ensure_ascii=False), quote=True)
    note = html.escape(i18n.message(lang, NOTES[panel]), quote=False)
    view = VIEW_OF.get(panel, "explore")
    also = " ".join(ALSO.get(panel, ()))
    element = MadeFor(f'<div class="made-for" data-panel="{panel}" data-view="{view}" data-key="{key}" '
                      f'data-also="{also}"><span class="stale-note" role="status">⚠ {note}</span></div>')
    element.data = json.dumps({"panel": panel, "made_for": settings}, ensure_ascii=False)
    return element


def for_caller(outputs: Any, page: bool) -> Any:
    """A handler's outputs as its caller reads them: the page gets each panel's element, an API client the
    panel's key as JSON text (``{"panel": ..., "made_for": {...}}``) in its place."""
    if page:
        return outputs
    if isinstance(outputs, MadeFor):
        return outputs.data
    if isinstance(outputs, tuple) and any(isinstance(o, MadeFor) for o in outputs):
        return tuple(o.data if isinstance(o, MadeFor) else o for o in outputs)
    return outputs


# Compares each panel's key with its view's controls (the arguments, in ``names`` order).  Numbers are equal when
# they agree to 1e-9 of their size; empty strings and nulls are one value; a table is its rows as compact JSON and
# a file its name (as the handlers' keys write them).  Each view's controls are kept on window so a panel replaced
# later (a slow response arriving after the controls moved on) is checked again by the observer.
_JS_CHECK = """
(...values) => {
  const view = %(view)s, names = %(names)s;
  const plain = (v) => {
    if (v === undefined || v === null || v === '') return null;
    if (typeof v === 'object' && Array.isArray(v.data)) return JSON.stringify(v.data);
    if (typeof v === 'object' && (v.orig_name || v.path)) return v.orig_name || String(v.path).split('/').pop();
    return v;
  };
  const controls = {};
  names.forEach((n, i) => { controls[n] = plain(values[i]); });
  window.__steerControls = window.__steerControls || {};
  window.__steerControls[view] = Object.assign(window.__steerControls[view] || {}, controls);
  const same = (a, b) => {
    if (a === null || b === null) return a === b;
    if (typeof a === 'number' && typeof b === 'number') {
      return Math.abs(a - b) <= 1e-9 * Math.max(1, Math.abs(a), Math.abs(b));
    }
    return a === b;
  };
  if (!window.__steerCheckStale) {
    window.__steerCheckStale = () => {
      document.querySelectorAll('.made-for[data-key]').forEach((el) => {
        const now = (window.__steerControls || {})[el.dataset.view || 'explore'];
        if (!now) return;
        let key = {};
        try { key = JSON.parse(el.dataset.key); } catch (e) { return; }
        const stale = Object.keys(key).some((k) => (k in now) && !same(key[k], now[k]));
        el.classList.toggle('stale', stale);
        (el.dataset.also || '').split(' ').filter(Boolean).forEach((id) => {
          const part = document.getElementById(id);
          if (!part) return;
          part.classList.toggle('stale-part', stale);
          part.dataset.staleNote = el.querySelector('.stale-note').textContent;
        });
      });
    };
    window.__steerObserver = new MutationObserver(() => window.__steerCheckStale());
    window.__steerObserver.observe(document.body, {childList: true, subtree: true});
  }
  window.__steerCheckStale();
  return values;
}
"""


def js_check(view: str, names) -> str:
    """The page's check for ``view``, receiving its controls' values in ``names`` order."""
    return _JS_CHECK % {"view": json.dumps(view), "names": json.dumps(list(names))}


def watch(view: str, controls: dict) -> None:
    """Wire ``view``'s check to every change of its ``controls`` ({field name: component})."""
    names, components = list(controls), list(controls.values())
    js = js_check(view, names)
    for component in components:
        component.change(None, components, None, js=js, queue=False)


# Enter in the α or layer box commits the value as leaving the box does (gradio releases a slider on blur, not on
# Enter: Enter redrew the bars but left both generations and the dose-response at the old α).  Installed once.
JS_ENTER_COMMITS = """
() => {
  if (!window.__steerEnterCommits) {
    window.__steerEnterCommits = true;
    const SELECTOR = '.steer-alpha input[type=number], #explore-layer input[type=number], '
      + '.explore-term input[type=number], #explore-alpha-max input[type=number]';  // every α (ui/extra_terms.py's
      // rows too), every layer, and the α range (ui/alpha_box.py checks it on leaving)
    document.addEventListener('keydown', (e) => {
      if (e.key === 'Enter' && e.target.matches(SELECTOR)) {
        e.target.blur();
      }
    }, true);
  }
}
"""

# A stale note takes its own line above its panel (issue #52: laid over the panel's top, it hid the first line of
# the readout and the colour key it qualified).  It shows, and takes its line, only when a panel stays stale for
# more than a moment: each slider move is stale for ~50 ms, and until the delay is over the note has no height, so
# dragging α makes neither a flash nor a layout jump.  A part's note starts under the chart's floating label (over
# the note's first words: a browser review of the per-token chart).
CSS = """
.made-for-holder { padding: 0 !important; margin: 0 !important; min-height: 0 !important; border: none !important;
  background: none !important; }
.made-for-holder > div, .made-for-holder .prose { min-height: 0 !important; padding: 0 !important; }
.made-for .stale-note { display: none; }
.made-for.stale .stale-note { display: block; overflow: hidden; padding: 4px 8px; border-radius: 4px;
  font-size: 14px; line-height: 1.4; background: #fff4d6; color: #5c3d00; border: 1px solid #b58900;
  animation: steer-stale-in 0s linear 0.6s both; }
@keyframes steer-stale-in {
  from { visibility: hidden; max-height: 0; padding-top: 0; padding-bottom: 0; border-width: 0; }
  to { visibility: visible; max-height: 8em; } }
.stale-part::before { content: attr(data-stale-note); display: block; padding: 4px 8px; margin-bottom: 4px;
  border-radius: 4px; font-size: 14px; line-height: 1.4; background: #fff4d6; color: #5c3d00;
  border: 1px solid #b58900; animation: steer-stale-in 0s linear 0.6s both; }
.stale-part:has(> label[data-testid="block-label"].float)::before { margin-top: 30px; }
@media (max-width: 760px) { #bars-made-for { order: -3; } }
"""
