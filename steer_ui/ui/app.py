"""Assemble the tabs into one gr.Blocks and wire what crosses tabs (vector lists, model reloads, language)."""
from __future__ import annotations

import copy
import functools
import inspect
import json
import logging

import gradio as gr

from ..service import RANDOM, Service
from .. import guards
from ..policy import Policy
from . import alpha_box, fair_queue, i18n, library_ui, panel_keys, relabel, request_guard
from .common import EXPLORE, MODEL, SLIDER, T, as_gr_error, handler, picker_choices, sid
from .data_tab import build_data_tab
from .detect_tab import build_detect_tab
from .compare_tab import build_compare_tab, wire_open_in_explore
from .explore_tab import DEFAULT_PROMPT, alpha_controls, build_explore_tab, rows_view
from .export_tab import build_export_tab, follow_explore
from .model_tab import build_model_tab, model_view, status_markdown
from .train_tab import build_train_tab
from .url_state import ExploreState, fall_back, from_query, terms_ref

log = logging.getLogger("steer_ui.ui")

# Text at WCAG AA contrast on the light theme (issue #36: help text was rgb(187,187,194) on white, 1.9:1; white on
# the orange buttons 2.8:1; the JSON viewer's colours 2-3:1).  tests/browser/contrast_kit.py measures it.
CSS = """
body:not(.dark) .gradio-container {
  --block-info-text-color: #5b5b66; --body-text-color-subdued: #5b5b66;
  --color-accent: #c2410c; --button-primary-background-fill: #c2410c; --button-primary-background-fill-hover: #9a3412;
  --button-primary-border-color: #c2410c;
  /* Cancel drawn in red outline, tinted under the pointer: a solid red button beside every idle job read as an
     alarm (a browser review); gradio's hover changes the fill only, so the text stays red on both */
  --button-cancel-background-fill: #ffffff; --button-cancel-text-color: #b91c1c;
  --button-cancel-background-fill-hover: #fee2e2; --button-cancel-border-color: #b91c1c;
}
body:not(.dark) .gradio-container button.stop { border-width: 1px; }  /* the theme draws buttons without one */
body:not(.dark) .gradio-container span.key { color: #8a3a0c; }
body:not(.dark) .gradio-container span.value { color: #7c2d12; }
body:not(.dark) .gradio-container span.value.number { color: #1e5468; }
body:not(.dark) .gradio-container span.punctuation { color: #3f5050; }
#alpha-slider input[type=range] { accent-color: #c2410c; }
/* a slider reached by Tab shows where the keyboard is (gradio's theme draws no focus ring on a range input) */
.gradio-container input[type=range]:focus-visible { outline: 3px solid #c2410c !important; outline-offset: 3px; }
#alpha-refusal, .alpha-box-refusal { margin-top: 6px; font-size: 14px; color: #991b1b; }
/* Explore (issue #36): controls left, outputs right with the generations first on a wide screen; one column on a
   phone with prompt, vector and α, then the outputs with the bars first, then the other controls */
#explore-main { display: grid !important; grid-template-columns: minmax(300px, 1fr) minmax(0, 2fr);
                grid-template-rows: auto 1fr; gap: var(--layout-gap); align-items: start; }
#explore-essentials { grid-column: 1; grid-row: 1; }
#explore-controls { grid-column: 1; grid-row: 2; }
#explore-outputs { grid-column: 2; grid-row: 1 / span 2; }
@media (max-width: 760px) {
  #explore-main { grid-template-columns: minmax(0, 1fr); }
  #explore-essentials, #explore-controls, #explore-outputs { grid-column: 1; }
  #explore-essentials { grid-row: 1; } #explore-outputs { grid-row: 2; } #explore-controls { grid-row: 3; }
  #explore-outputs { display: flex; flex-direction: column; }
  #explore-charts { order: -2; } #explore-readout { order: -1; }
}
#explore-readout { min-height: 2.5em; }
/* gradio hides a slider's end labels at 480 px and below; on a phone the α slider's ends are its range (a review) */
@media (max-width: 480px) { .steer-alpha .min_value, .steer-alpha .max_value { display: inline !important; } }
.steer-header { align-items: center; }
/* a phone's first screen is for the prompt, α and the bars (issue #52: title, help and model line took 60 % of
   it): a smaller title, the help in small print, the language choice without its box label */
@media (max-width: 760px) {
  #app-title h1 { font-size: 1.35rem; margin: 0; }
  #app-subtitle p { font-size: 0.8rem; line-height: 1.3; margin: 0; }
  #lang-switch { padding: 0 !important; border: none !important; background: none !important; }
  #lang-switch > span[data-testid="block-info"], #lang-switch .block-title { display: none; }
  #model-banner p { font-size: 0.8rem; line-height: 1.3; }
  #explore-essentials .row:has(#generate-btn) { flex-wrap: nowrap; }  /* Generate and Sweep side by side */
  #explore-essentials .row:has(#generate-btn) > * { min-width: 0 !important; font-size: 0.95rem;
                                                     padding: 6px 8px; }
}
.steer-hidden { display: none !important; }
""" + panel_keys.CSS

