"""One truth per view (issue #36): every Explore panel records the settings it was computed from, and the page
marks it stale the moment the controls no longer have those settings.

A handler that draws a panel group also returns :func:`made_for` for it: an HTML element carrying the inputs it
was called with (``data-key``, JSON) and a note, hidden until the page finds the controls changed.  The page's
script (:data:`JS_CHECK`, run on every change of a control, and whenever a panel's element is replaced) compares
each panel's key with the controls' values, field by field, and toggles the note.  So a panel either shows
numbers for the controls as they are, or says plainly that it was made for other settings.

Panel groups and the controls that make them (the names are the handlers' argument names):

* ``bars``: the next-token bars, the Δlogit chart and the readout (``next_token``).
* ``generations``: both generations, the per-token chart and the token table (``generate``).
* ``dose``: the dose-response chart (``sweep`` and its α marker).
"""
from __future__ import annotations

import html
import json
import math
from typing import Any

from . import i18n

STEERING = ("prompt", "vector", "layer", "alpha", "relative", "vector_seed")
SAMPLING = ("greedy", "temperature", "top_k", "top_p", "repetition", "max_tokens", "seed", "delta_limit")
PANELS = {
    "bars": STEERING + ("whole_vocabulary",),
    "generations": STEERING + SAMPLING,
    "dose": STEERING + ("alpha_max", "target", "extended"),
}
# every control the page reads, in the order JS_CHECK receives their values (explore_tab wires them so)
CONTROLS = STEERING + ("whole_vocabulary",) + SAMPLING + ("alpha_max", "target", "extended")
def made_for_inputs(lang: str, panel: str, inputs, fields: tuple | None = None) -> str:
    """:func:`made_for` from an event's inputs in their wiring order (which is ``PANELS[panel]``'s)."""
    return made_for(lang, panel, dict(zip(PANELS[panel], inputs)), fields)


# the note's key in i18n per panel: what a person does to bring the panel up to date
NOTES = {"bars": "stale_bars", "generations": "stale_generations", "dose": "stale_dose"}


def _plain(value: Any) -> Any:
    """A control's value as JSON both sides read alike: numbers as float, empty as None."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return float(value) if math.isfinite(float(value)) else str(value)
    return str(value)


def key_of(panel: str, values: dict, fields: tuple | None = None) -> dict:
    """The key of ``panel`` drawn from ``values`` (the handler's inputs by name); ``fields``: only those (a saved
    result's panels claim the steering settings they were saved with, not the page's sampling controls)."""
    return {name: _plain(values.get(name)) for name in (fields or PANELS[panel])}


def made_for(lang: str, panel: str, values: dict, fields: tuple | None = None) -> str:
    """The element recording what ``panel`` was just computed from (its stale note in ``lang``)."""
    key = html.escape(json.dumps(key_of(panel, values, fields), ensure_ascii=False), quote=True)
    note = html.escape(i18n.message(lang, NOTES[panel]), quote=False)
    return (f'<div class="made-for" data-panel="{panel}" data-key="{key}">'
            f'<span class="stale-note" role="status">⚠ {note}</span></div>')


# Compares each panel's key with the controls' values (the arguments, in CONTROLS order).  Numbers are equal when
# they agree to 1e-9 of their size; empty strings and nulls are one value.  Kept on window so a panel replaced
# later (a slow response arriving after the controls moved on) is checked again by the observer.
JS_CHECK = """
(...values) => {
  const names = %s;
  const plain = (v) => (v === undefined || v === null || v === '') ? null : v;
  const controls = {};
  names.forEach((n, i) => { controls[n] = plain(values[i]); });
  window.__steerControls = controls;
  const same = (a, b) => {
    if (a === null || b === null) return a === b;
    if (typeof a === 'number' && typeof b === 'number') {
      return Math.abs(a - b) <= 1e-9 * Math.max(1, Math.abs(a), Math.abs(b));
    }
    return a === b;
  };
  const check = () => {
    const now = window.__steerControls || {};
    document.querySelectorAll('.made-for[data-key]').forEach((el) => {
      let key = {};
      try { key = JSON.parse(el.dataset.key); } catch (e) { return; }
      const stale = Object.keys(key).some((k) => (k in now) && !same(key[k], now[k]));
      el.classList.toggle('stale', stale);
    });
  };
  window.__steerCheckStale = check;
  if (!window.__steerObserver) {
    window.__steerObserver = new MutationObserver(() => window.__steerCheckStale && window.__steerCheckStale());
    window.__steerObserver.observe(document.body, {childList: true, subtree: true});
  }
  check();
  return values;
}
""" % json.dumps(list(CONTROLS))

# Enter in the α or layer box commits the value as leaving the box does (gradio releases a slider on blur, not on
# Enter: Enter redrew the bars but left both generations and the dose-response at the old α).  Installed once.
JS_ENTER_COMMITS = """
() => {
  if (!window.__steerEnterCommits) {
    window.__steerEnterCommits = true;
    document.addEventListener('keydown', (e) => {
      if (e.key === 'Enter' && e.target.matches('#alpha-slider input[type=number], #explore-layer input[type=number]')) {
        e.target.blur();
      }
    }, true);
  }
}
"""

# The holder takes no room, and the note lies over the top of its panel (no layout jump while α is dragged);
# it shows only when a panel stays stale for more than a moment (each slider move is stale for ~50 ms).
CSS = """
.made-for-holder { padding: 0 !important; margin: 0 !important; min-height: 0 !important; height: 0;
  border: none !important; background: none !important; overflow: visible !important; position: relative;
  z-index: 20; }
.made-for-holder > div, .made-for-holder .prose { min-height: 0 !important; padding: 0 !important; }
.made-for .stale-note { display: none; }
.made-for.stale .stale-note { display: block; position: absolute; top: 2px; left: 2px; right: 2px;
  padding: 4px 8px; border-radius: 4px; font-size: 14px; background: #fff4d6; color: #5c3d00;
  border: 1px solid #b58900; animation: steer-stale-in 0s linear 0.6s both; }
@keyframes steer-stale-in { from { visibility: hidden; } to { visibility: visible; } }
@media (max-width: 760px) { #bars-made-for { order: -3; } }
"""
