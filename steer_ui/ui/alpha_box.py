"""The α slider's typed box and its keys, on the page (issue #52: "the page keeps its word").

gradio's slider sends a typed value as it is on leaving the box and only then clamps what the box shows: a typed
5 beside a ±0.315 slider ran at 5 while the box said 0.315, and an unreadable "abc" ran as 0 after two refusals.
This script, installed once at page load, checks the box before gradio's own listeners see it (capture phase):

* while typing, nothing goes further than the box: no next-token pass runs for the values on the way ("1", "13"
  of "133.9"; with them passed, the slider's state moved under the keys and once left 13.9 in the box, which the
  random walk caught); a click into the box no longer counts as a release (it regenerated the shown view);
* Enter or leaving the box (Tab, a click elsewhere) commits: a value the slider can take runs once and is released
  like a drag's end; any other is refused: the box returns to the value it had when it was entered, one line under
  the slider says why in the page's language, and nothing runs (no next-token pass, no generation, no sweep);
* arrow keys (and Page Up/Down, Home, End) on the slider move α like a drag; once they rest for KEY_REST_MS the
  move is released like a drag's end, so both generations and the dose-response follow.

The α range box (``#explore-alpha-max``) is held the same way against its own bounds: a 0 typed there (or on the
way to 0.5) reached the server, which refused it outside the queue, where no toast can go: the α slider turned
into a red "Error" pill with no word of why (a browser review).  Now it is refused on leaving the box, which
returns to its last value, with one line under it.

The server holds the page to the slider's range as well (``common.SliderAlpha``), for a page whose script did not
run; API callers are not held to it (the range is a convenience of the page).
"""
from __future__ import annotations

import json

from . import i18n

KEY_REST_MS = 400  # a held arrow key repeats every ~30-50 ms: one release when it rests, not one per step

_JS = """
() => {
  if (window.__steerAlphaBox) return;
  window.__steerAlphaBox = true;
  const lines = %(lines)s;
  // every α slider of the page (the main one and the rows of ui/extra_terms.py) carries this class; each box is
  // checked against its own slider's range and says why beside its own slider
  const SLIDER = '.steer-alpha', RANGE = SLIDER + ' input[type=range]';
  // the α range box is checked against its own min and max, the α boxes against their sliders'
  const LIMIT = '#explore-alpha-max input[type=number]', BOX = SLIDER + ' input[type=number], ' + LIMIT;
  const rangeOf = (box) => {
    if (on(box, LIMIT)) return box;
    const s = box.closest(SLIDER);
    return s ? s.querySelector('input[type=range]') : null;
  };
  const KEYS = ['ArrowLeft', 'ArrowRight', 'ArrowUp', 'ArrowDown', 'PageUp', 'PageDown', 'Home', 'End'];
  const on = (el, selector) => el instanceof Element && el.matches(selector);
  let entered = null;  // the box's value when it was entered: the last value the slider took
  let committing = false;  // our own input event, which carries a committed value through to gradio
  let resting = null;
  // why a typed text is refused, or null: not a number (the browser's badInput reads as ''), or off the range
  const refusal = (text, bad, range) => {
    const trimmed = String(text ?? '').trim();
    const value = trimmed === '' || bad ? NaN : Number(trimmed);
    if (!Number.isFinite(value)) return ['number', {}];
    if (!range) return null;
    const low = Number(range.min), high = Number(range.max);
    // each end's own slack: one shared by both let a 0 through the α range box's [0.001, 1000000]
    const off = value < low - 1e-9 * Math.max(1, Math.abs(low)) || value > high + 1e-9 * Math.max(1, Math.abs(high));
    return off ? ['range', {low: range.min, high: range.max}] : null;
  };
  const refused = (box) => refusal(box.value, box.validity.badInput, rangeOf(box));
  const say = (box, text) => {
    const limit = on(box, LIMIT), slider = limit ? box.closest('#explore-alpha-max') : box.closest(SLIDER);
    // the main slider's line keeps its id (alpha-refusal); an added row's is named after its slider
    const id = limit ? 'alpha-max-refusal'
      : !slider || slider.id === 'alpha-slider' ? 'alpha-refusal' : slider.id + '-refusal';
    let line = document.getElementById(id);
    if (!line && slider && text) {
      line = document.createElement('div');
      line.id = id;
      line.className = 'alpha-box-refusal';
      line.setAttribute('role', 'alert');
      slider.appendChild(line);
    }
    if (line) { line.textContent = text; line.hidden = !text; }
  };
  document.addEventListener('focusin', (e) => { if (on(e.target, BOX)) entered = e.target.value; }, true);
  // typing: nothing reaches gradio until the value is committed. A value passed on the way ("13" of "133.9") ran a
  // next-token pass, and the slider's state, moving under the keys, could leave the box at another value than typed
  for (const type of ['input', 'change']) {
    document.addEventListener(type, (e) => {
      if (on(e.target, BOX) && !committing) e.stopImmediatePropagation();
    }, true);
  }
  // a click into the box is not a commit (gradio released the slider on it, regenerating what was shown); leaving is
  document.addEventListener('pointerup', (e) => { if (on(e.target, BOX)) e.stopImmediatePropagation(); }, true);
  // the commit: a value the slider can take goes to gradio as one input; any other puts the box back and says why
  const commit = (box) => {
    const why = refused(box);
    if (!why) {
      // a refusal's line stays until a new value is taken (the box, put back, loses the focus without one)
      if (box.value !== entered) {
        say(box, '');
        committing = true;
        try { box.dispatchEvent(new Event('input', {bubbles: true})); } finally { committing = false; }
      }
      entered = box.value;
      return true;
    }
    const range = rangeOf(box), limit = on(box, LIMIT);
    box.value = entered !== null && !refusal(entered, false, range) ? entered
      : limit ? '1' : (range ? range.value : '0');
    const text = (lines[window.__steerLang] || lines.en)[limit ? 'limit_' + why[0] : why[0]];
    say(box, text.replace('{low}', why[1].low).replace('{high}', why[1].high));
    return false;
  };
  // leaving the box commits, and gradio's own blur then releases the slider (both generations and the sweep follow)
  // (Enter leaves the box: panel_keys.JS_ENTER_COMMITS)
  document.addEventListener('blur', (e) => {
    if (on(e.target, BOX) && !commit(e.target)) e.stopImmediatePropagation();
  }, true);
  // keys on the slider: released like a drag once they rest
  document.addEventListener('keydown', (e) => {
    if (!on(e.target, RANGE) || !KEYS.includes(e.key)) return;
    clearTimeout(resting);
    const range = e.target;
    resting = setTimeout(() => range.dispatchEvent(new PointerEvent('pointerup', {bubbles: true})), %(rest)d);
  }, true);
}
"""


def script() -> str:
    """The page-load script, with the refusal lines in every language (the page picks its own)."""
    lines = {lang: {"range": i18n.message(lang, "alpha_outside_range", low="{low}", high="{high}"),
                    "number": i18n.message(lang, "alpha_not_a_number"),
                    "limit_range": i18n.message(lang, "alpha_max_outside_range", low="{low}", high="{high}"),
                    "limit_number": i18n.message(lang, "alpha_max_not_a_number")} for lang in i18n.LANGS}
    return _JS % {"lines": json.dumps(lines, ensure_ascii=False), "rest": KEY_REST_MS}
