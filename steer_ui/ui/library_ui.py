"""Keeping and sharing on the page: the browser's owner token, Share, Save result, ``?result=`` and Run live, and
the library's API endpoints (``/whoami``, ``/vectors``, ``/share_vector``, ``/unshare_vector``, ``/save_result``,
``/result``).

The owner token lives in the browser's local storage (``gr.BrowserState``, under a key every app process of one
library shares), so a reload, a second tab or a server restart finds the same owner; API clients send it as the
``X-Steer-Owner`` header (request_guard binds it).  Every endpoint goes through the service, like every other.
"""
from __future__ import annotations

import json
from types import SimpleNamespace

import gradio as gr
import pandas as pd

from .. import plots
from ..messages import UserError
from ..service import RANDOM, Service, last_frame
from . import extra_terms, i18n, panel_keys, relabel
from .chat_panel import SHOW_CHAT
from .common import EXPLORE, SLIDER, as_gr_error, handler, page_url, sid, table
from .request_guard import client_address
from . import url_state
from .url_state import JS_COPY_URL, JS_SHARE_URL, Notice

STORAGE_KEY = "steer_ui_owner"
SHOW_RESULT = "show_result"  # the session's saved result while the page shows it (set by the page load)
SHOW_COMPARISON = "show_comparison"  # a saved comparison the page load hands to the Many prompts tab


def owner_state(backend: Service) -> gr.BrowserState:
    return gr.BrowserState("", storage_key=STORAGE_KEY, secret=backend.browser_secret)


# ------------------------------------------------------------------------------------- a saved result's panels
def _view(numbers: dict) -> SimpleNamespace:
    """A next-token view rebuilt from its saved numbers (what the readout and the charts read)."""
    frame = lambda key: pd.DataFrame(numbers.get(key) or [])  # noqa: E731
    return SimpleNamespace(
        unsteered=frame("unsteered"), steered=frame("steered"), promoted=frame("promoted"),
        suppressed=frame("suppressed"), likely_promoted=frame("likely_promoted"),
        likely_suppressed=frame("likely_suppressed"), kl=numbers.get("kl", 0.0),
        entropy_unsteered=numbers.get("entropy_unsteered", 0.0), entropy_steered=numbers.get("entropy_steered", 0.0),
        max_abs_delta_logit=numbers.get("max_abs_delta_logit", 0.0),
        max_delta_token=numbers.get("max_delta_token", ""),
        likely_max_abs_delta_logit=numbers.get("likely_max_abs_delta_logit", 0.0),
        likely_max_delta_token=numbers.get("likely_max_delta_token", ""),
        likely_tokens=numbers.get("likely_tokens", 0), exploding=bool(numbers.get("exploding")))


def _token_frame(tokens: list[dict]) -> pd.DataFrame:
    return pd.DataFrame({"position": range(len(tokens)), "token": [t["token"] for t in tokens],
                         "logprob": [t["logprob"] for t in tokens],
                         "delta_logit": [t.get("delta_logit") for t in tokens],
                         "direct_delta_logit": [t.get("direct_delta_logit") for t in tokens]})


def saved_next_token(explore_tab, lang: str, saved: dict) -> tuple:
    """(bars, Δlogit chart, readout, details) of a saved result, drawn from its numbers without the model."""
    from .explore_tab import delta_figure, readout_markdown

    numbers = saved["view"].get("next_token") or {}
    empty = plots.empty_figure(i18n.message(lang, "result_view", when=saved.get("when", "?")))
    if not numbers or not all("token_id" in row for key in ("unsteered", "steered") for row in numbers.get(key, [])):
        return empty, empty, "", saved  # no next-token numbers saved (an API save), or ones this page cannot draw
    view = _view(numbers)
    bars = plots.next_token_bars(view.unsteered.assign(rank=range(1, len(view.unsteered) + 1)),
                                 view.steered.assign(rank=range(1, len(view.steered) + 1)),
                                 labels=i18n.plot_labels(lang, "bars"))
    if float(saved["view"].get("alpha") or 0) == 0 or view.likely_promoted.empty:  # as the live view says it
        nothing = i18n.message(lang, "no_steering")
        return bars, plots.empty_figure(nothing), nothing, saved
    return bars, delta_figure(lang, view, False), readout_markdown(lang, view), saved


