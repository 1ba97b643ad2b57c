"""The Explore view in the page URL: ``?prompt=…&vector=…&layer=…&alpha=…&relative=…&alpha_max=…``, and
``&steer=…`` for the vectors added under the main one (issue #48: their spec, ui/extra_terms.py; absent for one
vector, so a one-vector link is what it always was).

Opening such a link restores those controls and runs the view; the page keeps
the query string in step as the controls change (``JS_SYNC_URL``) and the
"Copy link" button copies it.  A vector the page's owner shared (or that the page opened by a share link)
travels as its share id (``vector_ref``), so the link opens it for anyone; ``?result=<id>`` opens a saved
result instead (ui/library_ui.py).  Values from a URL are hostile input like any
other: unknown keys are ignored, bad values fall back to the defaults with a
notice, and the service checks everything again.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Mapping

from ..messages import english

KEYS = ("prompt", "vector", "layer", "alpha", "alpha_max", "relative", "seed", "extend", "steer")
RANDOM_NAME = "random direction"  # the page's name of the seeded random direction (rooms.common.RANDOM)
MAX_STEER_CHARS = 4096  # the added terms' text (ui/extra_terms.MAX_EXTRA_CHARS)
EXTEND = 5.0  # Extend range widens the α slider this many times: room to see the explosion
ALPHA_MAX_RANGE = (0.001, 1e6)  # what the page's α-max field accepts


class Notice(str):
    """A link value the page refused, in English (as logs and tests read it), with its message key and
    parameters so the banner says it in the page's language (and again after a language switch)."""

    def __new__(cls, key: str, **params):
        notice = super().__new__(cls, english(key, **params))
        notice.key, notice.params = key, params
        return notice


@dataclass
class ExploreState:
    prompt: str
    vector: str
    layer: int
    alpha: float
    alpha_max: float
    relative: bool = True
    seed: int = 0
    extend: bool = False  # Extend range: the slider spans EXTEND × α max
    extra: str = ""  # the added vectors' spec text (ui/extra_terms.py), "" for one vector
    notices: list[str] = field(default_factory=list)


def _number(text: str | None) -> float | None:
    try:
        value = float(str(text))
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def from_query(query: Mapping[str, str], defaults: ExploreState, vectors: list[str], num_layers: int,
               max_prompt: int) -> ExploreState:
    """``defaults`` overridden by the valid values of ``query``; each refused value leaves a notice."""
    state = ExploreState(**{k: v for k, v in vars(defaults).items() if k != "notices"})
    prompt = query.get("prompt")
    if prompt:
        if len(prompt) <= max_prompt:
            state.prompt = prompt
        else:
            state.notices.append(Notice("link_prompt_too_long", limit=max_prompt))
    vector = query.get("vector")
    if vector:
        if vector in vectors:
            state.vector = vector
        else:  # a user's own vector travels as a file (Export), not in a link
            # the notice goes into the page banner as plain text (i18n.markdown), so a link cannot inject markup
            state.notices.append(Notice("link_vector_missing", vector=vector[:60]))
    layer = _number(query.get("layer"))
    if layer is not None and layer == int(layer) and 0 <= layer < num_layers:
        state.layer = int(layer)
    elif "layer" in query:
        state.notices.append(Notice("link_layer_missing", layer=repr(query["layer"][:10]), top=num_layers - 1))
    relative = query.get("relative")
    if relative is not None:
        state.relative = relative.strip().lower() not in ("0", "false", "no", "raw")
    extend = query.get("extend")
    if extend is not None:  # a link made with Extend range ticked: its α may lie past α max (issue #52's walk)
        state.extend = extend.strip().lower() not in ("0", "false", "no", "")
    alpha_max = _number(query.get("alpha_max"))
    if alpha_max is not None and alpha_max > 0:
        state.alpha_max = min(max(alpha_max, ALPHA_MAX_RANGE[0]), ALPHA_MAX_RANGE[1])
    alpha = _number(query.get("alpha"))
    if alpha is not None:
        state.alpha = max(-ALPHA_MAX_RANGE[1], min(ALPHA_MAX_RANGE[1], alpha))
        state.alpha_max = max(state.alpha_max, abs(state.alpha) / (EXTEND if state.extend else 1.0))
    elif "alpha" in query:
        state.notices.append(Notice("link_alpha_not_number"))
    seed = _number(query.get("seed"))
    if seed is not None and seed == int(seed) and 0 <= seed < 2**31:
        state.seed = int(seed)
    if query.get("steer"):
        state.extra = added_terms(query["steer"], vectors, num_layers, state.notices)
        for term in json.loads(state.extra or '{"vectors": []}')["vectors"]:  # every α on the page's one range
            state.alpha_max = max(state.alpha_max, abs(term["scale"]) / (EXTEND if state.extend else 1.0))
    return state


