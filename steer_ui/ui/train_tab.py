"""Train: choose a method and layer (per-layer probe chart helps), train with progress, see the results."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import gradio as gr
import pandas as pd

from .. import plots
from ..backend import METHODS, Backend, UserError
from . import i18n
from .common import MODEL, T, handler, lang_of, progress_adapter, sid, table

# Keys of a method's report that hold its main result table, best first.
RESULT_KEYS = ("table", "auroc_table", "comparison", "results", "layers")


@dataclass
class TrainTab:
    method: gr.Radio
    layer: gr.Slider
    auto_layer: gr.Checkbox
    train: gr.Button
    status: gr.Markdown
    curves: gr.Plot
    results: gr.Dataframe
    report: gr.JSON
    probe_plot: gr.Plot
    probe_table: gr.Dataframe


def _records(value: Any) -> pd.DataFrame | None:
    if isinstance(value, pd.DataFrame):
        return value
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return pd.DataFrame(value)
    return None


def find_curves(report: dict) -> pd.DataFrame | None:
    """The first per-epoch table in the report (a list of records with an ``epoch`` column), one level deep."""
    candidates = list(report.items())
    for key, value in list(candidates):
        if isinstance(value, dict):
            candidates.extend((f"{key}.{k}", v) for k, v in value.items())
    for _key, value in candidates:
        frame = _records(value)
        if frame is not None and "epoch" in frame:
            return frame
    return None


def find_results(report: dict) -> pd.DataFrame | None:
    """The method's main result table, from whichever shape its report has.

    L2S: ``table`` (L2S vs Mean-S vs P2S); TSV: its constrained/unconstrained
    runs next to the ``baselines`` on the same split (AUROC, max |Δlogit|);
    mean-diff / probe / PCA / ITI: their ``metrics``.
    """
    rows: list[dict] = []
    for name, run in (report.get("runs") or {}).items():
        if isinstance(run, dict):
            rows.append({"row": f"TSV ({name})", "auroc": run.get("auroc"),
                         "max_abs_delta_logit": run.get("max_abs_delta_logit"), "note": ""})
    for name, base in (report.get("baselines") or {}).items():
        if isinstance(base, dict):
            rows.append({"row": name, "auroc": base.get("auroc"), "max_abs_delta_logit": None,
                         "note": base.get("note", "")})
        elif isinstance(base, (int, float)):
            rows.append({"row": name, "auroc": base, "max_abs_delta_logit": None, "note": ""})
    if rows:
        return pd.DataFrame(rows)
    for key in RESULT_KEYS:
        frame = _records(report.get(key))
        if frame is not None and "epoch" not in frame:
            return frame
    metrics = report.get("metrics") if isinstance(report.get("metrics"), dict) else report
    scalars = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return pd.DataFrame({"name": list(scalars), "value": list(scalars.values())}) if scalars else None


def find_alpha_sweep(report: dict) -> pd.DataFrame | None:
    """The KL-vs-α sweep a method ran to pick its recommended α range (shown when there are no epochs)."""
    frame = _records(report.get("alpha_sweep"))
    return frame if frame is not None and "alpha" in frame else None


def find_head_heatmap(report: dict) -> pd.DataFrame | None:
    """ITI's (layer × head) validation accuracy as a frame indexed by layer, columns = heads."""
    matrix = report.get("heatmap")
    if not matrix or not isinstance(matrix, list) or not isinstance(matrix[0], list):
        return None
    frame = pd.DataFrame(matrix, dtype=float)
    frame.index.name, frame.columns.name = "layer", "head"
    return frame


def _jsonable(value):
    return json.loads(json.dumps(value, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o)))