def saved_generation(lang: str, saved: dict) -> tuple:
    """(unsteered text, coloured steered tokens, per-token chart, token table, details) of a saved result."""
    from .explore_tab import shade

    generation = saved["generation"]
    tokens = generation["steered"]["tokens"]
    coloured = [(t["token"], shade(t.get("delta_logit"))) for t in tokens]
    frame = _token_frame(tokens)
    chart = plots.per_token_delta(frame, labels=i18n.plot_labels(lang, "per_token")) if len(frame) else \
        plots.empty_figure(i18n.message(lang, "no_tokens"))
    return generation["unsteered"]["text"], coloured, chart, table(frame), saved


def reproduced(saved: dict, frame_dict: dict) -> tuple[bool, str]:
    """Whether a live run gave the saved tokens; what differs if not."""
    old, new = saved["generation"]["steered"]["tokens"], frame_dict["steered"]["tokens"]
    if [t["token"] for t in old] != [t["token"] for t in new]:
        at = next((i for i, (a, b) in enumerate(zip(old, new)) if a["token"] != b["token"]), min(len(old), len(new)))
        return False, f"the steered text differs from token {at}"
    worst = max((abs(a["logprob"] - b["logprob"]) for a, b in zip(old, new)), default=0.0)
    return True, f"; log-probabilities within {worst:.1e}"


def _live_panel(lang: str, other_model: str | None, same: bool, detail: str, made_for: dict, result: dict) -> tuple:
    """(status, made-for element, the generation's panels) of a saved result run live, in ``lang``."""
    if other_model:
        status = i18n.message(lang, "result_other_model", model=other_model)
    else:
        status = i18n.message(lang, "reproduced" if same else "not_reproduced", numbers=detail, detail=detail)
    made = panel_keys.made_for(lang, "generations", made_for, panel_keys.STEERING + panel_keys.EXTRA)
    return (status, made) + saved_generation(lang, result)[:4]