def added_terms(text: str, vectors: list[str], num_layers: int, notices: list, max_terms: int = 3) -> str:
    """The link's added vectors as the page writes them (ui/extra_terms.compose), or "": each term checked as the
    main one is (a vector on this server, a layer of this model, a finite α in the page's range); a term that is
    not is left out with a notice, and a text that is no spec at all with one notice; an empty text asks for none.
    """
    from .. import steering_spec
    from ..messages import UserError

    if not text:
        return ""
    try:
        if len(text) > MAX_STEER_CHARS:
            raise UserError("steering_shape", limit=max_terms)
        terms = steering_spec.parse(text, max_terms, num_layers).terms
    except UserError:
        notices.append(Notice("link_steer_bad", limit=max_terms))
        return ""
    kept = []
    for term in terms:
        name = RANDOM_NAME if term.random else term.source
        if not term.random and term.source not in vectors:
            notices.append(Notice("link_vector_missing", vector=term.source[:60]))
            continue
        layer = term.layers[0] if term.layers else None
        if layer is None or layer >= num_layers:
            notices.append(Notice("link_layer_missing", layer=repr(str(layer)[:10]), top=num_layers - 1))
            continue
        scale = max(-ALPHA_MAX_RANGE[1], min(ALPHA_MAX_RANGE[1], term.scale))
        term_ = {"source": steering_spec.RANDOM_SOURCE if name == RANDOM_NAME else name, "scale": scale,
                 "layers": [layer]}
        if "normalize" in term.given:  # the row's own units (absent: the main row's, as before rows had their own)
            term_["normalize"] = term.normalize
        if term.random and "seed" in term.given:
            term_["seed"] = term.seed
        kept.append(term_)
    return json.dumps({"vectors": kept}, ensure_ascii=False, separators=(",", ":")) if kept else ""


def terms_ref(share_ids: dict) -> str:
    """The hidden field the page keeps its added rows' share ids in (``{name: share id}``, "" for none): the link
    writes each row's vector by its share id where it has one, as it writes the main vector's (``vector_ref``)."""
    return json.dumps(share_ids, ensure_ascii=False, separators=(",", ":")) if share_ids else ""


def fall_back(state: ExploreState, defaults: ExploreState, wanted: str | None, opened_ref: str = "") -> bool:
    """A link whose vector could not be opened shows the default vector: at that vector's own layer, α, range
    and units, since the link's were chosen for another vector (issue #36).  Whether it fell back."""
    if not wanted or state.vector == wanted or opened_ref == wanted:
        return False
    state.vector = defaults.vector
    state.layer, state.alpha, state.alpha_max = defaults.layer, defaults.alpha, defaults.alpha_max
    state.relative, state.seed, state.extend = defaults.relative, defaults.seed, defaults.extend
    return True


# A link holds at most about MAX_LINK_CHARS characters (issue #52: a long prompt made a 20,125-character URL, past
# what mail, chat and some servers keep).  A prompt whose encoded form passes PROMPT_IN_LINK travels as the id of a
# saved copy instead (``prompt_id``), made by Copy link or Share when asked for (steer_ui/ui/library_ui.py): the rest
# of the query is a few short fields, so the link stays under the limit.  The address bar leaves such a prompt out
# until then (it cannot ask the server on every keystroke); Copy link and Share then write the same URL into it.
MAX_LINK_CHARS = 2000
PROMPT_IN_LINK = 1500