# Switch gradio's own locale (labels translated by gr.I18n) to the chosen language.  gradio 6 keeps
# it in the `changeLocale` export of its core module; we import that very module (same URL, so the
# same store), found among the loaded resources.  If that ever fails, footer Settings -> Language
# still works and the server-side messages follow the switch regardless.
JS_SWITCH_LOCALE = """
async (lang) => {
  window.__steerLang = lang;
  try {
    const url = performance.getEntriesByType('resource').map((e) => e.name)
      .find((n) => /\\/assets\\/core-[^/]*\\.js(\\?|$)/.test(n));
    if (url) {
      const core = await import(url);
      if (core && typeof core.changeLocale === 'function') { core.changeLocale(lang); }
    }
  } catch (err) { console.warn('steer_ui: could not switch the gradio locale', err); }
  if (window.__steerTabLabels) { window.__steerTabLabels(); }
  return lang;
}
"""

# The tab buttons' labels in the page's language, kept by the page itself.  gradio re-translates every label on a
# locale switch except the buttons of unselected tabs; sending the tabs new labels from the server fixed that, but
# a tab (or the Tabs) that has ever been an event's output stays in gradio's loading-status list, and on every
# status change of every later event gradio's page walks and copies all that tab's components: with the 385
# components under the tabs, each step of the page took ~40 % longer (a profile of issue #36's walk).  So tabs are
# never outputs here: labels are set by this observer (it also relabels buttons gradio re-creates, e.g. in the
# overflow menu of a narrow screen) and tabs are opened by clicking their buttons (``js_open_tab``).
# The same observer words the toasts' titles: gradio 6 titles a toast by its kind in English ("Warning", whatever
# title the server gives), so the page puts the kind's word in its language over it.  And the result tables'
# column headers: their names are the API's field names (the frames an API client gets), so the page shows words in
# its language over them and keeps the name in the header's title (gradio's), where it reads it back.
JS_TAB_LABELS = """
() => {
  if (window.__steerTabLabels) return;
  const labels = %s, toastTitles = %s, gradioWords = %s, headerWords = %s, rawHeaders = %s;
  const idOf = {};  // the overflow menu's buttons carry no tab id: they are known by their label, in any language
  Object.values(labels).forEach((m) => Object.entries(m).forEach(([id, label]) => { idOf[label] = id; }));
  window.__steerTabLabels = () => {
    const mine = labels[window.__steerLang || 'en'] || labels.en;
    document.querySelectorAll('[data-tab-id], .overflow-dropdown button').forEach((el) => {
      const want = mine[el.dataset.tabId || idOf[el.textContent.trim()]];
      if (want && el.textContent.trim() !== want) { el.textContent = want; }
    });
    const titles = toastTitles[window.__steerLang || 'en'] || toastTitles.en;
    document.querySelectorAll('.toast-title').forEach((el) => {
      const word = titles[Object.keys(titles).find((kind) => el.classList.contains(kind))];
      const text = el.firstChild;  // the kind's word; a count "(2)" follows in its own element
      if (word && text && text.nodeType === 3 && text.nodeValue.trim() !== word) { text.nodeValue = word + ' '; }
    });
    // gradio's own words in upload areas, known in every language by the same key
    const words = gradioWords[window.__steerLang || 'en'] || gradioWords.en;
    document.querySelectorAll('[data-testid="upload-text"], [data-testid="upload-text"] .or, .drop-hint')
      .forEach((el) => el.childNodes.forEach((node) => {
        if (node.nodeType !== 3 || !node.nodeValue.trim()) return;
        const key = Object.keys(words).find((k) => Object.values(gradioWords).some(
          (w) => w[k] === node.nodeValue.trim()));
        if (key && node.nodeValue.trim() !== words[key]) { node.nodeValue = node.nodeValue.replace(
          node.nodeValue.trim(), words[key]); }
      }));
    const heads = headerWords[window.__steerLang || 'en'] || {};
    document.querySelectorAll('th[title] span.header').forEach((span) => {
      const th = span.closest('th'), text = span.firstChild;
      if (th.closest(rawHeaders) || !text || text.nodeType !== 3) return;
      const want = heads[th.getAttribute('title')] || th.getAttribute('title');
      if (text.nodeValue !== want) { text.nodeValue = want; }
    });
  };
  // a tab's button: in the bar, or (on a narrow screen) in the overflow menu, which is in the page while closed
  window.__steerOpenTab = (id) => {
    const button = document.querySelector(`button[role=tab][data-tab-id="${id}"]`) || Array.from(
      document.querySelectorAll('.overflow-dropdown button')).find((b) => idOf[b.textContent.trim()] === id);
    if (button) { button.click(); }
  };
  new MutationObserver(() => window.__steerTabLabels()).observe(document.body, {childList: true, subtree: true});
}
"""