# ------------------------------------------------------------------------------------------------- wiring
def wire(backend: Service, explore, owner: gr.BrowserState) -> None:
    """Share, Save result and Run live on the Explore tab, and the library's API endpoints."""

    # a refusal goes to the library's line: this event runs outside the queue, where a toast never reaches the page
    # (a browser review's Share on the default vector did nothing it could see); and it empties the view's share
    # ids, so the link copied after it (JS_SHARE_URL) carries none the refusal is about (Share again puts them back)
    @handler(backend, status=explore.library_status, clear=(explore.vector_ref, explore.extra_ref))
    def share(vector, extra, request: gr.Request):
        session = sid(request)
        rows = {v["name"]: v for v in backend.vectors(session)}  # once, not once per added row
        kinds = {name: v["kind"] for name, v in rows.items()}
        rows_owned = any(kinds.get(t.source) == "own" for t in extra_terms.added(extra))
        line = relabel.text("shared")
        if kinds.get(vector) in ("random", "bundled", "listed"):
            share_id = ""  # every server has it: a link names it, and the added rows' own vectors by their ids
            if not rows_owned:
                line = relabel.text("shared_by_name", name=vector)
        elif kinds.get(vector) == "shared":  # opened by a link: passed on under the id it came with (it was
            share_id = rows[vector]["share_id"]  # refused as not this session's own, and the link copied anyway)
            backend.open_shared(session, share_id, client_address(request))  # still shared? (else unknown_id)
            if not rows_owned:
                line = relabel.text("shared_passed_on", name=vector)
        else:
            try:
                share_id = backend.share_vector(session, vector)
            except UserError:
                if not rows_owned:
                    raise
                share_id = ""
        ids = url_state.terms_ref(rows_share_ids(backend, session, extra))  # every added row's own vector too
        # the link itself is the page's own (JS_COPY_URL, chained below): the whole view, with the share ids
        return share_id, ids, relabel.keep(backend, session, [explore.library_status], *line)

    @handler(backend, status=explore.library_status)
    def link_prompt(prompt, prompt_ref, request: gr.Request):
        """Before Copy link or Share: a prompt too long for a link is kept as a saved copy whose id the link
        carries instead (url_state.PROMPT_IN_LINK); the id is kept on the page for as long as the prompt stays."""
        if url_state.encoded_chars(prompt) <= url_state.PROMPT_IN_LINK:
            return "", gr.skip()  # the prompt travels in the link itself
        if url_state.ref_holds(prompt_ref, prompt):
            return gr.skip(), gr.skip()  # already kept: one copy per prompt, however often the link is copied
        prompt_id = backend.save_result(sid(request), {"prompt": prompt}, generation=False)
        return url_state.prompt_ref(prompt_id, prompt), gr.skip()

    @handler(backend)
    def save(prompt, vector, layer, alpha, relative, seed, alpha_max, vector_ref, extend=False, extra="",
             extra_ref="", request: gr.Request = None):
        # the next-token numbers are measured here for exactly these settings: the page's raw-numbers panel may
        # hold a generation's numbers or an older α's (one slider pass, no generation)
        spec = extra_terms.full_spec(vector, layer, alpha, relative, seed, extra)  # every term (issue #48)
        numbers = (backend.next_token(sid(request), prompt, vector, layer, alpha, relative, seed) if spec is None
                   else backend.next_token_for(sid(request), prompt, spec)).as_dict()
        view = {"prompt": prompt, "vector": vector, "vector_ref": vector_ref or "", "layer": layer,
                "alpha": alpha, "relative": relative, "seed": seed, "alpha_max": alpha_max, "extend": bool(extend),
                "extra": extra or "", "next_token": numbers}
        result_id = backend.save_result(sid(request), view)
        link = f"{page_url(request)}?result={result_id}"
        return (relabel.keep(backend, sid(request), [explore.library_status], *relabel.text("saved_result")),
                gr.update(value=link, visible=True))

    @handler(backend)
    def run_live(request: gr.Request):
        """Re-run the saved result's generation with its own settings and say whether it reproduced."""
        session = sid(request)
        saved = backend.session(session).cache.get(SHOW_RESULT)
        if saved is None:
            raise UserError("no_generation")
        settings = saved["generation"].get("settings") or {}
        sampling = backend.sampling(**{k: v for k, v in (settings.get("sampling") or {}).items()
                                       if k in ("max_new_tokens", "temperature", "top_k", "top_p",
                                                "repetition_penalty", "seed", "max_delta_logit")})
        vector = settings.get("vector")
        if saved.get("has_vector"):
            vector = backend.open_result_vector(session, saved["id"], client_address(request)) or vector
        prompt, layer, alpha = settings.get("prompt") or saved["view"]["prompt"], settings.get("layer"), \
            settings.get("alpha", 0.0)
        relative, seed, extra = settings.get("relative", True), settings.get("seed", 0), settings.get("extra") or ""
        if saved.get("term_vectors"):  # the added rows' own vectors, kept with it as the main one is
            opened = backend.open_result_terms(session, saved["id"], client_address(request))
            extra = extra_terms.renamed(extra, extra_terms.opened_names(saved, opened))
        spec = extra_terms.full_spec(vector, layer, alpha, relative, seed, extra)  # the saved result's every term
        frame = backend.generate(session, prompt, vector, layer, alpha, relative, seed, sampling) if spec is None \
            else last_frame(backend.stream_generate_for(session, prompt, spec, sampling))
        same, detail = reproduced(saved, frame.as_dict())
        other_model = saved["model_id"] if saved.get("model_id") and saved["model_id"] != backend.handle.model_id \
            else None
        made_for = panel_keys.key_of("generations", {**settings, "vector": vector, "extra": extra,
                                                     "vector_seed": settings.get("seed", 0)}, panel_keys.STEERING + panel_keys.EXTRA)
        return relabel.keep(backend, session, [explore.library_status, explore.generations_key, explore.unsteered,
                                               explore.steered, explore.per_token, explore.tokens], _live_panel,
                            other_model, same, detail, made_for, {**saved, "generation": frame.as_dict()})

    # Copy link, Share and the address bar give one URL (issue #52): the whole view, with the vector's share id (or a
    # bundled vector's name) and a long prompt's saved id; a stranger who opens it sees the owner's numbers
    def link_chain(start, trigger: str, script: str) -> None:
        start(link_prompt, [explore.prompt, explore.prompt_ref], [explore.prompt_ref, explore.library_status],
              api_name=f"link_prompt_on_{trigger}", api_visibility="undocumented", queue=False) \
            .then(None, explore.url_inputs + [explore.link], [explore.link], js=script, queue=False) \
            .then(lambda: gr.update(visible=True), None, [explore.link], queue=False, api_visibility="undocumented")

    link_chain(explore.copy_link.click, "copy", JS_COPY_URL)
    link_chain(explore.share.click(share, [explore.vector, explore.rows.extra],
                                   [explore.vector_ref, explore.extra_ref, explore.library_status],
                                   api_name="share_button", api_visibility="undocumented", queue=False).then,
               "share", JS_SHARE_URL)
    # a saved result keeps its prompt whole (it is opened by ?result=, not by the view's link)
    explore.save.click(save, [c for c in explore.url_inputs if c is not explore.prompt_ref],
                       [explore.library_status, explore.link],
                       api_name="save_button", api_visibility="undocumented", **SLIDER)
    explore.run_live.click(run_live, None, [explore.library_status, explore.generations_key, explore.unsteered,
                                            explore.steered, explore.per_token, explore.tokens],
                           api_name="run_live", api_visibility="undocumented", **EXPLORE)

    # ------------------------------------------------------------------------------------------ the API
    def whoami(request: gr.Request) -> str:
        """This session's owner token: send it as the X-Steer-Owner header to be the same owner later."""
        return backend.whoami(sid(request))

    def vectors(request: gr.Request) -> list:
        """Every vector this session can use, and where it comes from (own, shared, listed, bundled, random)."""
        return backend.vectors(sid(request))

    def share_vector(name: str, request: gr.Request) -> dict:
        """Share one of your kept vectors: {"id", "url"}; anyone with the url opens it, read-only."""
        share_id = backend.share_vector(sid(request), name)
        return {"id": share_id, "url": f"{page_url(request)}?vector={share_id}"}

    def unshare_vector(name: str, request: gr.Request) -> bool:
        """Stop sharing one of your vectors: its links no longer open it."""
        return backend.unshare_vector(sid(request), name)

    def save_result(request: gr.Request) -> dict:
        """Save this session's last generation with its settings: {"id", "url"} (the url shows it at once)."""
        result_id = backend.save_result(sid(request), {})
        return {"id": result_id, "url": f"{page_url(request)}?result={result_id}"}

    def result(result_id: str, request: gr.Request) -> dict:
        """A saved result as saved, read without running the model."""
        return json.loads(json.dumps(backend.result(result_id, client_address(request))))

    for fn in (whoami, vectors, share_vector, unshare_vector, save_result, result):  # quick: not queued
        gr.api(plain_api(backend, fn), api_name=fn.__name__, queue=False)