def encoded_chars(prompt: str) -> int:
    """The length of ``prompt`` in a query string as the page's URLSearchParams writes it (space as +, only
    letters, digits and *-._ unescaped, the rest as UTF-8 %XX): Python's quote_plus, but for '~'."""
    from urllib.parse import quote_plus

    return len(quote_plus(prompt or "", safe="*")) + 2 * (prompt or "").count("~")


def prompt_ref(prompt_id: str, prompt: str) -> str:
    """The hidden field the page keeps a saved prompt's id in: the id with the prompt it stands for, so the page
    uses it only while the prompt box holds that very prompt."""
    return json.dumps({"id": prompt_id, "prompt": prompt}, ensure_ascii=False)


def ref_holds(ref: str | None, prompt: str) -> bool:
    """Whether the hidden field ``ref`` is a saved copy's id for exactly ``prompt``."""
    try:
        data = json.loads(ref or "null")
    except ValueError:
        return False
    return isinstance(data, dict) and bool(data.get("id")) and data.get("prompt") == (prompt or "")


# The query string of the view, one block shared by the three scripts below (the address bar, Copy link and Share
# give the same URL); α goes into the link with 4 significant digits, as the page shows it.  ``whole``: the query
# holds the whole view (a long prompt without its saved id is left out).
_JS_QUERY = """
  let ref = null;
  try { ref = JSON.parse(prompt_ref || 'null'); } catch (e) { ref = null; }
  const text = prompt ?? "";
  const byId = ref && ref.id && ref.prompt === text ? String(ref.id) : "";
  const fits = new URLSearchParams({p: text}).toString().length - 2 <= %(limit)d;
  const fields = byId ? {prompt_id: byId} : (fits ? {prompt: text} : {});
  let steer = extra || "";
  try {  // each added row's vector by its share id where it has one (terms_ref), so a stranger opens it too
    const ids = JSON.parse(extra_ref || "{}");
    const spec = steer ? JSON.parse(steer) : null;
    if (spec && spec.vectors.some(t => ids[t.source])) {
      spec.vectors.forEach(t => { if (ids[t.source]) { t.source = ids[t.source]; } });
      steer = JSON.stringify(spec);
    }
  } catch (e) { steer = extra || ""; }
  const q = new URLSearchParams(Object.assign(fields, {vector: vector_ref || vector || "", layer: String(layer),
    alpha: String(parseFloat(Number(alpha).toPrecision(4))), relative: relative ? "1" : "0", seed: String(seed ?? 0),
    alpha_max: String(alpha_max)}, extend ? {extend: "1"} : {}, steer ? {steer} : {}));
  const whole = Boolean(byId) || fits;
""" % {"limit": PROMPT_IN_LINK}
_JS_ARGS = "prompt, vector, layer, alpha, relative, seed, alpha_max, vector_ref, prompt_ref, extend, extra, extra_ref"

# Keeps the query string in step with the Explore controls (runs in the browser; no server round trip).
JS_SYNC_URL = f"""
({_JS_ARGS}) => {{{_JS_QUERY}
  window.history.replaceState(null, "", window.location.pathname + "?" + q.toString());
  return [{_JS_ARGS}];
}}
"""

# "Copy link": the same URL, to the clipboard (and shown, for browsers that refuse clipboard access).  A view whose
# long prompt has no saved id (the server could not keep one; its line says why) leaves the link box as it was.
_JS_COPY_BODY = f"""{_JS_QUERY}
  if (!whole) {{ return shown; }}
  const url = window.location.origin + window.location.pathname + "?" + q.toString();
  window.history.replaceState(null, "", url);
  if (navigator.clipboard) {{ navigator.clipboard.writeText(url).catch(() => {{}}); }}
  return url;
"""
JS_COPY_URL = f"({_JS_ARGS}, shown) => {{{_JS_COPY_BODY}}}"

# "Share", after the server made the vector's share id (and the added rows' own vectors' ids): Copy link's URL, now
# carrying them.  Without any id (the share was refused; its line says why) the link box keeps what it showed.
JS_SHARE_URL = f"({_JS_ARGS}, shown) => {{ if (!vector_ref && !extra_ref) {{ return shown; }}{_JS_COPY_BODY}}}"
