"""The "Many prompts" tab (issue #31): the vector, layer and α chosen on Explore over many prompts at once, with
the quotable summary line, every prompt's margin curve, the steerability histogram and the per-prompt table.

``/compare`` (API) returns ``{"rows": [...], "summary": {...}}``; the page's own event is ``/compare_view``."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

import gradio as gr
import pandas as pd

from .. import plots
from ..service import Service
from . import extra_terms, i18n, panel_keys, relabel
from .common import MODEL, T, handler, sid, table
from .job_line import cancel_fn, follow
from ..service import LAST_COMPARISON
from .explore_tab import alpha_controls, rows_view
from .library_ui import SHOW_COMPARISON, page_url, plain_api

SHOWN = "shown_comparison"  # Session.cache key: the comparison the tab shows (live or saved), for opening a row

COLUMNS = ["prompt", "unsteered", "steered", "kl", "fluency", "distinct", "concept_score", "steerability"]
COLUMN_WIDTHS = ["22%", "20%", "20%", "7%", "8%", "7%", "8%", "8%"]


@dataclass
class CompareTab:
    prompts: gr.Textbox
    run: gr.Button
    summary: gr.Markdown
    outputs: list  # made-for, summary, curves, histogram, table: what a comparison (live or saved) draws
    show_saved: object  # the page-load step that draws a saved comparison (?result=)
    open_row: object  # a table row's select event -> its prompt with the comparison's settings, on Explore

    @property
    def relabelled(self) -> list:
        """The outputs a language switch redraws (ui/relabel.py)."""
        return self.outputs


def render(lang: str, out: dict) -> tuple:
    """The summary line, both charts and the table of one comparison (``{"rows", "summary"}``)."""
    s = out["summary"]
    frame = pd.DataFrame(out["rows"]).reindex(columns=COLUMNS)
    if s.get("alphas") and all("margins" in r for r in out["rows"]):
        curves_fig = plots.margin_curves(s["alphas"], [r["margins"] for r in out["rows"]], s["alpha"],
                                         labels=i18n.plot_labels(lang, "margins"))
        slopes_fig = plots.slope_histogram([r["steerability"] for r in out["rows"]],
                                           labels=i18n.plot_labels(lang, "slopes"))
    else:
        curves_fig = slopes_fig = plots.empty_figure(i18n.message(lang, "compare_needs_pairs_chart"))
    return i18n.plain(summary_line(lang, s)), curves_fig, slopes_fig, table(frame)


def compare_panel(lang: str, made_for: dict, fields: tuple | None, out: dict) -> tuple:
    """(made-for element, summary, both charts, table) of one comparison in ``lang``."""
    return (panel_keys.made_for(lang, "compare", made_for, fields),) + render(lang, out)


def summary_line(lang: str, summary: dict) -> str:
    """The sentence a person quotes (issue #31), in the page's language; after it, when the comparison stopped at
    its time limit, the line saying how many prompts it covers."""
    line = _summary_sentence(lang, summary)
    stopped = summary.get("stopped")
    if stopped:
        line += " " + i18n.message(lang, "compare_stopped", done=stopped["done"], total=stopped["total"],
                                   limit=stopped["limit"])
    return line


def _summary_sentence(lang: str, summary: dict) -> str:
    def number(value, fallback=0.0):
        return value if isinstance(value, (int, float)) and math.isfinite(value) else fallback

    n = summary["prompts"]
    if summary.get("steerability_mean") is not None:
        alphas = summary["alphas"] or [0.0]
        return i18n.message(lang, "compare_pairs_summary", n=n, intended=round(summary["intended_share"] * n),
                            share=summary["intended_share"], anti=round(summary["anti_steerable_share"] * n),
                            flips=round(summary["flip_share"] * n), top=max(abs(a) for a in alphas),
                            margin=number(summary["margin_at_alpha"]), alpha=summary["alpha"],
                            drop=number(summary["fluency_drop"]))
    concept = summary.get("concept_score_mean")
    return i18n.message(lang, "compare_summary", n=n, alpha=summary["alpha"], kl=number(summary["kl_mean"]),
                        drop=number(summary["fluency_drop"]), distinct=number(summary["distinct_mean"]),
                        concept="—" if concept is None else f"{concept:+.2f}",
                        units=i18n.message(lang, f"concept_units_{summary.get('concept_units') or 'none'}"))


def build_compare_tab(backend: Service, explore) -> CompareTab:
    gr.Markdown(T("compare.intro"))
    with gr.Row():
        with gr.Column(scale=1, min_width=300):
            prompts = gr.Textbox(lines=8, max_lines=20, label=T("compare.prompts"), elem_id="compare-prompts")
            use_dataset = gr.Checkbox(value=False, label=T("compare.use_dataset"), info=T("compare.use_dataset_info"),
                                      elem_id="compare-use-dataset")
            max_tokens = gr.Slider(1, 128, value=24, step=1, label=T("compare.max_tokens"), elem_id="compare-max-tokens")
            with gr.Row():
                run = gr.Button(T("compare.run"), variant="primary", elem_id="compare-run")
                cancel = gr.Button(T("compare.cancel"), variant="stop", elem_id="compare-cancel")
                save_btn = gr.Button(T("compare.save"), elem_id="compare-save")
            # the summary sits under the button: the job's one progress line and then its result show where the
            # click was
            summary = gr.Markdown(T("compare.empty"), elem_id="compare-summary")
            link = gr.Textbox(label=T("compare.link"), interactive=False, max_lines=1, elem_id="compare-link",
                              visible=False)
        with gr.Column(scale=2):
            compare_key = gr.HTML(elem_id="compare-made-for", elem_classes="made-for-holder")
            with gr.Row():
                curves = gr.Plot(label=T("compare.curves"), elem_id="compare-curves")
                histogram = gr.Plot(label=T("compare.histogram"), elem_id="compare-histogram")
            # widths that add up to the panel: the texts wrap in their columns, the numbers keep theirs (with
            # gradio's own widths the prompt column pushed the scores past the panel's edge, issue #52)
            rows = gr.Dataframe(label=T("compare.table"), interactive=False, wrap=True, headers=COLUMNS,
                                elem_id="compare-table", column_widths=COLUMN_WIDTHS)
    outputs = [compare_key, summary, curves, histogram, rows]
    inputs = [prompts, use_dataset, explore.vector, explore.layer, explore.alpha, explore.relative,
              explore.vector_seed, explore.alpha_max, max_tokens, explore.rows.extra]
    panel_keys.watch("compare", dict(zip(panel_keys.PANELS["compare"], inputs)))

    def compute(prompts_, use_dataset_, vector, layer, alpha, relative, seed, alpha_max, max_tokens_,
                request, extra="") -> dict:
        # Explore's added vectors steer beside the main one (issue #48: ui/extra_terms.py)
        return backend.compare(sid(request), prompts_, use_dataset_, vector, layer, alpha, relative, seed,
                               alpha_max, sampling=backend.sampling(max_new_tokens=max_tokens_),
                               held=extra_terms.held(relative, seed, extra))

    @handler(backend, status=summary)
    async def compare_view(prompts_, use_dataset_, vector, layer, alpha, relative, seed, alpha_max, max_tokens_,
                           extra="", request: gr.Request = None):
        def work():
            out = compute(prompts_, use_dataset_, vector, layer, alpha, relative, seed, alpha_max, max_tokens_,
                          request, extra)
            last = backend.session(sid(request)).cache.get(LAST_COMPARISON) or {}
            backend.session(sid(request)).cache[SHOWN] = {"settings": last.get("settings") or {}, "rows": out["rows"]}
            made_for = panel_keys.key_of("compare", dict(zip(panel_keys.PANELS["compare"], (
                prompts_, use_dataset_, vector, layer, alpha, relative, seed, alpha_max, max_tokens_, extra))))
            return relabel.keep(backend, sid(request), outputs, compare_panel, made_for, None, out) + (
                gr.update(visible=False),)

        async for out in follow(backend, request, summary, work):
            yield out

    @handler(backend, status=summary)
    def save(request: gr.Request):
        result_id = backend.save_comparison(sid(request))
        link = f"{page_url(request)}?result={result_id}"
        return (relabel.keep(backend, sid(request), [summary], *relabel.text("saved_comparison")),
                gr.update(value=link, visible=True))

    @handler(backend, status=summary)
    def show_saved(request: gr.Request):
        """On a saved comparison's page: the tab to open (this one) and its table and charts as saved; else
        nothing."""
        session = backend.peek_session(sid(request))
        saved = session.cache.pop(SHOW_COMPARISON, None) if session is not None else None
        if saved is None:
            return (gr.skip(),) * 7
        settings = opened_settings(saved)
        session.cache[SHOWN] = {"settings": settings, "rows": saved["comparison"]["rows"]}
        text = "\n".join(settings.get("prompts") or [])
        # a saved comparison claims only its prompts (put in the box here): its summary line names the vector
        # and α it ran with, which Explore's controls need not show
        return ("compare", text) + relabel.keep(backend, sid(request), outputs, compare_panel,
                                                panel_keys.key_of("compare", {"prompts": text}, ("prompts",)),
                                                ("prompts",), saved["comparison"])

    @handler(backend)
    def compare_api(prompts_: str, use_dataset_: bool, vector: str, layer: float, alpha: float, relative: bool,
                    seed: float, alpha_max: float, max_new_tokens: float, extra: str = "",
                    request: gr.Request = None) -> dict:
        """One vector over many prompts: {"rows": [...], "summary": {...}} (see steer_ui/steerability.py);
        ``extra``: other vectors steering beside it, as Explore's added rows write them."""
        return compute(prompts_, use_dataset_, vector, layer, alpha, relative, seed, alpha_max, max_new_tokens,
                       request, extra)

    run.click(compare_view, inputs, outputs + [link], api_name="compare_view", api_visibility="undocumented",
              show_progress="hidden", **MODEL)
    cancel.click(cancel_fn(backend), None, [summary], api_name="compare_cancel", api_visibility="undocumented",
                 queue=False)
    save_btn.click(save, None, [summary, link], api_name="save_comparison_button", api_visibility="undocumented",
                   queue=False)
    gr.api(compare_api, api_name="compare", **MODEL)

    def save_comparison(request: gr.Request) -> dict:
        """Save this session's last comparison (every row and the summary): {"id", "url"}."""
        result_id = backend.save_comparison(sid(request))
        return {"id": result_id, "url": f"{page_url(request)}?result={result_id}"}

    gr.api(plain_api(backend, save_comparison), api_name="save_comparison", queue=False)

    @handler(backend)
    def open_row(evt: gr.SelectData, request: gr.Request):
        """The selected row's prompt, with the vector, layer and α the comparison ran with, into Explore, and its
        added vectors (``held``) as Explore's added rows, as a link's are shown."""
        session = backend.peek_session(sid(request))
        shown = session.cache.get(SHOWN) if session is not None else None
        index = evt.index[0] if isinstance(evt.index, (list, tuple)) else evt.index
        if not shown or not isinstance(index, int) or not 0 <= index < len(shown["rows"]):
            return (gr.skip(),) * (7 + len(explore.rows_outputs))
        st = shown["settings"]
        keep = lambda key: gr.skip() if st.get(key) is None else st[key]  # noqa: E731
        held = json.dumps(st["held"], ensure_ascii=False) if st.get("held") else ""
        # one range for every α slider, the main α and each added row's within it
        top = max([abs(float(st.get("alpha_max") or 0)), abs(float(st.get("alpha") or 0))]
                  + [abs(t.scale) for t in extra_terms.added(held)]) or 1.0
        alpha, alpha_max = gr.skip(), keep("alpha_max")
        if st.get("alpha") is not None and st.get("alpha_max"):  # the slider's range and α in one update
            alpha_max, alpha = alpha_controls(top, float(st["alpha"]), set_alpha=True)
        # the added rows as a link's or a saved result's are shown (every row hidden when it had none)
        rows = rows_view(held, backend.vector_names(sid(request)), backend.handle.arch.num_layers, top, False,
                         st.get("relative", True), st.get("seed", 0))
        return (shown["rows"][index]["prompt"], keep("vector"), keep("layer"),
                alpha_max, alpha, keep("relative"), keep("seed")) + rows

    return CompareTab(prompts=prompts, run=run, summary=summary, outputs=outputs, show_saved=show_saved,
                      open_row=open_row)


def opened_settings(saved: dict) -> dict:
    """A saved comparison's settings with its vectors as opened here (read-only, with the link:
    library_ui.open_from_link), so a row opens with them in Explore.  One kept with the comparison that could not
    be opened (say, it no longer fits the model) is not named by its saved name, which could be another vector's
    of the viewer's: the main one becomes None (Explore keeps its own), an added row is left out."""
    settings = dict(saved.get("settings") or {})
    if saved.get("has_vector"):
        settings["vector"] = saved.get("opened_vector")
    names = extra_terms.opened_names(saved, saved.get("opened_terms") or {})
    if names and settings.get("held"):
        held = extra_terms.renamed(json.dumps(settings["held"]), names)
        settings["held"] = json.loads(held) if held else None
    return settings


def wire_open_in_explore(tab: CompareTab, explore, open_explore_js: str) -> None:
    """Clicking a row of the table opens it in Explore (the page script ``open_explore_js`` switches the tab), its
    added vectors as Explore's added rows, whose panels then follow (bars, both generations, the dose-response
    marker)."""
    rows = tab.outputs[-1]
    rows.select(None, None, None, js=open_explore_js, queue=False)
    event = rows.select(tab.open_row, None, [explore.prompt, explore.vector, explore.layer,
                                             explore.alpha_max, explore.alpha, explore.relative, explore.vector_seed]
                        + explore.rows_outputs,
                        api_name="open_row_in_explore", api_visibility="undocumented", queue=False)
    explore.refresh_all(event, "open_row")