def build_train_tab(backend: Backend, num_layers: int | None = None) -> TrainTab:
    top = (num_layers or 128) - 1
    with gr.Row():
        with gr.Column(scale=1, min_width=320):
            method = gr.Radio(list(METHODS), value="mean-diff", label=T("train.method"), info=T("train.method_info"),
                              elem_id="train-method")
            with gr.Row():
                auto_layer = gr.Checkbox(value=True, label=T("train.auto_layer"))
                layer = gr.Slider(0, top, value=(num_layers or 12) // 2, step=1, label=T("train.layer"))
            with gr.Row():
                position = gr.Radio(["last", "mean"], value="last", label=T("train.position"))
                seed = gr.Number(value=0, precision=0, minimum=0, label=T("train.seed"))
            with gr.Group(visible=False) as tsv_group:
                with gr.Row():
                    exemplars = gr.Number(value=32, precision=0, minimum=2, label=T("train.exemplars"))
                    epochs = gr.Number(value=20, precision=0, minimum=1, label=T("train.epochs"))
                with gr.Row():
                    logit_penalty = gr.Checkbox(value=True, label=T("train.logit_penalty"))
                    kl_penalty = gr.Checkbox(value=True, label=T("train.kl_penalty"))
            with gr.Group(visible=False) as iti_group:
                top_heads = gr.Number(value=16, precision=0, minimum=1, label=T("train.top_heads"))
            with gr.Group(visible=False) as l2s_group:
                with gr.Row():
                    context_layer = gr.Number(value=None, precision=0, minimum=0, label=T("train.context_layer"))
                    hidden = gr.Number(value=None, precision=0, minimum=1, label=T("train.hidden"))
            extra = gr.Textbox(label=T("train.extra"), info=T("train.extra_info"), max_lines=3, placeholder="{}",
                               elem_id="train-extra")
            with gr.Row():
                probe_btn = gr.Button(T("train.probe"))
                train_btn = gr.Button(T("train.train"), variant="primary", elem_id="train-btn")
        with gr.Column(scale=2):
            status = gr.Markdown(T("train.empty"), elem_id="train-status")
            probe_plot = gr.Plot(label=T("train.probe_chart"))
            with gr.Row():
                curves = gr.Plot(label=T("train.curves"))
                results = gr.Dataframe(label=T("train.results"), interactive=False, wrap=True)
            with gr.Accordion(T("train.report"), open=False):
                probe_table = gr.Dataframe(label=T("train.probe_table"), interactive=False)
                report = gr.JSON(label=T("train.report"))

    tab = TrainTab(method=method, layer=layer, auto_layer=auto_layer, train=train_btn, status=status, curves=curves,
                   results=results, report=report, probe_plot=probe_plot, probe_table=probe_table)

    def show_groups(method):
        return (gr.update(visible=method == "tsv"), gr.update(visible=method == "iti"),
                gr.update(visible=method == "l2s"))

    @handler(backend)
    def probe_layers(position, seed, request: gr.Request, progress=gr.Progress()):
        lang = lang_of(backend, request)
        result = backend.probe_layers(sid(request), position=position, seed=seed, progress=progress_adapter(progress))
        frame = pd.DataFrame(result.get("layers", []))
        best = result.get("best_layer")
        fig = plots.probe_layers(frame, best, labels=i18n.plot_labels(lang, "probe")) if len(frame) else \
            plots.empty_figure()
        update = gr.update(value=best) if best is not None else gr.skip()
        return fig, table(frame), update, gr.update(value=False) if best is not None else gr.skip()

    @handler(backend)
    def train(method, layer, auto_layer, position, seed, exemplars, epochs, logit_penalty, kl_penalty, top_heads,
              context_layer, hidden, extra, request: gr.Request, progress=gr.Progress()):
        lang = lang_of(backend, request)
        hp: dict[str, Any] = {"seed": seed}
        if method in ("mean-diff", "probe", "pca", "iti"):
            hp["position"] = position
        if method == "tsv":  # TSV reads the last answer token by design; epochs apply to both stages
            hp.update(exemplars=exemplars, init_epochs=epochs, aug_epochs=epochs, logit_penalty=bool(logit_penalty),
                      kl_penalty=bool(kl_penalty))
        elif method == "iti":
            hp["top_heads"] = top_heads
        elif method == "l2s":
            hp.update(context_layer=context_layer, hidden=hidden)
        if extra and extra.strip():
            try:
                more = json.loads(extra)
            except ValueError as exc:
                raise UserError("bad_json", detail=str(exc)) from None
            if not isinstance(more, dict):
                raise UserError("bad_json", detail="expected an object like {\"epochs\": 10}")
            hp.update(more)
        name, report = backend.train(sid(request), method, None if auto_layer else layer,
                                     progress=progress_adapter(progress), **hp)
        curves_frame = find_curves(report)
        sweep_frame = find_alpha_sweep(report)
        heads_frame = find_head_heatmap(report)
        if heads_frame is not None:
            curves_fig = plots.head_heatmap(heads_frame, labels=i18n.plot_labels(lang, "heads"))
        elif curves_frame is not None:
            curves_fig = plots.training_curves(curves_frame, labels=i18n.plot_labels(lang, "curves"))
        elif sweep_frame is not None:
            curves_fig = plots.training_curves(sweep_frame, x="alpha", labels=i18n.plot_labels(lang, "alpha_sweep"))
        else:
            curves_fig = plots.empty_figure(i18n.message(lang, "no_curves"))
        choices = backend.vector_names(sid(request))
        text = i18n.message(lang, "trained", name=name)
        return (text, curves_fig, table(find_results(report)), _jsonable(report),
                gr.update(choices=choices, value=name))

    method.change(show_groups, [method], [tsv_group, iti_group, l2s_group], api_name="train_method_options",
                  api_visibility="undocumented", queue=False)
    auto_layer.change(lambda auto: gr.update(interactive=not auto), [auto_layer], [layer], api_name="auto_layer",
                      api_visibility="undocumented", queue=False)
    tab.probe_event = probe_btn.click(probe_layers, [position, seed], [probe_plot, probe_table, layer, auto_layer],
                                      api_name="probe_layers", **MODEL)
    tab.train_inputs = [method, layer, auto_layer, position, seed, exemplars, epochs, logit_penalty, kl_penalty,
                        top_heads, context_layer, hidden, extra]
    tab.train_fn = train
    tab.train_outputs = [status, curves, results, report]
    return tab
