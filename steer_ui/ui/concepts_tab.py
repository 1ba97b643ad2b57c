"""Concepts: lm_head, sampling, the logit explosion and the KV cache, computed on the loaded model.

Every number comes from :mod:`steer_ui.concepts` through the service's
lessons (:mod:`steer_ui.rooms.lessons`: bounded inputs, run as jobs); this module
only wires components to them and formats the results in the session's
language.  Named endpoints: ``/concepts_lm_head``, ``/concepts_sampling``,
``/concepts_sample``, ``/concepts_explode``, ``/concepts_fix``,
``/concepts_kv``, ``/concepts_kv_time``.
"""
from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from .. import concepts, plots, plots_concepts
from ..service import Service
from . import i18n, relabel
from .common import MODEL, OptionalNumberBox, T, from_page, handler, sid, table
from .job_line import cancel_fn, follow

@dataclass
class ConceptsTab:
    lm_bins: gr.Slider
    lm_run: gr.Button
    lm_facts: gr.Markdown
    lm_hist: gr.Plot
    lm_extremes: gr.Dataframe
    s_prompt: gr.Textbox
    s_temperature: gr.Slider
    s_top_k: gr.Number
    s_top_p: gr.Slider
    s_repetition: gr.Slider
    s_run: gr.Button
    s_summary: gr.Markdown
    s_chart: gr.Plot
    s_table: gr.Dataframe
    s_n: gr.Number
    s_seed: gr.Number
    s_sample: gr.Button
    s_sample_summary: gr.Markdown
    s_sample_chart: gr.Plot
    e_prompt: gr.Textbox
    e_layer: OptionalNumberBox
    e_alpha: gr.Number
    e_token: gr.Textbox
    e_bound: gr.Number
    e_steps: gr.Slider
    e_run: gr.Button
    e_cancel: gr.Button
    e_status: gr.Markdown
    e_summary: gr.Markdown
    e_chart: gr.Plot
    e_curve: gr.Plot
    e_bars: gr.Plot
    e_bars_fixed: gr.Plot
    e_unsteered: gr.Textbox
    e_exploded: gr.Textbox
    e_fixed: gr.Textbox
    e_details: gr.JSON
    kv_seq: gr.Number
    kv_batch: gr.Number
    kv_dtype: gr.Dropdown
    kv_run: gr.Button
    kv_summary: gr.Markdown
    kv_chart: gr.Plot
    kv_tokens: gr.Slider
    kv_time: gr.Button
    kv_cancel: gr.Button
    kv_timing: gr.Markdown
    kv_timing_chart: gr.Plot

    @property
    def relabelled(self) -> list:
        """The outputs a language switch redraws (ui/relabel.py)."""
        return [self.lm_facts, self.lm_hist, self.s_summary, self.s_chart, self.s_sample_summary,
                self.s_sample_chart, self.e_summary, self.e_chart, self.e_curve, self.e_bars, self.e_bars_fixed,
                self.kv_summary, self.kv_chart,
                self.kv_timing, self.kv_timing_chart]


def _num(x, digits: int = 4) -> str:
    if x is None:
        return "…"
    x = float(x)
    return f"{x:.{digits}g}" if abs(x) < 1e4 else f"{x:,.0f}"


# ------------------------------------------------------------------ text
def lm_head_markdown(lang: str, facts: dict, stats: dict) -> str:
    yes_no = i18n.message(lang, "concepts_yes" if facts["tied"] else "concepts_no")
    bias = i18n.message(lang, "concepts_bias") if facts["has_bias"] else ""
    head = i18n.message(lang, "concepts_lm_head", rows=f"{facts['vocab_size']:,}", cols=f"{facts['hidden_size']:,}",
                        params=f"{facts['parameters']:,}", share=f"{facts['share']:.1%}",
                        total=f"{facts['model_parameters']:,}", tied=yes_no,
                        size=plots_concepts.bytes_text(facts["bytes"]), dtype=facts["dtype"], bias=bias)
    rows = i18n.message(lang, "concepts_row_stats", mean=_num(stats["mean"]), std=_num(stats["std"]),
                        min=_num(stats["min"]), max=_num(stats["max"]), rows=f"{stats['rows']:,}")
    return f"{head}\n\n{rows}"