def plain_api(backend, fn):
    """``fn`` with every failure as one plain line in the session's language (gr.api keeps its signature)."""
    import functools

    @functools.wraps(fn)
    def call(*args, **kwargs):
        request = kwargs.get("request") or next((a for a in args if isinstance(a, gr.Request)), None)
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001
            raise as_gr_error(backend, request, exc) from None

    return call


def unless_saved(backend: Service, fn, render, panel: str, outputs: list):
    """``fn`` for the page-load chain, except on a saved result's page (``?result=``), where ``render(lang,
    saved)`` draws its panels (``outputs``) from the saved numbers without running the model, after the element
    saying which steering settings they were made for (``panel``'s, see ui/panel_keys.py; the controls were set
    from them)."""
    import functools
    import inspect

    def saved_of(args, kwargs):
        request = kwargs.get("request") or next((a for a in args if isinstance(a, gr.Request)), None)
        session = backend.peek_session(sid(request))
        return request, (session.cache.get(SHOW_RESULT) if session is not None else None)

    def draw(lang, inputs, saved):
        return (panel_keys.made_for_inputs(lang, panel, inputs, panel_keys.STEERING + panel_keys.EXTRA),) + tuple(render(lang, saved))

    def drawn(request, saved, args):
        inputs = [a for a in args if not isinstance(a, gr.Request)]
        return relabel.keep(backend, sid(request), outputs, draw, inputs, saved)

    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def stream(*args, **kwargs):
            request, saved = saved_of(args, kwargs)
            if saved is None:
                yield from fn(*args, **kwargs)
            else:
                yield drawn(request, saved, args)
        return stream

    @functools.wraps(fn)
    def call(*args, **kwargs):
        request, saved = saved_of(args, kwargs)
        return fn(*args, **kwargs) if saved is None else drawn(request, saved, args)

    return call


