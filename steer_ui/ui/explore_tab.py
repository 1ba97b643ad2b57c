"""Explore: drag α and watch the next-token distribution, the logits and both generations move.

Wiring (the reason this tab feels live on a CPU):

* α ``.input`` (``trigger_mode="always_last"``, no spinner) → ``/next_token``:
  the analysis fast path re-runs only the blocks after the steered layer;
* α ``.release`` → ``/generate`` streamed (one batched decode for both sides),
  then the dose-response chart re-marks α (its sweep is cached per session).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import gradio as gr

from .. import plots
from ..messages import UserError
from ..model.analysis import EXPLOSION_THRESHOLD
from ..model.units import alpha_grid
from ..service import RANDOM, Service
from . import extra_terms, i18n, panel_keys, relabel
from .chat_panel import build_chat_panel
from .common import (EXPLORE, SLIDER, AlphaSlider, OptionalNumberBox, T, from_page, handler, lang_of, picker_choices,
                     sid, table)
from .drawn import Drawn
from .request_guard import optional_trailing
from .url_state import EXTEND, JS_SYNC_URL  # EXTEND: Extend range's factor

DEFAULT_PROMPT = "My favourite thing about the weekend is"
# A generous layer range before the model is known; demo.load narrows it to the loaded model.
MAX_LAYERS = 128
# The steered-token colour saturates at this |Δlogit|; a fixed scale keeps runs comparable.
COLOUR_SCALE = 5.0
# gradio's HighlightedText lays a score's colour over the page at |score| opacity, under dark text: at full opacity
# its red gave 3.95:1 and its purple ~3.1:1 (a browser review), under the 4.5:1 text needs.  These strengths keep
# 4.6:1 or more (the WCAG luminance of each blend with white, against the text's rgb(39, 39, 42)).
STRONGEST_PROMOTED, STRONGEST_SUPPRESSED = 0.85, 0.75
# Each streamed frame is a status message to the page, and gradio 6's page answers every status message by
# refreshing the loading status of every component an event ever wrote (each a search of the component tree):
# a frame per token kept the page's main thread busy while it should follow the slider.  Four frames a second
# still read as live text; the last frame always comes.
FRAME_INTERVAL_S = 0.25


def alpha_slider(top: float, extended: bool = False) -> tuple[float, float]:
    """(end, step) of a slider spanning about ±``top`` (the grid: :func:`steer_ui.model.units.alpha_grid`).

    ``extended`` (*Extend range*): the same slider scaled by EXTEND, end and step alike, so it ends exactly at
    EXTEND × the unextended end (the α-max box's value) with as many positions."""
    end, step = alpha_grid(top)
    if extended:
        return float(f"{end * EXTEND:.12g}"), float(f"{step * EXTEND:.12g}")
    return end, step


ALPHA_MAX_BOUNDS = (0.001, 1e6)  # the α-max box's range, on the page and checked on the server


def alpha_controls(alpha_max, alpha=None, extended: bool = False, set_alpha: bool = False) -> tuple[float, dict]:
    """The α-max box's value and the α slider's update for a range of about ±``alpha_max``.

    The box shows the slider's own (unextended) end, not the calibrated α max it was rounded up from: a box
    saying 0.3122 beside a slider ending at 0.315 claimed a range the slider did not have (issue #52).  ``alpha``
    is clamped into the range when it lies outside; inside, the update leaves the slider's value alone (a page
    load may set α and its range in the same update) unless ``set_alpha``."""
    try:
        top = abs(float(alpha_max))
    except (TypeError, ValueError):
        top = 1.0
    # within the box's own bounds: a vector's stored α range outside them set the box to a value its input check
    # then refused in an unqueued event, a wordless "Error" on the sliders (an audit of the unqueued events)
    top = min(max(top, ALPHA_MAX_BOUNDS[0]), ALPHA_MAX_BOUNDS[1]) if math.isfinite(top) and top > 0 else 1.0
    box, _ = alpha_slider(top)
    end, step = alpha_slider(box, extended)
    update = dict(minimum=-end, maximum=end, step=step)
    if alpha is not None:
        try:
            value = float(alpha)
        except (TypeError, ValueError):
            value = 0.0
        value = value if math.isfinite(value) else 0.0
        if set_alpha or abs(value) > end:
            update["value"] = max(-end, min(end, value))
    return box, gr.update(**update)


def rows_view(extra: str, choices: list, num_layers: int, alpha_max, extended: bool, relative=True,
              seed=0) -> tuple:
    """The added vectors' rows showing ``extra`` (a link's or a saved result's terms, already checked), for
    :attr:`ExploreTab.rows_outputs`: a page opened from a link shows every term it steers with, each with its own
    units and seed (the main row's, ``relative`` and ``seed``, for a term that gave none)."""
    terms = [extra_terms.own_units(t, relative, seed) for t in extra_terms.added(extra)[:extra_terms.EXTRA_ROWS]]
    n, rows = len(terms), extra_terms.EXTRA_ROWS
    groups, vectors, layers, alphas, relatives, seeds = [], [], [], [], [], []
    for i in range(rows):
        term = terms[i] if i < n else None
        groups.append(gr.update(visible=term is not None))
        if term is None:
            vectors.append(gr.update(choices=picker_choices(choices)))
            layers.append(gr.update(maximum=num_layers - 1))
            alphas.append(alpha_controls(alpha_max, 0.0, extended, set_alpha=True)[1])
            relatives.append(gr.skip())
            seeds.append(gr.skip())
            continue
        vectors.append(gr.update(choices=picker_choices(choices), value=RANDOM if term.random else term.source))
        layers.append(gr.update(maximum=num_layers - 1, value=term.layers[0] if term.layers else num_layers // 2))
        alphas.append(alpha_controls(alpha_max, term.scale, extended, set_alpha=True)[1])
        relatives.append(bool(term.normalize))
        seeds.append(int(term.seed))
    return (n, gr.update(visible=n > 0), gr.update(visible=n < rows), *groups, *vectors, *layers, *alphas,
            *relatives, *seeds,
            extra_terms.compose(n, [(RANDOM if t.random else t.source, t.layers[0] if t.layers else 0, t.scale,
                                     t.normalize, t.seed) for t in terms]))


@dataclass
class ExploreTab:
    prompt: gr.Textbox
    vector: gr.Dropdown
    layer: gr.Slider
    vector_seed: gr.Number
    relative: gr.Checkbox
    alpha_max: gr.Number
    alpha: gr.Slider
    readout: gr.Markdown
    bars: gr.Plot
    delta: gr.Plot
    unsteered: gr.Textbox
    steered: gr.HighlightedText
    per_token: gr.Plot
    tokens: gr.Dataframe
    dose: gr.Plot
    sweep_table: gr.Dataframe
    details: gr.JSON
    whole_vocabulary: gr.Checkbox | None = None
    # what each panel group was made from (ui/panel_keys.py): bars + Δlogit + readout, both generations, dose
    bars_key: gr.HTML | None = None
    generations_key: gr.HTML | None = None
    dose_key: gr.HTML | None = None
    link: gr.Textbox | None = None
    # the library (ui/library_ui.py wires them): share the vector, save the view, run a saved view live
    vector_ref: gr.Textbox | None = None  # the share id a link carries for the vector, "" for a bundled one
    prompt_ref: gr.Textbox | None = None  # a long prompt's saved copy, for the link (url_state.prompt_ref)
    extra_ref: gr.Textbox | None = None  # the added rows' vectors' share ids, for the link (url_state.terms_ref)
    extend: gr.Checkbox | None = None  # Extend range: part of the view a link restores
    copy_link: gr.Button | None = None
    share: gr.Button | None = None
    save: gr.Button | None = None
    run_live: gr.Button | None = None
    library_status: gr.Markdown | None = None
    token_detail: gr.Markdown | None = None
    # handlers and their wiring, for the page-load chain in app.py
    next_token_fn: object = None
    generate_fn: object = None
    sweep_fn: object = None
    sampling_inputs: list | None = None
    gen_outputs: list | None = None
    sweep_inputs: list | None = None
    refresh_all: object = None  # refresh_all(event, trigger): every panel after ``event`` (another tab's too)
    rows: extra_terms.Rows | None = None  # the vectors added under the main one (issue #48)

    @property
    def steering_inputs(self) -> list:
        return [self.prompt, self.vector, self.layer, self.alpha, self.relative, self.vector_seed]

    @property
    def next_token_inputs(self) -> list:
        """The steering inputs, the Δlogit chart's scope and the added vectors: what the next-token view is made
        from."""
        return self.steering_inputs + [self.whole_vocabulary, self.rows.extra]

    @property
    def generate_inputs(self) -> list:
        """What both generations are made from: the steering, the sampling and the added vectors."""
        return self.steering_inputs + self.sampling_inputs + [self.rows.extra]

    @property
    def relabelled(self) -> list:
        """What a language switch redraws (ui/relabel.py): the outputs with words in them.  The generated texts,
        the token table and the raw numbers have none, and being an event's output costs the page (app.py's
        JS_TAB_LABELS says why), so a drawing that also wrote them is redrawn without them."""
        return [self.bars_key, self.bars, self.delta, self.readout, self.generations_key, self.per_token,
                self.dose_key, self.dose, self.token_detail, self.library_status]

    @property
    def url_inputs(self) -> list:
        return [self.prompt, self.vector, self.layer, self.alpha, self.relative, self.vector_seed, self.alpha_max,
                self.vector_ref, self.prompt_ref, self.extend, self.rows.extra, self.extra_ref]

    @property
    def rows_outputs(self) -> list:
        """What :func:`rows_view` sets: the rows shown, their buttons, each row's controls, the added terms."""
        rows = self.rows
        return [rows.count, rows.remove, rows.add] + rows.groups + rows.vectors + rows.layers + rows.alphas + \
            rows.relatives + rows.seeds + [rows.extra]


def _plot_labels(lang: str, prefix: str) -> dict:
    return i18n.plot_labels(lang, prefix)


def readout_markdown(lang: str, view) -> str:
    """KL / entropy / max |Δlogit| line, the flag's rule beside its number; token strings shown as text."""
    warn = i18n.message(lang, "readout_warn", threshold=EXPLOSION_THRESHOLD) if view.exploding else ""
    return i18n.message(lang, "readout", kl=view.kl, hu=view.entropy_unsteered, hs=view.entropy_steered,
                        maxd=view.likely_max_abs_delta_logit, token=i18n.plain(repr(view.likely_max_delta_token)),
                        likely=view.likely_tokens, warn=warn, rawd=view.max_abs_delta_logit,
                        rawtoken=i18n.plain(repr(view.max_delta_token)))


def delta_figure(lang: str, view, whole_vocabulary: bool):
    """The Δlogit chart: the likely tokens by default, the whole vocabulary on request."""
    labels = _plot_labels(lang, "delta")
    if whole_vocabulary:
        return plots.delta_logit_bars(view.promoted, view.suppressed, view.max_abs_delta_logit, view.max_delta_token,
                                      labels={**labels, "title": labels["title_vocabulary"]},
                                      exploding=view.exploding, rule=labels["rule_vocabulary"])
    return plots.delta_logit_bars(view.likely_promoted, view.likely_suppressed, view.likely_max_abs_delta_logit,
                                  view.likely_max_delta_token, labels=labels, exploding=view.exploding,
                                  rule=labels["rule"])


def bars_panel(lang: str, made_for: dict, view, whole_vocabulary: bool, moved: tuple | None = None) -> tuple:
    """(made-for element, bars, Δlogit chart, readout) of one next-token view in ``lang``: pure, so a language
    switch redraws them from the same view (ui/relabel.py).  ``moved``: the term that changed since the page's
    previous drawing, (number, vector, layer, α), named above the readout when several vectors steer."""
    key = panel_keys.made_for(lang, "bars", made_for)
    bars_fig = plots.next_token_bars(view.unsteered, view.steered, labels=_plot_labels(lang, "bars"))
    if not extra_terms.any_steering(made_for.get("alpha"), made_for.get("extra")):
        # nothing moved: say so rather than rank arbitrary zero-change tokens
        nothing = i18n.message(lang, "no_steering")
        return key, bars_fig, plots.empty_figure(nothing), nothing
    readout = readout_markdown(lang, view)
    if moved is not None:
        n, vector, layer, alpha = moved
        readout = i18n.message(lang, "readout_moved", term=n, vector=i18n.plain(str(vector)), layer=layer,
                               alpha=f"{alpha:.4g}") + "\n\n" + readout
    return key, bars_fig, delta_figure(lang, view, bool(whole_vocabulary)), readout


def generations_panel(lang: str, made_for: dict, tokens_frame) -> tuple:
    """(made-for element, per-token Δlogit chart) of a finished generation, in ``lang``."""
    fig = (plots.per_token_delta(tokens_frame, labels=_plot_labels(lang, "per_token")) if len(tokens_frame)
           else plots.empty_figure(i18n.message(lang, "no_tokens")))
    return panel_keys.made_for(lang, "generations", made_for), fig


def dose_panel(lang: str, made_for: dict, frame, current_alpha: float) -> tuple:
    """(made-for element, dose-response chart with α marked), in ``lang``."""
    return (panel_keys.made_for(lang, "dose", made_for),
            plots.dose_response(frame, current_alpha=current_alpha, labels=_plot_labels(lang, "dose")))


def shade(delta_logit: float | None) -> float | None:
    """A steered token's colour score for gr.HighlightedText: its Δlogit over :data:`COLOUR_SCALE`, at most the
    strengths dark text stays readable on (None: no Δlogit, no colour)."""
    if delta_logit is None:
        return None
    return max(-STRONGEST_SUPPRESSED, min(STRONGEST_PROMOTED, delta_logit / COLOUR_SCALE))


def highlighted(frame) -> list[tuple[str, float | None]]:
    """Steered tokens with their colour scores (:func:`shade`) for gr.HighlightedText."""
    return [(t.token, shade(t.delta_logit)) for t in frame.steered_tokens]


JS_VECTOR_FOCUSED = "() => { window.__steerVectorMoved = false; }"
JS_VECTOR_MOVED = "() => { window.__steerVectorMoved = true; }"
# the last input: the vector itself when the list's value has not changed since it took the focus (the focus passed
# through), else nothing.  A click on another vector fires two input events: both run, as the second one's chained
# refresh reads the layer the first one set (a skipped second call left the bars at the old layer: the panel walk)
JS_VECTOR_WAS = """
(...args) => {
  args[args.length - 1] = window.__steerVectorMoved === false ? args[1] : '';
  return args;
}
"""


def build_explore_tab(backend: Service, num_layers: int | None = None) -> ExploreTab:
    layers = num_layers or MAX_LAYERS
    # Three blocks laid out by CSS grid (app.py's CSS): on a wide screen the controls (essentials, then the rest)
    # on the left and the outputs on the right, generations first, so both generations are on the first screen;
    # on a phone one column: prompt, vector and α, then the bars, then the rest, so the slider and the bars it
    # moves fit one screen while dragging.
    with gr.Row(elem_id="explore-main"):
        with gr.Column(min_width=300, elem_id="explore-essentials"):
            prompt = gr.Textbox(value=DEFAULT_PROMPT, lines=2, label=T("explore.prompt"), elem_id="explore-prompt")
            vector = gr.Dropdown(choices=picker_choices([RANDOM]), value=RANDOM, allow_custom_value=True,
                                 label=T("explore.vector"), info=T("explore.vector_info"), elem_id="explore-vector")
            alpha = AlphaSlider(-1.0, 1.0, value=0.0, step=0.01, label=T("explore.alpha"), info=T("explore.alpha_info"),
                                elem_id="alpha-slider", elem_classes=extra_terms.ALPHA_CLASS)
            rows = extra_terms.build(layers, (num_layers or 12) // 2)
            with gr.Row():
                generate_btn = gr.Button(T("explore.generate"), variant="primary", elem_id="generate-btn")
                sweep_btn = gr.Button(T("explore.sweep"), elem_id="sweep-btn")
        with gr.Column(min_width=300, elem_id="explore-outputs"):
            generations_key = gr.HTML(elem_id="generations-made-for", elem_classes="made-for-holder")
            with gr.Row(equal_height=True, elem_id="explore-generations"):
                unsteered = gr.Textbox(label=T("explore.unsteered"), lines=5, interactive=False,
                                       elem_id="unsteered-text")
                steered = gr.HighlightedText(label=T("explore.steered"), show_legend=False, combine_adjacent=False,
                                             elem_id="steered-text")
            token_detail = gr.Markdown(T("explore.token_hint"), elem_id="explore-token-detail")
            bars_key = gr.HTML(elem_id="bars-made-for", elem_classes="made-for-holder")
            readout = gr.Markdown(T("explore.readout_empty"), elem_id="explore-readout")
            with gr.Row(elem_id="explore-charts"):
                bars = gr.Plot(label=T("explore.bars"), elem_id="next-token-bars")
                with gr.Column():
                    delta = gr.Plot(label=T("explore.delta"), elem_id="delta-logit")
                    whole_vocabulary = gr.Checkbox(value=False, label=T("explore.whole_vocabulary"),
                                                   elem_id="delta-whole-vocabulary")
        with gr.Column(min_width=300, elem_id="explore-controls"):
            with gr.Row():
                layer = gr.Slider(0, layers - 1, value=(num_layers or 12) // 2, step=1, label=T("explore.layer"),
                                  elem_id="explore-layer")
                vector_seed = gr.Number(value=0, precision=0, minimum=0, label=T("explore.random_seed"), min_width=90,
                                      elem_id="explore-vector-seed")
            with gr.Row():
                relative = gr.Checkbox(value=True, label=T("explore.relative"), info=T("explore.relative_info"),
                                   elem_id="explore-relative")
                alpha_max = gr.Number(value=1.0, minimum=ALPHA_MAX_BOUNDS[0], maximum=ALPHA_MAX_BOUNDS[1], label=T("explore.alpha_max"), min_width=90,
                                      info=T("explore.alpha_max_info"), elem_id="explore-alpha-max")
            with gr.Row():
                extend = gr.Checkbox(value=False, label=T("explore.extend"), info=T("explore.extend_info"),
                                     elem_id="alpha-extend")
                copy_link = gr.Button(T("explore.copy_link"), size="sm", elem_id="copy-link")
                share = gr.Button(T("explore.share"), size="sm", elem_id="share-btn")
                save = gr.Button(T("explore.save_result"), size="sm", elem_id="save-result-btn")
            run_live = gr.Button(T("explore.run_live"), size="sm", elem_id="run-live-btn", visible=False)
            library_status = gr.Markdown(elem_id="explore-library-status")
            vector_ref = gr.Textbox(visible=False, elem_id="explore-vector-ref")
            prompt_ref = gr.Textbox(visible=False, elem_id="explore-prompt-ref")
            # url_state.terms_ref; like the added vectors' text, a call written before it may leave it off
            extra_ref = optional_trailing(gr.Textbox(visible=False, elem_id="explore-extra-ref"))
            # the vector, when the list's value did not change while it had the focus (JS_VECTOR_WAS), else empty
            vector_was = optional_trailing(gr.Textbox(visible=False, elem_id="explore-vector-was"))
            link = gr.Textbox(label=T("explore.link"), interactive=False, max_lines=1, elem_id="explore-link",
                              visible=False)
            with gr.Accordion(T("explore.sampling"), open=False, elem_id="explore-sampling"):
                greedy = gr.Checkbox(value=True, label=T("explore.greedy"), elem_id="explore-greedy")
                with gr.Row():
                    temperature = gr.Slider(0.05, 2.0, value=0.8, step=0.05, label=T("explore.temperature"),
                                            elem_id="explore-temperature")
                    top_k = gr.Number(value=0, precision=0, minimum=0, label=T("explore.top_k"), elem_id="explore-top-k")
                with gr.Row():
                    top_p = gr.Slider(0.05, 1.0, value=1.0, step=0.05, label=T("explore.top_p"), elem_id="explore-top-p")
                    repetition = gr.Slider(1.0, 2.0, value=1.0, step=0.05, label=T("explore.repetition"),
                                           elem_id="explore-repetition")
                with gr.Row():
                    max_tokens = gr.Slider(1, 256, value=32, step=1, label=T("explore.max_tokens"),
                                           elem_id="explore-max-tokens")
                    seed = gr.Number(value=0, precision=0, minimum=0, label=T("explore.seed"), elem_id="explore-seed")
                # a text box, not a gr.Number: a Number shows an empty value as 0 and sends 0 (= off) after the
                # first edit anywhere, while empty means "the vector's own bound" (the walk test caught it)
                delta_limit = OptionalNumberBox(value="", label=T("explore.delta_limit"), max_lines=1,
                                                info=T("explore.delta_limit_info"), elem_id="delta-limit")
            target = gr.Textbox(label=T("explore.target"), info=T("explore.target_info"), max_lines=1,
                                elem_id="explore-target")
    with gr.Row():
        per_token = gr.Plot(label=T("explore.per_token"), elem_id="per-token-delta")
        with gr.Column():
            dose_key = gr.HTML(elem_id="dose-made-for", elem_classes="made-for-holder")
            dose = gr.Plot(label=T("explore.dose"), elem_id="dose-response")
    with gr.Accordion(T("explore.raw"), open=False):
        tokens = gr.Dataframe(label=T("explore.tokens"), interactive=False, wrap=True, elem_id="token-table",
                              headers=["position", "token", "logprob", "delta_logit", "direct_delta_logit"])
        # the dose-response's numbers apart from the tokens': one table for both showed whichever event wrote last,
        # and the page load's sweep, queued behind a Generate clicked early, then hid that generation's tokens
        sweep_table = gr.Dataframe(label=T("explore.sweep_table"), interactive=False, wrap=True,
                                   elem_id="sweep-table", headers=["alpha", "raw_alpha", "kl", "entropy", "top1_token",
                                                                   "top1_token_id", "top1_prob", "max_abs_delta_logit"])
        details = gr.JSON(label=T("explore.details"))

    tab = ExploreTab(prompt=prompt, vector=vector, layer=layer, vector_seed=vector_seed, relative=relative,
                     alpha_max=alpha_max, alpha=alpha, readout=readout, bars=bars, delta=delta, unsteered=unsteered,
                     steered=steered, per_token=per_token, tokens=tokens, dose=dose, sweep_table=sweep_table,
                     details=details, link=link,
                     whole_vocabulary=whole_vocabulary, vector_ref=vector_ref, prompt_ref=prompt_ref,
                     extra_ref=extra_ref, copy_link=copy_link, share=share, save=save,
                     run_live=run_live, library_status=library_status, bars_key=bars_key,
                     generations_key=generations_key, dose_key=dose_key, token_detail=token_detail,
                     extend=extend, rows=rows)

    # ---------------------------------------------------------------- handlers
    drawn = Drawn()

    @handler(backend)
    def next_token(prompt, vector, layer, alpha, relative, vector_seed, whole_vocabulary=False, extra="",
                   request: gr.Request = None):
        session = sid(request)
        lang = lang_of(backend, request)
        key = panel_keys.made_for(lang, "bars", locals())
        # the model is part of what the page shows (an administrator may switch it)
        drawing = f"{id(backend.handle)} {key}" if backend.model_ready else None
        page = session if drawing is not None and from_page(request) else None
        if page and drawn.shown(page, "bars", drawing):
            return (gr.skip(),) * len(nt_outputs)  # the page shows these numbers or is about to: no redraw
        token = drawn.start(page, "bars", drawing)
        try:
            answer = _next_token_view(session, panel_keys.key_of("bars", locals()), prompt, vector, layer, alpha,
                                      relative, vector_seed, whole_vocabulary, extra)
        except BaseException:
            drawn.finish(page, "bars", drawing, token, ok=False)
            raise
        drawn.finish(page, "bars", drawing, token, ok=True)
        return answer

    def _next_token_view(session, made_for, prompt, vector, layer, alpha, relative, vector_seed, whole_vocabulary,
                         extra=""):
        spec = extra_terms.full_spec(vector, layer, alpha, relative, vector_seed, extra)
        if spec is None:  # one vector: today's path
            view = backend.next_token(session, prompt, vector, layer, alpha, relative, vector_seed)
            moved = None
        else:
            view = backend.next_token_for(session, prompt, spec)
            # the readout names the term that moved since this session's previous drawing (any trigger: a drag of
            # one row's α, its vector or layer)
            terms = extra_terms.terms_of(vector, layer, alpha, extra)
            cache = backend.session(session).cache
            n = extra_terms.moved(cache.get("bars_terms"), terms)
            cache["bars_terms"] = terms
            moved = None if n is None else (n,) + terms[n - 1]
        return relabel.keep(backend, session, [bars_key, bars, delta, readout], bars_panel, made_for, view,
                            bool(whole_vocabulary), moved) + (view.as_dict(),)

    @handler(backend)
    def generate(prompt, vector, layer, alpha, relative, vector_seed, greedy, temperature, top_k, top_p, repetition,
                 max_tokens, seed, delta_limit=None, extra="", request: gr.Request = None):
        session = sid(request)
        lang = lang_of(backend, request)
        key = panel_keys.made_for(lang, "generations", locals())
        made_for = panel_keys.key_of("generations", locals())
        sampling = backend.sampling(max_new_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                                    repetition_penalty=repetition, seed=seed, greedy=greedy,
                                    max_delta_logit=backend.delta_limit(session, vector, delta_limit))
        shown = time.monotonic()
        spec = extra_terms.full_spec(vector, layer, alpha, relative, vector_seed, extra)
        # supersede: this page's newest settings cancel its older generations still running (they write the
        # same panels, and one that ended last overwrote the newest's)
        frames = backend.stream_generate(session, prompt, vector, layer, alpha, relative, vector_seed, sampling,
                                         supersede=True) \
            if spec is None else backend.stream_generate_for(
                session, prompt, spec, sampling, {"vector": vector or RANDOM, "layer": layer, "alpha": alpha,
                                                  "relative": relative, "seed": vector_seed, "extra": extra},
                supersede=True)
        ended = False
        for frame in frames:
            if not frame.done:
                if time.monotonic() - shown < FRAME_INTERVAL_S:
                    continue  # the next frame carries this one's tokens too
                shown = time.monotonic()
                yield key, frame.unsteered_text, highlighted(frame), gr.skip(), gr.skip(), gr.skip()
                continue
            ended = True
            tokens_frame = frame.token_frame()
            key, fig = relabel.keep(backend, session, [generations_key, per_token], generations_panel, made_for,
                                    tokens_frame)
            yield key, frame.unsteered_text, highlighted(frame), fig, table(tokens_frame), frame.as_dict()
        if not ended and not from_page(request):
            # a newer generation of this session cancelled this one: the page shows the newer one, while an API
            # caller would otherwise take the last partial frame for a whole answer
            raise UserError("generation_superseded")

    def _sweep_key(prompt, vector, layer, relative, vector_seed, alpha_max, target, extended, extra=""):
        """The cached dose-response's key; None for inputs that are not numbers where numbers go (an emptied box):
        no cached curve answers them, and the sweep they lead to refuses them by name."""
        try:
            return (prompt, vector, int(layer), bool(relative), int(vector_seed or 0), float(alpha_max),
                    target or "", bool(extended), extra or "")
        except (TypeError, ValueError, OverflowError):
            return None

    @handler(backend)
    def sweep(prompt, vector, layer, alpha, relative, vector_seed, alpha_max, target, extended=False, extra="",
              request: gr.Request = None):
        """The dose-response over the slider's whole range (the extended one when *Extend range* is on): the main
        vector swept, the added ones held at their α."""
        session = sid(request)
        made_for = panel_keys.key_of("dose", locals())
        top = backend.checked_alpha(alpha_max, "alpha_max") * (EXTEND if extended else 1.0)
        frame = backend.sweep(session, prompt, vector, layer, top, relative, vector_seed, target=target or None,
                              held=extra_terms.held(relative, vector_seed, extra))
        backend.session(session).cache["sweep"] = (_sweep_key(prompt, vector, layer, relative, vector_seed,
                                                              alpha_max, target, extended, extra), frame)
        return relabel.keep(backend, session, [dose_key, dose], dose_panel, made_for, frame,
                            backend.checked_alpha(alpha)) + (table(frame),)

    @handler(backend)
    def mark_alpha(prompt, vector, layer, alpha, relative, vector_seed, alpha_max, target, extended=False, extra="",
                   request: gr.Request = None):
        """Re-mark α on the cached dose-response; recompute only when the inputs changed."""
        cached = backend.session(sid(request)).cache.get("sweep")
        key = _sweep_key(prompt, vector, layer, relative, vector_seed, alpha_max, target, extended, extra)
        if cached is None or key is None or cached[0] != key:
            return sweep(prompt, vector, layer, alpha, relative, vector_seed, alpha_max, target, extended, extra,
                         request=request)[:2]
        return relabel.keep(backend, sid(request), [dose_key, dose], dose_panel, panel_keys.key_of("dose", locals()),
                            cached[1], backend.checked_alpha(alpha))

    @handler(backend)
    def alpha_range(alpha, alpha_max, extended):
        """The slider spans ±α max (the calibrated strong-but-fluent point); "extend" shows 5× that."""
        return alpha_controls(alpha_max, alpha, bool(extended))[1]

    @handler(backend)
    def snap_alpha_max(alpha_max):
        """A typed α max, once the box is left: shown as the slider's end it became (while typing, the box is
        left as typed; a "0" on the way to "0.5" must not turn into 1)."""
        box = alpha_controls(alpha_max)[0]
        return gr.skip() if alpha_max is not None and float(alpha_max) == box else box

    @handler(backend)
    def pick_vector(prompt, vector, layer, vector_seed, alpha, extended, vector_was="", request: gr.Request = None):
        """Move the layer slider to the vector's own layer and α max to where its KL reaches ~5 nats there; the α
        slider's range (and α, clamped into it) comes in the same answer, so the panels' refresh chained after
        this reads the α they will show (the bars were drawn for the old α, then clamped, and stayed stale).
        ``vector_was``: the vector when the list's value did not change since it took the focus: nothing to do."""
        if vector_was and vector_was == vector:  # the focus passed through the list
            return (gr.skip(),) * 5
        info = backend.vector_info(sid(request), vector)
        layers_ = info.get("layers") or [layer]
        new_layer = layer if vector == RANDOM else layers_[0]
        top = backend.calibrated_alpha_max(sid(request), prompt, vector, new_layer, vector_seed)
        box, slider = alpha_controls(top, alpha, bool(extended))
        return gr.update(value=new_layer), box, gr.update(value=True), backend.share_id_of(sid(request), vector), \
            slider

    @handler(backend)
    def recalibrate(prompt, vector, layer, vector_seed, relative, alpha_max, alpha, extended, request: gr.Request):
        """After a layer change the same α means a different push: re-measure α max (relative units only), with
        the slider's range in the same answer, before the panels' refresh (as pick_vector)."""
        if not relative:
            return gr.skip(), gr.skip()
        top = backend.calibrated_alpha_max(sid(request), prompt, vector, layer, vector_seed)
        return alpha_controls(top, alpha, bool(extended))

    @handler(backend)
    def token_details(evt: gr.SelectData, request: gr.Request):
        generation = backend.session(sid(request)).last_generation
        if not generation or evt.index is None:
            return gr.skip()
        index = evt.index if isinstance(evt.index, int) else evt.index[0]
        steered_tokens = generation["steered"]["tokens"]
        if not 0 <= index < len(steered_tokens):
            return gr.skip()
        t = steered_tokens[index]
        # token strings go into Markdown: shown as text, or '<pad>' would be swallowed as an HTML tag
        alternatives = ", ".join(f"{a['token']!r} {a['prob']:.3f}" for a in t["alternatives"])
        return relabel.keep(backend, sid(request), [token_detail], *relabel.text(
            "token_detail", True, token=repr(t["token"]), logprob=t["logprob"], delta=t.get("delta_logit") or 0.0,
            direct=t.get("direct_delta_logit") or 0.0, alts=alternatives))

    # ------------------------------------------------------------------ events
    steering_inputs = tab.steering_inputs
    nt_outputs = [bars_key, bars, delta, readout, details]
    nt_inputs = tab.next_token_inputs
    sampling_inputs = [greedy, temperature, top_k, top_p, repetition, max_tokens, seed, delta_limit]
    tab.sampling_inputs = sampling_inputs
    gen_inputs = tab.generate_inputs
    gen_outputs = [generations_key, unsteered, steered, per_token, tokens, details]
    sweep_inputs = steering_inputs + [alpha_max, target, extend, rows.extra]

    alpha.input(next_token, nt_inputs, nt_outputs, api_name="next_token", trigger_mode="always_last",
                show_progress="hidden", **SLIDER)
    alpha.release(generate, gen_inputs, gen_outputs, api_name="generate_on_release",
                  api_visibility="undocumented", trigger_mode="always_last", show_progress="hidden", **EXPLORE) \
        .then(mark_alpha, sweep_inputs, [dose_key, dose], api_name="mark_alpha", api_visibility="undocumented",
              show_progress="hidden", **EXPLORE)
    generate_btn.click(generate, gen_inputs, gen_outputs, api_name="generate", **EXPLORE)
    # every panel shows the controls' settings: Generate also redraws the bars and readout for the prompt typed
    generate_btn.click(next_token, nt_inputs, nt_outputs, api_name="next_token_on_generate",
                       api_visibility="undocumented", show_progress="hidden", **SLIDER)
    # a typed α fires release on leaving the box but no input event: the bars follow it here
    alpha.release(next_token, nt_inputs, nt_outputs, api_name="next_token_on_release", api_visibility="undocumented",
                  trigger_mode="always_last", show_progress="hidden", **SLIDER)
    sweep_btn.click(sweep, sweep_inputs, [dose_key, dose, sweep_table], api_name="sweep", **EXPLORE)
    prompt.submit(next_token, nt_inputs, nt_outputs, api_name="next_token_on_submit",
                  api_visibility="undocumented", **SLIDER) \
        .then(generate, gen_inputs, gen_outputs, api_name="generate_on_submit",
              api_visibility="undocumented", **EXPLORE)
    # layer: on release only (pick_vector moves it programmatically and refreshes by itself)
    def refresh_all(event, trigger: str) -> None:
        """After ``event``: the bars, both generations and the dose-response, each for the controls as they now
        are (a new vector, layer or range changes every panel, not only the one next to the control)."""
        event.then(next_token, nt_inputs, nt_outputs, api_name=f"next_token_on_{trigger}",
                   api_visibility="undocumented", show_progress="hidden", **SLIDER) \
            .then(generate, gen_inputs, gen_outputs, api_name=f"generate_on_{trigger}",
                  api_visibility="undocumented", show_progress="hidden", **EXPLORE) \
            .then(mark_alpha, sweep_inputs, [dose_key, dose], api_name=f"mark_alpha_on_{trigger}",
                  api_visibility="undocumented", show_progress="hidden", **EXPLORE)

    # a new layer: α max re-measured there first (relative units), then every panel for the layer, α max and α
    # as they then are (recalibrating beside the refresh let α max and α move under panels just drawn)
    refresh_all(layer.release(recalibrate, [prompt, vector, layer, vector_seed, relative, alpha_max, alpha, extend],
                              [alpha_max, alpha], api_name="recalibrate", api_visibility="undocumented",
                              trigger_mode="always_last", show_progress="hidden", **EXPLORE), "layer")
    for control in (vector_seed, relative, whole_vocabulary):
        control.input(next_token, nt_inputs, nt_outputs, api_name=f"next_token_on_{_name(control, tab)}",
                      api_visibility="undocumented", trigger_mode="always_last", show_progress="hidden", **SLIDER)
    alpha_max.change(alpha_range, [alpha, alpha_max, extend], [alpha], api_name="alpha_range_alpha_max",
                     api_visibility="undocumented", queue=False)
    for leave, how in ((alpha_max.blur, "blur"), (alpha_max.submit, "submit")):
        leave(snap_alpha_max, [alpha_max], [alpha_max], api_name=f"snap_alpha_max_on_{how}",
              api_visibility="undocumented", queue=False)
    # a person toggling Extend range: α may be clamped, and every α-dependent panel follows the new range
    refresh_all(extend.input(alpha_range, [alpha, alpha_max, extend], [alpha], api_name="alpha_range_extend",
                             api_visibility="undocumented", queue=False), "extend")
    # gradio's dropdown fires its input event when the focus merely passes through it: the page tells the handler
    # when the list's value has not changed since it took the focus, and then nothing is re-calibrated (a browser
    # review saw α max move from 0.335 to 0.37 as a keyboard user tabbed past the list)
    vector.focus(None, None, None, js=JS_VECTOR_FOCUSED, queue=False)
    vector.change(None, None, None, js=JS_VECTOR_MOVED, queue=False)
    refresh_all(vector.input(pick_vector, [prompt, vector, layer, vector_seed, alpha, extend, vector_was],
                             [layer, alpha_max, relative, vector_ref, alpha], js=JS_VECTOR_WAS,
                             api_name="pick_vector", api_visibility="undocumented", **EXPLORE), "vector")
    # the page URL follows the controls (in the browser only), and "Copy link" copies it
    for control in (prompt, vector, layer, alpha, relative, vector_seed, alpha_max, vector_ref, prompt_ref, extend,
                    rows.extra, extra_ref):
        control.change(None, tab.url_inputs, None, js=JS_SYNC_URL, queue=False)
    # every panel keeps its word: on any change of a control, the page marks each panel made for other settings
    controls = [prompt, vector, layer, alpha, relative, vector_seed, whole_vocabulary] + sampling_inputs + [
        alpha_max, target, extend, rows.extra]
    assert len(controls) == len(panel_keys.CONTROLS)
    panel_keys.watch("explore", dict(zip(panel_keys.CONTROLS, controls)))
    _wire_rows(backend, tab, next_token, nt_outputs, (generate, gen_outputs),
               (mark_alpha, sweep_inputs[:-1], [dose_key, dose]))
    tab.next_token_fn, tab.generate_fn, tab.sweep_fn = next_token, generate, sweep
    tab.refresh_all = refresh_all
    tab.sampling_inputs, tab.gen_outputs, tab.sweep_inputs = sampling_inputs, gen_outputs, sweep_inputs
    steered.select(token_details, None, [token_detail], api_name="token_details", api_visibility="undocumented")
    tab.chat = build_chat_panel(backend, tab)  # Completion or Chat (ui/chat_panel.py)
    return tab


def _terms(count, *values) -> str:
    """The added terms' text from the rows' values as the handlers receive them (five a row, three rows)."""
    return extra_terms.compose(count, [values[i:i + 5] for i in range(0, len(values), 5)])


def _wire_rows(backend: Service, tab: ExploreTab, next_token, nt_outputs: list, generation: tuple,
               dose: tuple) -> None:
    """The added vectors' rows (ui/extra_terms.py): Add and Remove show and hide them; each row's α drives the
    next-token view as the main α does (its release, both generations and the dose-response), and a row's vector
    or layer every panel.  A row's values reach the handlers as one text (``extra``), written from the rows by
    ``compose`` (or by ``next_token_rows`` during a drag), where the page's α of an added row is held to its
    slider's range, as the main α is by ``handler``."""
    rows = tab.rows

    assert len(rows.groups) == 3 == extra_terms.EXTRA_ROWS  # the handlers below name three rows' values
    # gradio hands gr.Request only to a named parameter (never after *args), so each row's values are named

    @handler(backend)
    def compose(count, vector_2, layer_2, alpha_2, relative_2, seed_2, vector_3, layer_3, alpha_3, relative_3, seed_3,
                vector_4, layer_4, alpha_4, relative_4, seed_4, request: gr.Request = None):
        return _terms(count, vector_2, layer_2, alpha_2, relative_2, seed_2, vector_3, layer_3, alpha_3, relative_3,
                      seed_3, vector_4, layer_4, alpha_4, relative_4, seed_4)

    @handler(backend)
    def next_token_rows(prompt, vector, layer, alpha, relative, vector_seed, whole_vocabulary, count, vector_2,
                        layer_2, alpha_2, relative_2, seed_2, vector_3, layer_3, alpha_3, relative_3, seed_3,
                        vector_4, layer_4, alpha_4, relative_4, seed_4, request: gr.Request = None):
        """A drag of a row's α: the added terms and the next-token view for them in one answer, as the main α's
        drag is one event (composing first and drawing in a chained event let an older drawing land last)."""
        extra = _terms(count, vector_2, layer_2, alpha_2, relative_2, seed_2, vector_3, layer_3, alpha_3,
                       relative_3, seed_3, vector_4, layer_4, alpha_4, relative_4, seed_4)
        drawn_ = next_token(prompt, vector, layer, alpha, relative, vector_seed, whole_vocabulary, extra,
                            request=request)
        return tuple(drawn_) + (extra,) if isinstance(drawn_, tuple) else drawn_

    generate, gen_outputs = generation
    mark_alpha, dose_inputs, dose_outputs = dose

    # After a row's control (its α released, its vector, layer, units or seed, Add, Remove), every panel takes the
    # added terms from the rows' own values, as the drag's next_token_rows does, not from ``rows.extra``: a drag's
    # answer for an earlier α can land between the compose and a panel's start and write its terms there (then
    # the next drag answer writes the last α's again), and that panel was made for the earlier α and left stale
    # for good (tests/browser/test_several_vectors_browser.py failed so, 1 run in 3 on an Intel Xeon).
    @handler(backend)
    def generate_rows(prompt, vector, layer, alpha, relative, vector_seed, greedy, temperature, top_k, top_p,
                      repetition, max_tokens, seed, delta_limit, count, vector_2, layer_2, alpha_2, relative_2, seed_2,
                      vector_3, layer_3, alpha_3, relative_3, seed_3, vector_4, layer_4, alpha_4, relative_4, seed_4,
                      request: gr.Request = None):
        extra = _terms(count, vector_2, layer_2, alpha_2, relative_2, seed_2, vector_3, layer_3, alpha_3,
                       relative_3, seed_3, vector_4, layer_4, alpha_4, relative_4, seed_4)
        yield from generate(prompt, vector, layer, alpha, relative, vector_seed, greedy, temperature, top_k, top_p,
                            repetition, max_tokens, seed, delta_limit, extra, request=request)

    @handler(backend)
    def mark_alpha_rows(prompt, vector, layer, alpha, relative, vector_seed, alpha_max, target, extended, count,
                        vector_2, layer_2, alpha_2, relative_2, seed_2, vector_3, layer_3, alpha_3, relative_3, seed_3,
                        vector_4, layer_4, alpha_4, relative_4, seed_4, request: gr.Request = None):
        extra = _terms(count, vector_2, layer_2, alpha_2, relative_2, seed_2, vector_3, layer_3, alpha_3,
                       relative_3, seed_3, vector_4, layer_4, alpha_4, relative_4, seed_4)
        return mark_alpha(prompt, vector, layer, alpha, relative, vector_seed, alpha_max, target, extended, extra,
                          request=request)

    def refresh_rows(event, trigger: str) -> None:
        """After ``event``: the bars, both generations and the dose-response, each for the rows as they now are."""
        event.then(next_token_rows, tab.next_token_inputs[:-1] + rows.inputs, nt_outputs + [rows.extra],
                   api_name=f"next_token_on_{trigger}", api_visibility="undocumented", show_progress="hidden",
                   **SLIDER) \
            .then(generate_rows, tab.steering_inputs + tab.sampling_inputs + rows.inputs, gen_outputs,
                  api_name=f"generate_on_{trigger}", api_visibility="undocumented", show_progress="hidden",
                  **EXPLORE) \
            .then(mark_alpha_rows, dose_inputs + rows.inputs, dose_outputs, api_name=f"mark_alpha_on_{trigger}",
                  api_visibility="undocumented", show_progress="hidden", **EXPLORE)

    @handler(backend)
    def add_row(count, layer, alpha_max, extended, relative, vector_seed, request: gr.Request = None):
        """Show the next row: any vector of the session's list, at the main layer, α = 0 on the main range, in
        the main row's units and seed (each row's own from then on)."""
        n = extra_terms.shown(count)
        if n >= extra_terms.EXTRA_ROWS:
            return (gr.skip(),) * (3 + 6 * extra_terms.EXTRA_ROWS)
        top = backend.handle.arch.num_layers - 1 if backend.model_ready else None
        slider = alpha_controls(alpha_max, 0.0, bool(extended), set_alpha=True)[1]
        row = [gr.skip()] * (6 * extra_terms.EXTRA_ROWS)
        row[n::extra_terms.EXTRA_ROWS] = [gr.update(visible=True),
                                          gr.update(choices=picker_choices(backend.vector_names(sid(request))),
                                                    value=RANDOM),
                                          gr.update(value=layer) if top is None else gr.update(maximum=top, value=layer),
                                          slider, bool(relative), extra_terms.seed_of(vector_seed)]
        return (n + 1, gr.update(visible=True), gr.update(visible=n + 1 < extra_terms.EXTRA_ROWS)) + tuple(row)

    @handler(backend)
    def remove_row(count):
        n = extra_terms.shown(count)
        if n == 0:
            return (gr.skip(),) * (3 + extra_terms.EXTRA_ROWS)
        hidden = [gr.skip()] * extra_terms.EXTRA_ROWS
        hidden[n - 1] = gr.update(visible=False)
        return (n - 1, gr.update(visible=n - 1 > 0), gr.update(visible=True)) + tuple(hidden)

    @handler(backend)
    def rows_range(alpha_max, extended, count, vector_2, layer_2, alpha_2, relative_2, seed_2, vector_3, layer_3,
                   alpha_3, relative_3, seed_3, vector_4, layer_4, alpha_4, relative_4, seed_4):
        """The rows' α sliders span the main one's range (α clamped into it, as the main α is); the added terms are
        written again only when an α was clamped.  A page load sets the range and the rows together, and the
        range's change can read the rows as they were before it (a stranger's saved result lost its added row to a
        recompose from the empty rows), so an unclamped range leaves ``extra`` as the load wrote it."""
        rows_ = [[vector_2, layer_2, alpha_2, relative_2, seed_2], [vector_3, layer_3, alpha_3, relative_3, seed_3],
                 [vector_4, layer_4, alpha_4, relative_4, seed_4]]
        updates = [alpha_controls(alpha_max, row[2], bool(extended))[1] for row in rows_]
        clamped = False
        for row, update in zip(rows_, updates):
            if "value" in update:
                row[2], clamped = update["value"], True
        return tuple(updates) + (extra_terms.compose(count, rows_) if clamped else gr.skip(),)

    shown_rows = [rows.count, rows.remove, rows.add]
    per_row = rows.groups + rows.vectors + rows.layers + rows.alphas + rows.relatives + rows.seeds

    def then_compose(event, trigger: str, **kwargs):
        return event.then(compose, rows.inputs, [rows.extra], api_name=f"compose_on_{trigger}",
                          api_visibility="undocumented", queue=False, show_progress="hidden", **kwargs)

    refresh_rows(then_compose(rows.add.click(add_row, [rows.count, tab.layer, tab.alpha_max, tab.extend,
                                                      tab.relative, tab.vector_seed],
                                            shown_rows + per_row, api_name="add_vector", queue=False),
                             "add"), "add_vector")
    refresh_rows(then_compose(rows.remove.click(remove_row, [rows.count], shown_rows + rows.groups,
                                               api_name="remove_vector", queue=False), "remove"), "remove_vector")
    for n, (vector, layer, alpha, relative, seed) in enumerate(zip(rows.vectors, rows.layers, rows.alphas,
                                                                  rows.relatives, rows.seeds), start=2):
        for own, what in ((relative, "relative"), (seed, "seed")):  # a row's units or seed: every panel
            refresh_rows(own.input(compose, rows.inputs, [rows.extra], api_name=f"compose_{what}_{n}",
                                  api_visibility="undocumented", trigger_mode="always_last", queue=False),
                        f"{what}_{n}")
        alpha.input(next_token_rows, tab.next_token_inputs[:-1] + rows.inputs, nt_outputs + [rows.extra],
                    api_name=f"next_token_on_alpha_{n}", api_visibility="undocumented", trigger_mode="always_last",
                    show_progress="hidden", **SLIDER)
        refresh_rows(alpha.release(compose, rows.inputs, [rows.extra], api_name=f"compose_release_{n}",
                                   api_visibility="undocumented", trigger_mode="always_last", queue=False,
                                   show_progress="hidden"), f"release_{n}")
        refresh_rows(vector.input(compose, rows.inputs, [rows.extra], api_name=f"compose_vector_{n}",
                                 api_visibility="undocumented", queue=False), f"vector_{n}")
        refresh_rows(layer.release(compose, rows.inputs, [rows.extra], api_name=f"compose_layer_{n}",
                                  api_visibility="undocumented", trigger_mode="always_last", queue=False,
                                  show_progress="hidden"), f"layer_{n}")
    # α max and Extend range move every α slider's range; a clamped row α changes the added terms
    for change, how in ((tab.alpha_max.change, "alpha_max"), (tab.extend.input, "extend")):
        change(rows_range, [tab.alpha_max, tab.extend] + rows.inputs, rows.alphas + [rows.extra],
               api_name=f"rows_range_{how}", api_visibility="undocumented", queue=False)


def _name(component, tab: ExploreTab) -> str:
    for field_name, value in vars(tab).items():
        if value is component:
            return field_name
    return "control"