TABS = ("explore", "model", "data", "train", "compare", "concepts", "detect", "export")  # ids, in page order
TAB_LABELS = {lang: {tab: i18n.label(lang, f"tab.{tab}") for tab in TABS} for lang in i18n.TRANSLATIONS}
# a toast's title by its kind (gradio's class on the title), in each language
TOAST_TITLES = {lang: {"warning": i18n.message(lang, "warning_title"), "info": i18n.message(lang, "notice_title"),
                       "error": i18n.message(lang, "error_title")} for lang in i18n.TRANSLATIONS}
# gradio's own words in its upload areas, as its frontend's locales (gradio 6) give them: gradio shows them in the
# browser's language, and its locale switch leaves those already drawn as they were (a browser review switched a
# page to 简体中文 and read "Drop File Here - or - Click to Upload" on Detect), so the page script rewords them
GRADIO_WORDS = {"en": {"drop_file": "Drop File Here", "or": "- or -", "click_to_upload": "Click to Upload",
                       "drop_table": "Drop CSV or TSV files here to import data into dataframe"},
                "zh-CN": {"drop_file": "将文件拖放到此处", "or": "- 或 -", "click_to_upload": "点击上传",
                          "drop_table": "将 CSV 或 TSV 文件拖放到此处以将数据导入数据框"}}


# The page-load script: installs the page's own key handling and its tab labels, then returns the language gradio
# chose for the page (html lang, kept in sync by gradio) or the browser's.
# Plotly's toolbar buttons, hidden until a chart is hovered, sat in the Tab order: twenty stops between Generate and
# Layer for a keyboard user who could not see them.  They stay for the mouse (download, zoom), out of the Tab order.
JS_QUIET_MODEBARS = """
() => {
  if (window.__steerQuietModebars) return;
  window.__steerQuietModebars = true;
  const quiet = () => document.querySelectorAll('.modebar-btn:not([tabindex="-1"]), .modebar a:not([tabindex="-1"])')
    .forEach((b) => b.setAttribute('tabindex', '-1'));
  new MutationObserver(quiet).observe(document.body, {childList: true, subtree: true});
  quiet();
}
"""

# A chart drawn while its tab was hidden (an answer arriving, or the language changed, while another tab was open) had
# no width to measure, so Plotly drew it 700 px wide and the panel clipped its right side: the Δlogit chart lost its
# promoted half (a browser review of the page).  Plotly refits a chart on the window's resize event (gradio makes
# each one responsive), so opening a tab raises one once the tab is shown.
JS_FIT_CHARTS = """
() => {
  if (window.__steerFitCharts) return;
  window.__steerFitCharts = true;
  const fit = () => window.dispatchEvent(new Event('resize'));
  document.addEventListener('click', (e) => {
    if (e.target.closest && e.target.closest('button[role=tab], .overflow-dropdown button')) {
      requestAnimationFrame(() => requestAnimationFrame(fit));
      setTimeout(fit, 300);  // and once more after the tab's content has mounted
    }
  }, true);
}
"""