def no_sweep(lang: str, saved: dict) -> tuple:
    """A saved result keeps no dose-response: the chart says so (Run live, then sweep)."""
    return plots.empty_figure(i18n.message(lang, "result_view", when=saved.get("when", "?"))), gr.skip()


def rows_share_ids(backend: Service, session: str, extra) -> dict:
    """``{name: share id}`` for the added rows' vectors that can travel in a link: the session's own (shared now,
    as Share shares the main one) and those a share link opened; bundled and random ones travel by name."""
    rows = {row["name"]: row for row in backend.vectors(session)}
    out = {}
    for term in extra_terms.added(extra):
        row = rows.get(term.source) or {}
        if row.get("kind") == "shared" and row.get("share_id"):
            out[term.source] = row["share_id"]
        elif row.get("kind") == "own":
            try:
                out[term.source] = backend.share_vector(session, term.source)
            except UserError:
                continue  # one the library does not keep (a saved result's): it travels by name, as before
    return out


def open_linked_terms(backend: Service, request, query: dict) -> dict:
    """A link's added rows whose vector is a share id (``steer=``, as :func:`rows_share_ids` wrote it): each
    opened into the session, read-only, and renamed in ``query`` to its name here, so the link's checks
    (url_state.added_terms) find it; ``{name: share id}`` for this page's own link.  One that does not open stays
    as it was (the checks leave it out with a notice)."""
    from ..store.library import PUBLIC_ID

    text = query.get("steer")
    try:
        spec = json.loads(text) if text and len(text) <= url_state.MAX_STEER_CHARS else None
    except ValueError:
        return {}
    terms = spec.get("vectors") if isinstance(spec, dict) else None
    if not isinstance(terms, list):
        return {}
    session, client = sid(request), client_address(request)
    known, opened = set(backend.vector_names(session)), {}
    for term in terms[:extra_terms.EXTRA_ROWS]:  # more is no link the page wrote: the checks refuse it whole
        source = term.get("source") if isinstance(term, dict) else None
        if isinstance(source, str) and source not in known and PUBLIC_ID.match(source):
            try:
                term["source"] = name = backend.open_shared(session, source, client)
            except UserError:
                continue
            opened[name] = source
    if opened:
        query["steer"] = json.dumps(spec, ensure_ascii=False, separators=(",", ":"))
    return opened


def chat_controls(backend: Service, session: str, client, saved: dict, state, choices: list[str]) -> None:
    """Explore's controls set to a saved conversation's last steering (its vector opened read-only, as a saved
    result's is), so the conversation Run live starts goes on under the steering it was saved with."""
    turns = saved["chat"].get("turns") or []
    term = (turns[-1].get("steering") or {}).get("vectors", [{}])[0] if turns else {}
    source = term.get("source")
    vector = backend.open_result_vector(session, saved["id"], client) if saved.get("has_vector") else None
    vector = RANDOM if source == "random" else vector or (source if source in choices else None)
    if vector is None:
        return  # a vector this server no longer has: the controls stay the default view's
    state.vector, state.relative, state.seed = vector, bool(term.get("normalize", True)), int(term.get("seed", 0))
    layers = term.get("layers") or []
    if layers and 0 <= int(layers[0]) < backend.handle.arch.num_layers:
        state.layer = int(layers[0])
    state.alpha = float(term.get("scale", 0.0))
    state.alpha_max = max(float(state.alpha_max), abs(state.alpha))
    others = [{k: v for k, v in t.items() if k != "apply"} for t in turns[-1]["steering"]["vectors"][1:]]
    if others:  # the added rows, their own vectors opened as the main one is, checked as a link's are
        opened = backend.open_result_terms(session, saved["id"], client) if saved.get("term_vectors") else {}
        text = extra_terms.renamed(json.dumps({"vectors": others}, ensure_ascii=False),
                                   extra_terms.opened_names(saved, opened))
        state.extra = url_state.added_terms(text, choices + list(opened.values()), backend.handle.arch.num_layers,
                                            [])