def sampling_markdown(lang: str, view: concepts.SamplingView) -> str:
    s = view.summary
    if s["greedy"]:
        return i18n.markdown(lang, "concepts_greedy_mode", token=repr(s["greedy_token"]))
    return i18n.markdown(lang, "concepts_sampling", token=repr(s["greedy_token"]), prob=_num(s["greedy_prob"]),
                        k_kept=f"{s['survivors_top_k']:,}", vocab=f"{s['vocab_size']:,}", kept=f"{s['survivors']:,}",
                        h_raw=_num(s["entropy_raw"]), h_final=_num(s["entropy_final"]))


def explosion_markdown(lang: str, demo: concepts.ExplosionDemo, max_new_tokens: int) -> str:
    e, f = demo.exploded, demo.fixed

    def pair(run, attr, digits=4):
        return _num(getattr(run, attr), digits) if run is not None else "…"

    def prob(run):
        return f"{run.prob_unsteered:.3g} → {run.prob_steered:.3g}" if run is not None else "…"

    def rep(run):
        return f"{run.repeats}/{max_new_tokens}" if run is not None else "…"

    text = i18n.markdown(
        lang, "concepts_explosion", token=repr(demo.token), token_id=demo.token_id, layer=demo.layer,
        alpha=_num(demo.alpha), alpha_raw=_num(demo.alpha_raw),
        e_naive=pair(e, "naive_direct"), f_naive=pair(f, "naive_direct"),
        e_direct=pair(e, "direct"), f_direct=pair(f, "direct"),
        e_delta=pair(e, "delta_logit"), f_delta=pair(f, "delta_logit"),
        e_max=pair(e, "max_abs_centred_delta_logit"), f_max=pair(f, "max_abs_centred_delta_logit"),
        e_raw=pair(e, "max_abs_delta_logit"), f_raw=pair(f, "max_abs_delta_logit"),
        e_prob=prob(e), f_prob=prob(f), e_kl=pair(e, "kl"), f_kl=pair(f, "kl"), e_rep=rep(e), f_rep=rep(f))
    if f is None:
        return text + "\n\n" + i18n.message(lang, "concepts_fixing")
    rep_ = demo.report
    # centred: the bound is on Δlogit minus its vocabulary mean (a shift of every logit moves no probability)
    after = rep_["after"]["max_abs_centred_delta_logit"]
    verdict = i18n.message(lang, "concepts_within" if after <= rep_["max_change"] else "concepts_over")
    return text + "\n\n" + i18n.message(
        lang, "concepts_constraint", bound=_num(rep_["max_change"]), prompts=rep_["settings"]["prompts"],
        steps=rep_["settings"]["steps"], before=_num(rep_["before"]["max_abs_centred_delta_logit"]), after=_num(after),
        verdict=verdict, cosine=_num(rep_["cosine_to_original"], 3))


def kv_markdown(lang: str, layout: concepts.KVLayout, seq_len: int, batch: int, dtype: str,
                measured: dict | None) -> str:
    full = concepts.kv_cache_bytes(layout, seq_len, batch, dtype)
    mha = concepts.kv_cache_bytes(layout, seq_len, batch, dtype, kv_heads=layout.attention_heads)
    text = i18n.message(lang, "concepts_kv", bytes=plots_concepts.bytes_text(full), seq_len=f"{seq_len:,}",
                        batch=batch, dtype=dtype, layers=layout.layers, kv_heads=layout.kv_heads,
                        head_dim=layout.head_dim, dtype_bytes=concepts.dtype_bytes(dtype),
                        heads=layout.attention_heads, mha=plots_concepts.bytes_text(mha),
                        ratio=_num(mha / full if full else float("nan"), 3))
    if layout.sliding_window is not None:
        n_sliding = sum(1 for t in layout.layer_types if t == "sliding_attention")
        text += " " + i18n.message(
            lang, "concepts_kv_sliding", n_sliding=n_sliding, layers=layout.layers, window=layout.sliding_window,
            sliding_bytes=plots_concepts.bytes_text(concepts.kv_cache_bytes(layout, seq_len, batch, dtype,
                                                                            sliding=True)))
    if measured:
        formula = measured["formula_sliding_bytes"]
        text += "\n\n" + i18n.message(lang, "concepts_kv_measured", seq_len=measured["seq_len"],
                                      measured=f"{measured['measured_bytes']:,} B", formula=f"{formula:,} B")
    return text