# result tables' column headers in each language (JS_TAB_LABELS), but not where they are the person's own: a
# dataset's columns (the names its file must have) and the answers table they type into
HEADER_WORDS = {lang: i18n.plot_labels(lang, "columns") for lang in i18n.TRANSLATIONS}
RAW_HEADER_TABLES = ("#data-preview", "#detect-answers")

# The page's language as the language picker's own value (messages.normalise_lang's rule): gradio sets html lang
# to the browser's language where it has a translation of its own (de, fr, ja, zh-TW, ...), and the picker's
# input check refused those before the server could normalise them; the load event is unqueued, so the refusal
# was a wordless red "Error" on the picker of every such browser's page (an audit of the unqueued events).
JS_BROWSER_LANG = ("() => { (%s)(); (%s)(); (%s)(); (%s)(); (%s)(); "
                   "const lang = document.documentElement.lang || navigator.language || 'en'; "
                   "return lang.toLowerCase().startsWith('zh') ? 'zh-CN' : 'en'; }"
                   % (panel_keys.JS_ENTER_COMMITS.strip(),
                      JS_TAB_LABELS.strip() % (json.dumps(TAB_LABELS, ensure_ascii=False),
                                               json.dumps(TOAST_TITLES, ensure_ascii=False),
                                               json.dumps(GRADIO_WORDS, ensure_ascii=False),
                                               json.dumps(HEADER_WORDS, ensure_ascii=False),
                                               json.dumps(", ".join(RAW_HEADER_TABLES))),
                      alpha_box.script().strip(), JS_QUIET_MODEBARS.strip(), JS_FIT_CHARTS.strip()))


def js_open_tab(tab_id: str, only_if: str = "true") -> str:
    """Page script that opens the tab ``tab_id`` when the expression ``only_if`` holds (it may read the event's
    inputs as ``args``); JS_TAB_LABELS installs the opener."""
    return "(...args) => { if (%s) window.__steerOpenTab(%s); }" % (only_if, json.dumps(tab_id))


def status_markdown_of(lang: str, backend: Service) -> str:
    """The model's short status line in ``lang`` (a drawing for ui/relabel.py: the language first)."""
    return status_markdown(backend, lang, short=True)


def banner_markdown(lang: str, backend: Service, notices: tuple = (), linked: tuple = (), fell_back: str | None = None
                    ) -> str:
    """The banner over the tabs in ``lang``: the model's status, then what a link could not restore (``notices``
    and ``linked``: :class:`url_state.Notice`), what is shown instead (``fell_back``), and whether work is kept."""
    text = status_markdown(backend, lang, short=True)
    if notices:
        text += "\n\n" + i18n.markdown(lang, "link_notice",
                                       detail="; ".join(i18n.message(lang, n.key, **n.params) for n in notices))
    for notice in linked:
        text += "\n\n" + i18n.plain(i18n.message(lang, notice.key, **notice.params))
    if fell_back:  # say what is shown instead of the link's vector, and that its own settings are used
        text += "\n\n" + i18n.markdown(lang, "link_fallback", shown=fell_back)
    if not backend.keeps_work:
        text += "\n\n" + i18n.message(lang, "work_not_kept")
    return text


def fan_out(fn, copies: int):
    """Repeat ``fn``'s last output ``copies`` times (one vector-list update for every vector picker); ``fn`` may
    be a long job's event (an async generator, ui/job_line.py), whose status lines pass as they are."""

    def spread(out):
        if isinstance(out, dict):  # a status line, or a refusal on the page: gr.skip() or only its status line
            return out
        # one copy per output: gradio consumes update dicts while post-processing them
        return tuple(out[:-1]) + tuple(copy.deepcopy(out[-1]) for _ in range(copies))

    if inspect.isasyncgenfunction(fn):
        @functools.wraps(fn)
        async def stream(*args, **kwargs):
            async for out in fn(*args, **kwargs):
                yield spread(out)
        return stream

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return spread(fn(*args, **kwargs))

    return wrapper