def open_from_link(backend: Service, request, query: dict, state, choices: list[str]) -> dict:
    """What a link's ``vector=<share id>`` or ``result=<id>`` adds to the page view: the vector (opened into the
    session, read-only), a saved result's controls, notices for the banner (:class:`url_state.Notice`, worded in
    the page's language by the banner).  Refusals become notices."""
    from ..store.library import PUBLIC_ID

    session, client = sid(request), client_address(request)
    out = {"vector_ref": "", "prompt_ref": "", "run_live": False, "notices": []}
    prompt_id = query.get("prompt_id")
    if prompt_id:  # a prompt too long for the link, kept under this id (url_state.PROMPT_IN_LINK)
        try:
            saved = backend.result(prompt_id, client)
            prompt = (saved.get("view") or {}).get("prompt") if saved.get("kind") == "link" else None
            if not isinstance(prompt, str) or len(prompt) > backend.policy.max_prompt_chars:
                raise UserError("unknown_id")
        except UserError as exc:
            out["notices"].append(Notice(exc.key, **exc.params))
        else:
            state.prompt = prompt
            out["prompt_ref"] = url_state.prompt_ref(saved["id"], prompt)  # this page's own link stays short
    result_id = query.get("result")
    if result_id:
        try:
            saved = backend.result(result_id, client)
        except UserError as exc:
            out["notices"].append(Notice(exc.key, **exc.params))
        else:
            if saved.get("kind") == "link":  # a link's saved prompt opened as a result: nothing to draw from
                out["notices"].append(Notice("unknown_id"))
                return out
            if saved.get("kind") == "chat":  # Explore's Chat shows it (chat_panel.show_saved)
                backend.session(session).cache[SHOW_CHAT] = saved
                chat_controls(backend, session, client, saved, state, choices)
                out["notices"].append(Notice("chat_view", when=saved.get("when", "?")))
                return out
            if saved.get("kind") == "comparison":  # the Many prompts tab shows it (compare_tab.show_saved)
                # its vectors opened here, where a refusal becomes the banner's notice: the tab's own event is
                # unqueued, and a refusal there showed nothing at all (a saved vector that no longer fits the
                # model, switched since); the saved numbers are shown either way
                saved = {**saved, "opened_vector": None, "opened_terms": {}}
                for wanted, key, open_ in (("has_vector", "opened_vector", backend.open_result_vector),
                                           ("term_vectors", "opened_terms", backend.open_result_terms)):
                    try:  # each on its own: a refused main vector still opens the added rows' vectors
                        if saved.get(wanted):
                            saved[key] = open_(session, result_id, client)
                    except UserError as exc:
                        out["notices"].append(Notice(exc.key, **exc.params))
                backend.session(session).cache[SHOW_COMPARISON] = saved
                out["notices"].append(Notice("comparison_view", when=saved.get("when", "?")))
                return out
            backend.session(session).cache[SHOW_RESULT] = saved
            settings = saved["generation"].get("settings") or {}
            vector = settings.get("vector") or state.vector
            if saved.get("has_vector"):
                vector = backend.open_result_vector(session, result_id, client) or vector
            state.prompt = settings.get("prompt") or state.prompt
            state.vector = vector
            for key in ("layer", "alpha", "relative", "seed"):
                if settings.get(key) is not None:
                    setattr(state, key, settings[key])
            if settings.get("extra"):  # the added vectors (their own kept with it, opened here), checked as a link's
                opened = backend.open_result_terms(session, result_id, client) if saved.get("term_vectors") else {}
                text = extra_terms.renamed(str(settings["extra"]), extra_terms.opened_names(saved, opened))
                state.extra = url_state.added_terms(text, choices + list(opened.values()),
                                                    backend.handle.arch.num_layers, out["notices"])
            state.alpha_max = max(abs(float(state.alpha)), float(saved["view"].get("alpha_max") or state.alpha_max))
            out["run_live"] = True
            out["notices"].append(Notice("result_view", when=saved.get("when", "?")))
            return out
    wanted = query.get("vector")
    if wanted and wanted not in choices and PUBLIC_ID.match(wanted):
        try:
            state.vector = backend.open_shared(session, wanted, client)
            out["vector_ref"] = wanted
            state.notices = [n for n in state.notices if n.key != "link_vector_missing"]
        except UserError as exc:
            out["notices"].append(Notice(exc.key, **exc.params))
    return out