def timing_markdown(lang: str, summary: dict) -> str:
    same = i18n.message(lang, "concepts_yes" if summary["same_tokens"] else "concepts_no")
    return i18n.message(lang, "concepts_timing", n=summary["n_tokens"], with_s=_num(summary["seconds_with_cache"], 3),
                        without_s=_num(summary["seconds_without_cache"], 3), speedup=_num(summary["speedup"], 3),
                        same=same, cache=plots_concepts.bytes_text(summary["cache_bytes"]),
                        prompt_tokens=summary["prompt_tokens"])


# ----------------------------------------------------------------- build
def build_concepts_tab(backend: Service) -> ConceptsTab:
    gr.Markdown(T("concepts.intro"))

    # 1 · lm_head
    with gr.Accordion(T("concepts.lm_head.title"), open=True):
        gr.Markdown(T("concepts.lm_head.explain"))
        with gr.Row():
            lm_bins = gr.Slider(10, 200, value=60, step=1, label=T("concepts.lm_head.bins"))
            lm_run = gr.Button(T("concepts.lm_head.run"), variant="primary", elem_id="concepts-lm-run")
        lm_facts = gr.Markdown(elem_id="concepts-lm-facts")
        with gr.Row():
            lm_hist = gr.Plot(label=T("concepts.lm_head.histogram"), elem_id="concepts-lm-hist")
            lm_extremes = gr.Dataframe(label=T("concepts.lm_head.extremes"), interactive=False, wrap=True,
                                       headers=["which", "rank", "token", "token_id", "norm"])

    # 2 · sampling
    with gr.Accordion(T("concepts.sampling.title"), open=True):
        gr.Markdown(T("concepts.sampling.explain"))
        with gr.Row():
            with gr.Column(scale=1, min_width=300):
                s_prompt = gr.Textbox(value=concepts.DEFAULT_PROMPT, lines=2, label=T("concepts.prompt"),
                                      elem_id="concepts-sampling-prompt")
                s_temperature = gr.Slider(0.0, 2.0, value=1.0, step=0.05, label=T("concepts.sampling.temperature"),
                                          info=T("concepts.sampling.temperature_info"))
                with gr.Row():
                    s_top_k = gr.Number(value=0, precision=0, minimum=0, label=T("concepts.sampling.top_k"))
                    s_top_p = gr.Slider(0.05, 1.0, value=0.9, step=0.01, label=T("concepts.sampling.top_p"))
                s_repetition = gr.Slider(1.0, 2.0, value=1.0, step=0.05, label=T("concepts.sampling.repetition"),
                                         info=T("concepts.sampling.repetition_info"))
                s_run = gr.Button(T("concepts.sampling.run"), variant="primary", elem_id="concepts-sampling-run")
                with gr.Row():
                    s_n = gr.Number(value=100, precision=0, minimum=1, maximum=100000, label=T("concepts.sampling.n"))
                    s_seed = gr.Number(value=0, precision=0, minimum=0, label=T("concepts.sampling.seed"))
                s_sample = gr.Button(T("concepts.sampling.sample"), elem_id="concepts-sample")
            with gr.Column(scale=2):
                s_summary = gr.Markdown(elem_id="concepts-sampling-summary")
                s_chart = gr.Plot(label=T("concepts.sampling.chart"), elem_id="concepts-sampling-chart")
                s_sample_summary = gr.Markdown(elem_id="concepts-sample-summary")
                s_sample_chart = gr.Plot(label=T("concepts.sampling.sample_chart"), elem_id="concepts-sample-chart")
        with gr.Accordion(T("concepts.sampling.table"), open=False):
            s_table = gr.Dataframe(interactive=False, wrap=True, headers=["rank", "token", "token_id", "logit", "prob",
                                                                          "logit_penalised", "prob_penalised"])

    # 3 · the logit explosion and its fix
    with gr.Accordion(T("concepts.explosion.title"), open=True):
        gr.Markdown(T("concepts.explosion.explain"))
        with gr.Row():
            with gr.Column(scale=1, min_width=300):
                e_prompt = gr.Textbox(value=concepts.DEFAULT_PROMPT, lines=2, label=T("concepts.prompt"))
                with gr.Row():
                    # empty = the last block (a gr.Number cannot be empty: the page sent 0, and layer 0 shows no
                                    # explosion at the default α)
                    e_layer = OptionalNumberBox(value="", max_lines=1, label=T("concepts.explosion.layer"),
                                                info=T("concepts.explosion.layer_info"),
                                                elem_id="concepts-explosion-layer")
                    e_alpha = gr.Number(value=concepts.DEFAULT_EXPLOSION_ALPHA, minimum=0.0001,
                                        label=T("concepts.explosion.alpha"), info=T("concepts.explosion.alpha_info"))
                e_token = gr.Textbox(value=" zebra", max_lines=1, label=T("concepts.explosion.token"),
                                     info=T("concepts.explosion.token_info"))
                with gr.Row():
                    e_bound = gr.Number(value=concepts.DEFAULT_FIX_BOUND, minimum=0.01,
                                        label=T("concepts.explosion.bound"))
                    e_steps = gr.Slider(5, 300, value=concepts.DEFAULT_FIX_STEPS, step=5,
                                        label=T("concepts.explosion.steps"))
                with gr.Row():
                    e_run = gr.Button(T("concepts.explosion.run"), variant="primary", elem_id="concepts-explode")
                    e_cancel = gr.Button(T("concepts.cancel"), variant="stop", elem_id="concepts-explode-cancel")
                e_status = gr.Markdown(elem_id="concepts-explosion-status")  # the lesson's one progress line
            with gr.Column(scale=2):
                e_summary = gr.Markdown(elem_id="concepts-explosion-summary")
                with gr.Row():
                    e_chart = gr.Plot(label=T("concepts.explosion.chart"), elem_id="concepts-explosion-chart")
                    e_curve = gr.Plot(label=T("concepts.explosion.curve"))
        with gr.Row():
            e_bars = gr.Plot(label=T("concepts.explosion.bars"))
            e_bars_fixed = gr.Plot(label=T("concepts.explosion.bars_fixed"))
        with gr.Row():
            e_unsteered = gr.Textbox(label=T("concepts.explosion.unsteered"), lines=3, interactive=False)
            e_exploded = gr.Textbox(label=T("concepts.explosion.exploded"), lines=3, interactive=False,
                                    elem_id="concepts-exploded-text")
            e_fixed = gr.Textbox(label=T("concepts.explosion.fixed"), lines=3, interactive=False,
                                 elem_id="concepts-fixed-text")
        with gr.Accordion(T("concepts.details"), open=False):
            e_details = gr.JSON()

    # 4 · KV cache
    with gr.Accordion(T("concepts.kv.title"), open=True):
        gr.Markdown(T("concepts.kv.explain"))
        with gr.Row():
            kv_seq = gr.Number(value=4096, precision=0, minimum=1, label=T("concepts.kv.seq_len"))
            kv_batch = gr.Number(value=1, precision=0, minimum=1, label=T("concepts.kv.batch"))
            kv_dtype = gr.Dropdown(choices=list(concepts.DTYPE_BYTES), value="bfloat16", label=T("concepts.kv.dtype"))
            kv_run = gr.Button(T("concepts.kv.run"), variant="primary", elem_id="concepts-kv-run")
        kv_summary = gr.Markdown(elem_id="concepts-kv-summary")
        kv_chart = gr.Plot(label=T("concepts.kv.chart"), elem_id="concepts-kv-chart")
        with gr.Row():
            kv_tokens = gr.Slider(1, 128, value=24, step=1, label=T("concepts.kv.tokens"))
            kv_time = gr.Button(T("concepts.kv.time"), elem_id="concepts-kv-time")
            kv_cancel = gr.Button(T("concepts.cancel"), variant="stop", elem_id="concepts-kv-cancel")
        kv_timing = gr.Markdown(elem_id="concepts-kv-timing")
        kv_timing_chart = gr.Plot(label=T("concepts.kv.timing_chart"))

    tab = ConceptsTab(**{k: v for k, v in locals().items() if k in ConceptsTab.__dataclass_fields__})
    e_views = [e_summary, e_chart, e_curve, e_bars, e_bars_fixed, e_unsteered, e_exploded, e_fixed, e_details]

    # ------------------------------------------------------------ handlers
    # each draws through relabel.keep: a language switch redraws the lesson's text and charts from its numbers
    def lm_head_view(lang, facts, norms):
        fig = plots_concepts.row_norm_histogram(norms.histogram, norms.stats,
                                                labels=i18n.plot_labels(lang, "concepts_norms"))
        return lm_head_markdown(lang, facts, norms.stats), fig

    # the quick lessons are jobs too: behind another visitor's long job each says in its first line what it waits
    # for (ui/job_line.py), and a job that ends within the first poll shows no line at all
    @handler(backend, status=lm_facts)
    async def lm_head(bins, request: gr.Request):
        def work():
            facts, norms = backend.lesson("lm_head", sid(request), bins)
            return relabel.keep(backend, sid(request), [lm_facts, lm_hist], lm_head_view, facts, norms) + (
                table(norms.extremes),)

        async for shown in follow(backend, request, lm_facts, work):
            yield shown

    def sampling_view(lang, view):
        fig = plots_concepts.sampling_bars(view.frame, labels=i18n.plot_labels(lang, "concepts_sampling"))
        return sampling_markdown(lang, view), fig

    @handler(backend, status=s_summary)
    async def sampling(prompt, temperature, top_k, top_p, repetition, request: gr.Request):
        def work():
            view = backend.lesson("sampling", sid(request), prompt, temperature, top_k, top_p, repetition)
            return relabel.keep(backend, sid(request), [s_summary, s_chart], sampling_view, view) + (
                table(view.frame),)

        async for shown in follow(backend, request, s_summary, work):
            yield shown

    def sample_view(lang, frame):
        text = i18n.message(lang, "concepts_sampled", n=frame.attrs["n"], seed=frame.attrs["seed"],
                            distinct=frame.attrs["distinct"], tv=_num(frame.attrs["total_variation"], 3))
        return text, plots_concepts.sample_bars(frame, labels=i18n.plot_labels(lang, "concepts_sample"))

    @handler(backend, status=s_sample_summary)
    async def sample(prompt, temperature, top_k, top_p, repetition, n, seed, request: gr.Request):
        def work():
            frame = backend.lesson("sample", sid(request), prompt, temperature, top_k, top_p, repetition, n, seed)
            return relabel.keep(backend, sid(request), [s_sample_summary, s_sample_chart], sample_view, frame)

        async for shown in follow(backend, request, s_sample_summary, work):
            yield shown

    def _explosion_views(lang, demo, max_new_tokens):
        bar_labels = i18n.plot_labels(lang, "bars")
        exploded = demo.exploded
        fixed = demo.fixed
        chart = plots_concepts.explosion_bars(exploded.as_dict(), fixed.as_dict() if fixed else None,
                                              bound=demo.report.get("max_change") if fixed else None,
                                              labels=i18n.plot_labels(lang, "concepts_explosion"))
        bars = plots.next_token_bars(exploded.unsteered_top, exploded.top, labels=bar_labels)
        bars_fixed = plots.next_token_bars(fixed.unsteered_top, fixed.top, labels=bar_labels) if fixed else None
        curve = plots_concepts.constraint_curve(demo.curve(), demo.report.get("max_change"),
                                                labels=i18n.plot_labels(lang, "concepts_curve")) if fixed else None
        return (explosion_markdown(lang, demo, max_new_tokens), chart, curve, bars, bars_fixed,
                exploded.unsteered_text, exploded.steered_text, fixed.steered_text if fixed else "", demo.as_dict())

    @handler(backend, status=e_status)
    async def explode(prompt, layer, alpha, token, request: gr.Request):
        def work():
            demo = backend.lesson("explode", sid(request), prompt, layer, alpha, token)
            return relabel.keep(backend, sid(request), e_views, _explosion_views, demo, concepts.DEMO_TOKENS) + ("",)

        async for out in follow(backend, request, e_status, work):
            yield out

    @handler(backend, status=e_status)
    async def fix(bound, steps, request: gr.Request):
        # on the page the fix follows the explosion (.success), which a refusal does not stop (the page's
        # refusals are a line, not an error): an explosion that was cancelled or failed leaves its line standing
        if from_page(request) and backend.job_outcome(sid(request)) in ("cancelled", "failed"):
            yield gr.skip()
            return

        def work():
            demo = backend.lesson("fix", sid(request), bound, steps)
            return relabel.keep(backend, sid(request), e_views, _explosion_views, demo, concepts.DEMO_TOKENS) + ("",)

        async for out in follow(backend, request, e_status, work):
            yield out

    def kv_view(lang, out):
        fig = plots_concepts.kv_cache_chart(out["table"], current=out["seq_len"],
                                            labels=i18n.plot_labels(lang, "concepts_kv"))
        return kv_markdown(lang, out["layout"], out["seq_len"], out["batch"], out["dtype"], out["measured"]), fig

    @handler(backend, status=kv_summary)
    async def kv(seq_len, batch, dtype, request: gr.Request):
        def work():
            out = backend.lesson("kv", sid(request), seq_len, batch, dtype)
            return relabel.keep(backend, sid(request), [kv_summary, kv_chart], kv_view, out)

        async for shown in follow(backend, request, kv_summary, work):
            yield shown

    def kv_time_view(lang, summary, steps):
        fig = plots_concepts.cache_timing_chart(steps, labels=i18n.plot_labels(lang, "concepts_timing"))
        return timing_markdown(lang, summary), fig

    @handler(backend, status=kv_timing)
    async def kv_time_fn(n_tokens, request: gr.Request):
        def work():
            summary, steps = backend.lesson("time_cache", sid(request), n_tokens)
            return relabel.keep(backend, sid(request), [kv_timing, kv_timing_chart], kv_time_view, summary, steps)

        async for out in follow(backend, request, kv_timing, work):
            yield out

    # -------------------------------------------------------------- events
    # one progress indicator per job: its line (a quick lesson's first output, a long one's status line)
    lm_run.click(lm_head, [lm_bins], [lm_facts, lm_hist, lm_extremes], api_name="concepts_lm_head",
                 show_progress="hidden", **MODEL)
    s_inputs = [s_prompt, s_temperature, s_top_k, s_top_p, s_repetition]
    s_outputs = [s_summary, s_chart, s_table]
    s_run.click(sampling, s_inputs, s_outputs, api_name="concepts_sampling", show_progress="hidden", **MODEL)
    s_prompt.submit(sampling, s_inputs, s_outputs, api_name="concepts_sampling_on_submit",
                    api_visibility="undocumented", show_progress="hidden", **MODEL)
    for i, control in enumerate((s_temperature, s_top_p, s_repetition)):
        control.release(sampling, s_inputs, s_outputs, api_name=f"concepts_sampling_on_slider_{i}",
                        api_visibility="undocumented", trigger_mode="always_last", show_progress="hidden", **MODEL)
    s_top_k.submit(sampling, s_inputs, s_outputs, api_name="concepts_sampling_on_top_k",
                   api_visibility="undocumented", show_progress="hidden", **MODEL)
    s_sample.click(sample, s_inputs + [s_n, s_seed], [s_sample_summary, s_sample_chart], api_name="concepts_sample",
                   show_progress="hidden", **MODEL)
    e_outputs = e_views + [e_status]
    e_run.click(explode, [e_prompt, e_layer, e_alpha, e_token], e_outputs, api_name="concepts_explode",
                show_progress="hidden", **MODEL) \
        .success(fix, [e_bound, e_steps], e_outputs, api_name="concepts_fix", show_progress="hidden", **MODEL)
    kv_run.click(kv, [kv_seq, kv_batch, kv_dtype], [kv_summary, kv_chart], api_name="concepts_kv",
                 show_progress="hidden", **MODEL)
    kv_time.click(kv_time_fn, [kv_tokens], [kv_timing, kv_timing_chart], api_name="concepts_kv_time",
                  show_progress="hidden", **MODEL)
    # Cancel, outside the queue: a session runs one job at a time, so either button stops the lesson under way
    e_cancel.click(cancel_fn(backend), None, [e_status], api_name="concepts_cancel", api_visibility="undocumented",
                   queue=False)
    kv_cancel.click(cancel_fn(backend), None, [kv_timing], api_name="concepts_kv_cancel",
                    api_visibility="undocumented", queue=False)
    return tab