def build_demo(backend: Service, num_layers: int | None = None) -> gr.Blocks:
    """The whole app.  ``num_layers`` sizes the layer sliders before the model is known (page load fixes them)."""
    if num_layers is None and backend.model_ready:
        num_layers = backend.handle.arch.num_layers
    from .concepts_tab import build_concepts_tab  # imported before building: it extends the i18n catalog

    # delete_cache: gradio's copies of uploads and served files older than an hour go every 10 minutes
    with gr.Blocks(title="steer_ui", analytics_enabled=False, delete_cache=(600, 3600)) as demo:
        with gr.Row(elem_classes="steer-header"):
            with gr.Column(scale=4):
                gr.Markdown(T("app.title"), elem_id="app-title")
                gr.Markdown(T("app.subtitle"), elem_id="app-subtitle")
            lang = gr.Radio([("English", "en"), ("简体中文", "zh-CN")], value="en", label=T("app.language"), scale=1,
                            elem_id="lang-switch")
        banner = gr.Markdown(elem_id="model-banner")
        # the tab a link's page opens on, for the page script (an unselected tab's components are not mounted, so
        # their values cannot tell it); hidden by CSS, not visible=False, so the page can read it
        opens_tab = gr.HTML("", elem_id="page-opens-tab", elem_classes="steer-hidden")
        owner = library_ui.owner_state(backend)  # the browser's owner token (local storage)
        with gr.Tabs(selected="explore"):  # never an output (JS_TAB_LABELS says why)
            # Explore first: the page opens on it, and gradio's page script finds each component an event reads or
            # writes by a depth-first search of the whole layout, so the tabs before Explore (~170 components)
            # were searched through on every event (docs/app.md: Tabs; 11 % a typed α, measured)
            with gr.Tab(T("tab.explore"), id="explore"):
                explore = build_explore_tab(backend, num_layers)
            with gr.Tab(T("tab.model"), id="model"):
                model = build_model_tab(backend)
            with gr.Tab(T("tab.data"), id="data"):
                data = build_data_tab(backend)
            with gr.Tab(T("tab.train"), id="train"):
                train = build_train_tab(backend, num_layers)
            with gr.Tab(T("tab.compare"), id="compare"):
                compare = build_compare_tab(backend, explore)
            with gr.Tab(T("tab.concepts"), id="concepts"):
                concepts = build_concepts_tab(backend)
            with gr.Tab(T("tab.detect"), id="detect"):
                detect = build_detect_tab(backend)
            with gr.Tab(T("tab.export"), id="export") as export_page:
                export = build_export_tab(backend)
            follow_explore(export_page, export, explore.vector)

        vector_pickers = [explore.vector, detect.vector, export.vector]
        n_pickers = len(vector_pickers)

        # ----------------------------------------------------- cross-tab events
        train.train.click(fan_out(train.train_fn, n_pickers), train.train_inputs, train.train_outputs + vector_pickers,
                          api_name="train_form", api_visibility="undocumented", show_progress="hidden", **MODEL)
        for i, loaded in enumerate(data.loaded_events):  # the Train tab's status line says what it would train on
            loaded.then(train.ready_fn, None, [train.status], api_name=f"train_ready_{i}",
                        api_visibility="undocumented", queue=False)

        # ------------------------------------------------ API-only endpoints
        def train_api(method: str, layer: float | None, auto_layer: bool, settings: str,
                      request: gr.Request) -> dict:
            """Train any registered method: ``settings`` is a JSON object of its settings (see /methods)."""
            try:
                auto = guards.flag(auto_layer, "auto_layer")
                name, result = backend.train(sid(request), method, None if auto else layer,
                                             settings=guards.settings_json(settings))
            except Exception as exc:
                raise as_gr_error(backend, request, exc) from None
            out = {"vector": name, "report": result, "vectors": backend.vector_names(sid(request)),
                   "kept": backend.kept(sid(request))}
            if not out["kept"]:  # an API client without X-Steer-Owner: say so where it will read it
                out["note"] = i18n.message(backend.language(sid(request)), "work_not_kept")
            return out

        def methods_api() -> list:
            """Every registered method with its settings: name, type, default, bounds, help."""
            return backend.methods_schema()

        gr.api(train_api, api_name="train", **MODEL)
        def load_api() -> dict:
            """How busy the shared decode batch is (generations running and waiting) and its decode path."""
            return backend.engine_load()

        gr.api(methods_api, api_name="methods", queue=False)
        gr.api(load_api, api_name="load", queue=False)
        export.upload.upload(fan_out(export.import_fn, n_pickers), [export.upload],
                             [export.import_status, export.info] + vector_pickers, api_name="import_vector")

        @handler(backend)
        def model_dependent(request: gr.Request):
            """Layer sliders, banner and vector lists for whatever model is loaded (waits for a load)."""
            handle = backend.handle
            top = handle.arch.num_layers - 1
            middle = handle.arch.num_layers // 2
            picker = gr.update(choices=picker_choices(backend.vector_names(sid(request))))
            return (relabel.keep(backend, sid(request), [banner], status_markdown_of, backend),
                    gr.update(maximum=top, value=middle),
                    gr.update(maximum=top, value=middle), picker, picker, picker)

        dependent_outputs = [banner, explore.layer, train.layer] + vector_pickers
        model.load_event.then(model_dependent, None, dependent_outputs, api_name="model_dependent",
                              api_visibility="undocumented")

        # ----------------------------------------------------------- language
        @handler(backend)
        def set_language(lang, request: gr.Request):
            return backend.set_language(sid(request), lang)

        # every panel the page filled, re-worded from what it shows (no model work), after gradio re-translates its
        # labels (which also puts each panel's first text, e.g. the readout's "drag α", back: redrawn here)
        relabelled = [banner] + model.relabelled + data.relabelled + train.relabelled + explore.relabelled \
            + compare.relabelled + concepts.relabelled + detect.relabelled + export.relabelled + explore.chat.relabelled
        relabelled = list({id(c): c for c in relabelled if c is not None}.values())

        def relabel_page(request: gr.Request):
            return relabel.redraw(backend, sid(request), relabelled)

        lang.change(set_language, [lang], [lang], js=JS_SWITCH_LOCALE, api_name="set_language", queue=False) \
            .then(relabel_page, None, relabelled, api_name="relabel", api_visibility="undocumented", queue=False,
                  show_progress="hidden")

        # ---------------------------------------------------------- page load
        @handler(backend)
        def page_status(request: gr.Request):
            banner_text = relabel.keep(backend, sid(request), [banner], status_markdown_of, backend)
            if backend.model_ready:
                return (banner_text,) + tuple(model_view(backend, sid(request), model))
            return banner_text, banner_text, None, None

        def browser_lang(value):
            return i18n.normalise_lang(value)

        load = demo.load(browser_lang, [lang], [lang], js=JS_BROWSER_LANG, api_name="browser_language",
                         api_visibility="undocumented", queue=False)

        @handler(backend)
        def claim_owner(token, request: gr.Request):
            """The page's owner: the one its browser remembers, or a new one (kept in the browser)."""
            return backend.claim_owner(sid(request), token, request_guard.client_address(request))

        @handler(backend)
        def page_view(request: gr.Request):
            """Everything that depends on the loaded model, and the Explore controls from the URL or the default."""
            handle = backend.handle
            n = handle.arch.num_layers
            choices = backend.vector_names(sid(request))
            view = backend.default_view
            defaults = ExploreState(prompt=view.prompt if view else DEFAULT_PROMPT,
                                    vector=view.name if view else RANDOM, layer=view.layer if view else n // 2,
                                    alpha=view.alpha if view else 0.0, alpha_max=view.alpha_max if view else 1.0)
            query = dict(getattr(request, "query_params", {}) or {})
            opened = library_ui.open_linked_terms(backend, request, query)  # added rows' vectors by share id
            choices = backend.vector_names(sid(request)) if opened else choices
            state = from_query(query, defaults, choices, n, backend.policy.max_prompt_chars)
            linked = library_ui.open_from_link(backend, request, query, state, choices)
            choices = backend.vector_names(sid(request))  # a shared vector or a saved result's may have joined
            fell_back = not query.get("result") and fall_back(state, defaults, query.get("vector"),
                                                              linked["vector_ref"])
            picker = gr.update(choices=picker_choices(choices))
            banner_text = relabel.keep(backend, sid(request), [banner], banner_markdown, backend, tuple(state.notices),
                                       tuple(linked["notices"]), state.vector if fell_back else None)
            box, slider = alpha_controls(state.alpha_max, state.alpha, state.extend, set_alpha=True)
            return (banner_text, gr.update(maximum=n - 1, value=state.layer), gr.update(maximum=n - 1, value=n // 2),
                    gr.update(choices=picker_choices(choices), value=state.vector), picker, picker,
                    state.prompt, slider, box, state.relative, state.seed, linked["vector_ref"],
                    gr.update(visible=linked["run_live"]), linked["prompt_ref"], state.extend,
                    terms_ref(opened)) + \
                rows_view(state.extra, choices, n, state.alpha_max, state.extend, state.relative, state.seed)

        page_outputs = [banner, explore.layer, train.layer] + vector_pickers + [
            explore.prompt, explore.alpha, explore.alpha_max, explore.relative, explore.vector_seed,
            explore.vector_ref, explore.run_live, explore.prompt_ref, explore.extend, explore.extra_ref] + \
            explore.rows_outputs
        # A fresh page shows steering at work without a click: the view, then next-token bars, both generations
        # (streamed) and the dose-response chart.
        # A saved result's page (?result=) draws its panels from the saved numbers instead of running the model.
        saved_or = functools.partial(library_ui.unless_saved, backend)
        next_token_outputs = [explore.bars_key, explore.bars, explore.delta, explore.readout, explore.details]
        sweep_outputs = [explore.dose_key, explore.dose, explore.sweep_table]
        load.then(claim_owner, [owner], [owner], api_name="page_owner", api_visibility="undocumented") \
            .then(page_status, None, [banner, model.status, model.facts, model.norms], api_name="page_status",
                  api_visibility="undocumented") \
            .then(page_view, None, page_outputs, api_name="page_model", api_visibility="undocumented") \
            .then(compare.show_saved, None, [opens_tab, compare.prompts] + compare.outputs,
                  api_name="page_comparison", api_visibility="undocumented", queue=False) \
            .then(None, [opens_tab], None, js=js_open_tab("compare", "args[0] === 'compare'")) \
            .then(explore.chat.show_saved, None, explore.chat.saved_outputs, api_name="page_chat",
                  api_visibility="undocumented", queue=False) \
            .then(saved_or(explore.next_token_fn, functools.partial(library_ui.saved_next_token, explore), "bars",
                           next_token_outputs), explore.next_token_inputs, next_token_outputs,
                  api_name="page_next_token", api_visibility="undocumented", show_progress="hidden", **SLIDER) \
            .then(saved_or(explore.generate_fn, library_ui.saved_generation, "generations", explore.gen_outputs),
                  explore.generate_inputs, explore.gen_outputs,
                  api_name="page_generate", api_visibility="undocumented", show_progress="hidden", **EXPLORE) \
            .then(saved_or(explore.sweep_fn, library_ui.no_sweep, "dose", sweep_outputs), explore.sweep_inputs,
                  sweep_outputs,
                  api_name="page_sweep", api_visibility="undocumented", show_progress="hidden", **EXPLORE)
        library_ui.wire(backend, explore, owner)
        wire_open_in_explore(compare, explore, js_open_tab("explore"))
        # No unload handler: a missed heartbeat (a laptop lid, a flaky network) must not wipe a session; idle
        # sessions are forgotten by the service after policy.session_idle_seconds instead.
    demo.steer_ui_backend = backend
    guard_requests(demo, backend)
    return demo


def guard_requests(demo: gr.Blocks, backend: Service) -> None:
    """Every event: its session admitted and its inputs checked (request_guard), and its place in the queue
    fair (fair_queue), also after a later ``demo.queue(...)`` replaces the queue."""
    request_guard.install(demo, backend)
    configure = demo.queue

    def queue(*args, **kwargs):
        out = configure(*args, **kwargs)
        fair_queue.install(demo._queue, demo, backend)
        return out

    demo.queue = queue
    fair_queue.install(demo._queue, demo, backend)


def launch_kwargs(policy: Policy | None = None, forwarded_allow_ips=(), **overrides) -> dict:
    """What every launch of this app passes (translations, css, no SSR: there is no node here), and the limits
    :class:`~.request_guard.RequestLimits` holds requests to, ``policy``'s (the default policy's without one).

    ``forwarded_allow_ips``: the proxies whose X-Forwarded-For names the client (none by default, not uvicorn's
    loopback); set for the server the next launch starts (:func:`request_guard.trust_forwarded`)."""
    from starlette.middleware import Middleware

    request_guard.trust_forwarded(forwarded_allow_ips)
    policy = policy or Policy()
    limits = Middleware(request_guard.RequestLimits, limit=policy.max_body_bytes,
                        **request_guard.stream_limits(policy))
    kwargs = dict(i18n=i18n.gr_i18n(), css=CSS, ssr_mode=False, footer_links=["api", "settings"], show_error=True,
                  app_kwargs={"middleware": [limits]})
    kwargs.update(overrides)
    return kwargs
