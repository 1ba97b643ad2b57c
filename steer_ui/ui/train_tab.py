"""Train: choose a method and layer (per-layer probe chart helps), train with progress, see the results."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import gradio as gr
import pandas as pd

from .. import plots
from ..service import Service, UserError
from . import i18n, panel_keys, relabel, report_lines
from .common import MODEL, T, handler, lang_of, picker_choices, sid, table
from .job_line import cancel_fn, follow
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
    train_key: gr.HTML | None = None
    probe_key: gr.HTML | None = None

    @property
    def relabelled(self) -> list:
        """The outputs a language switch redraws (ui/relabel.py)."""
        return [self.train_key, self.status, self.curves, self.probe_key, self.probe_plot]


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
                         "max_abs_delta_logit": run.get("max_abs_delta_logit"), "note": run.get("note", "")})
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


def find_loss_curve(report: dict) -> tuple[pd.DataFrame, int | None] | None:
    """(train/validation loss per epoch, the epoch early stopping kept) where a method reports them (L2S)."""
    frame = _records(report.get("loss_curve"))
    if frame is None or "epoch" not in frame:
        return None
    fit = report.get("fit") if isinstance(report.get("fit"), dict) else {}
    best = fit.get("best_epoch")
    return frame, best if isinstance(best, int) and not isinstance(best, bool) else None


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


def setting_text(spec, method: str) -> tuple:
    """The setting's label and help as page keys (translated in the browser): English from the method's own
    settings (the shared label where one exists, else its name in words), Chinese from ui/settings_zh.py.  A
    method with no Chinese entries (one registered by a plugin) gets its own words as plain text; the bundled
    methods' entries are kept complete by tests/unit/test_backend_i18n.py."""
    from .settings_zh import ZH

    key = f"train.setting.{method}.{spec.name}"
    shared = f"train.{spec.name}"
    label_en = i18n.TRANSLATIONS["en"][shared] if shared in i18n.TRANSLATIONS["en"] else spec.name.replace("_", " ")
    chinese = ZH.get(f"{method}.{spec.name}")
    if chinese is None:  # a method registered later (a plugin): its own words, as written
        return label_en, spec.help or None
    label_zh, help_zh = chinese
    i18n.extend(labels={"en": {key: label_en, f"{key}.info": spec.help},
                        "zh-CN": {key: label_zh, f"{key}.info": help_zh}})
    return T(key), T(f"{key}.info") if spec.help else None


def setting_component(spec, method: str = ""):
    """A form component generated from one :class:`~steer_ui.methods.base.SettingSpec` (``elem_id``
    ``train-<method>-<setting>``).

    The component's limits mirror the spec's, but they are a convenience: the
    service re-checks every value (the API ignores the page).
    """
    label, info = setting_text(spec, method)
    common = dict(label=label, info=info, elem_id=f"train-{method}-{spec.name}".replace("_", "-") if method else None)
    if spec.kind == "bool":
        return gr.Checkbox(value=bool(spec.default), **common)
    if spec.choices:
        return gr.Dropdown(list(spec.choices), value=spec.default, **common)
    if spec.kind in ("int", "float") and spec.optional:  # may be left empty ("the method decides"): a number
        # field cannot be empty in the browser (it sends 0), so a text field that the service reads as a number
        return gr.Textbox(value="" if spec.default is None else f"{spec.default:g}", max_lines=1,
                          placeholder=T("train.placeholder_default"), **common)
    if spec.kind in ("int", "float"):
        return gr.Number(value=spec.default, precision=0 if spec.kind == "int" else None, minimum=spec.minimum,
                         maximum=spec.maximum, **common)
    if spec.kind == "floats":
        return gr.Textbox(value=", ".join(f"{v:g}" for v in spec.default), placeholder=T("train.placeholder_floats"),
                          **common)
    return gr.Textbox(value=spec.default or "", max_lines=3, **common)


def form_values(specs_: list, values: list) -> dict[str, Any]:
    """Settings from the form: blank numbers and texts mean "the default" (None), so the service fills them."""
    out: dict[str, Any] = {}
    for spec, value in zip(specs_, values):
        if value is None or (isinstance(value, str) and not value.strip() and spec.kind != "bool"):
            continue
        out[spec.name] = value
    return out


def train_outputs(backend: Service | None, lang: str, name: str, report: dict) -> tuple:
    """(status, curves figure, results table, report) shown after any training run.

    A method's own verdict (L2S saying whether it beat mean steering) and TSV's labels and |Δlogit| bound are
    worded under the status line in ``lang`` from the report's numbers (:mod:`.report_lines`)."""
    loss = find_loss_curve(report)
    curves_frame = find_curves(report)
    sweep_frame = find_alpha_sweep(report)
    heads_frame = find_head_heatmap(report)
    if heads_frame is not None:
        curves_fig = plots.head_heatmap(heads_frame, labels=i18n.plot_labels(lang, "heads"))
    elif loss is not None:
        curves_fig = plots.loss_curve(loss[0], best_epoch=loss[1], labels=i18n.plot_labels(lang, "curves"))
    elif curves_frame is not None:
        curves_fig = plots.training_curves(curves_frame, labels=i18n.plot_labels(lang, "curves"))
    elif sweep_frame is not None:
        curves_fig = plots.training_curves(sweep_frame, x="alpha", labels=i18n.plot_labels(lang, "alpha_sweep"))
    else:
        curves_fig = plots.empty_figure(i18n.message(lang, "no_curves"))
    status = "\n\n".join([i18n.markdown(lang, "trained", name=name)] + report_lines.status_lines(lang, report))
    return status, curves_fig, table(results_in_words(lang, find_results(report))), _jsonable(report)


def results_in_words(lang: str, frame: pd.DataFrame | None) -> pd.DataFrame | None:
    """A metrics table (``name``, ``value``) as a person reads it: each metric's name in words in ``lang``
    (a method's unknown key with its underscores as spaces), and the length before normalising only when it
    differs from the length (an unnormalised vector listed the same number twice, issue #52)."""
    if frame is None or list(frame.columns) != ["name", "value"]:
        return frame
    values = dict(zip(frame["name"], frame["value"]))
    if "raw_norm" in values and "norm" in values and abs(values["raw_norm"] - values["norm"]) <= \
            1e-6 * max(abs(values["norm"]), 1e-12):
        frame = frame[frame["name"] != "raw_norm"]
    words = i18n.plot_labels(lang, "results")
    return pd.DataFrame({words["metric"]: [words.get(n, str(n).replace("_", " ")) for n in frame["name"]],
                         words["value"]: list(frame["value"])})


def train_panel(lang: str, made_for: dict, fields: tuple, name: str, report: dict) -> tuple:
    """(made-for element, status, curves, results, report) of one training run in ``lang``, from its report (no
    model work)."""
    return (panel_keys.made_for(lang, "train", made_for, fields),) + train_outputs(None, lang, name, report)


def probe_panel(lang: str, made_for: dict, frame, best) -> tuple:
    """(made-for element, per-layer probe chart) in ``lang``."""
    fig = plots.probe_layers(frame, best, labels=i18n.plot_labels(lang, "probe")) if len(frame) else \
        plots.empty_figure()
    return panel_keys.made_for(lang, "probe", made_for, tuple(made_for)), fig


def build_train_tab(backend: Service, num_layers: int | None = None) -> TrainTab:
    """The Train form, generated from the registered methods' settings dataclasses."""
    top = (num_layers or 128) - 1
    methods = backend.methods_schema()
    default = methods[0]["name"]  # the registry's first: mean difference, the quickest to train
    groups: dict[str, Any] = {}
    fields: list[tuple[str, Any, Any]] = []  # (method, spec, component), in form order
    from ..methods.base import get, specs

    with gr.Row():
        with gr.Column(scale=1, min_width=320):
            method = gr.Radio([m["name"] for m in methods], value=default, label=T("train.method"),
                              info=T("train.method_info"), elem_id="train-method")
            with gr.Row():
                auto_layer = gr.Checkbox(value=True, label=T("train.auto_layer"), elem_id="train-auto-layer")
                layer = gr.Slider(0, top, value=(num_layers or 12) // 2, step=1, label=T("train.layer"),
                                  elem_id="train-layer")
            # the buttons and the job's status (its progress bar) above the settings: under a tall form (TSV's is
            # ~2,000 px) the click and its progress were off-screen (issue #36)
            with gr.Column(elem_id="train-actions"):
                with gr.Row():
                    probe_btn = gr.Button(T("train.probe"), elem_id="train-probe")
                    train_btn = gr.Button(T("train.train"), variant="primary", elem_id="train-btn")
                    cancel_btn = gr.Button(T("train.cancel"), variant="stop", elem_id="train-cancel")
                status = gr.Markdown(T("train.empty"), elem_id="train-status")
            for m in methods:  # every setting of every method, its own control; the less common ones folded
                own = [spec for spec in specs(get(m["name"]).Settings) if spec.name != "layer"]
                with gr.Column(visible=m["name"] == default) as groups[m["name"]]:
                    with gr.Group():
                        for spec in (s for s in own if s.ui):
                            fields.append((m["name"], spec, setting_component(spec, m["name"])))
                    advanced = [s for s in own if not s.ui]
                    if advanced:
                        with gr.Accordion(T("train.advanced"), open=False,
                                          elem_id=f"train-{m['name']}-advanced".replace("_", "-")):
                            for spec in advanced:
                                fields.append((m["name"], spec, setting_component(spec, m["name"])))
        with gr.Column(scale=2):
            # what the probe chart and the training results were made from (ui/panel_keys.py)
            probe_key = gr.HTML(elem_id="probe-made-for", elem_classes="made-for-holder")
            probe_plot = gr.Plot(label=T("train.probe_chart"))
            train_key = gr.HTML(elem_id="train-made-for", elem_classes="made-for-holder")
            with gr.Row():
                curves = gr.Plot(label=T("train.curves"))
                results = gr.Dataframe(label=T("train.results"), interactive=False, wrap=True, headers=["name", "value"])
            with gr.Accordion(T("train.report"), open=False):
                probe_table = gr.Dataframe(label=T("train.probe_table"), interactive=False,
                                           headers=["layer", "auroc", "accuracy", "mean_diff_auroc", "cv_auroc"])
                report = gr.JSON(label=T("train.report"))

    tab = TrainTab(method=method, layer=layer, auto_layer=auto_layer, train=train_btn, status=status, curves=curves,
                   results=results, report=report, probe_plot=probe_plot, probe_table=probe_table,
                   train_key=train_key, probe_key=probe_key)
    key_controls = {"method": method, "auto_layer": auto_layer, "layer": layer} | {
        f"{name}.{spec.name}": component for name, spec, component in fields}
    position = next((c for name, spec, c in fields if name == default and spec.name == "position"), None)
    seed = next((c for name, spec, c in fields if name == default and spec.name == "seed"), None)

    def show_groups(chosen):
        return tuple(gr.update(visible=name == chosen) for name in groups)

    @handler(backend, status=status)
    async def probe_layers(position, seed, request: gr.Request):
        def work():
            result = backend.probe_layers(sid(request), position=position or "last", seed=seed)
            frame = pd.DataFrame(result.get("layers", []))
            best = result.get("best_layer")
            values = {f"{default}.position": position, f"{default}.seed": seed}  # the default method's, as wired
            key, fig = relabel.keep(backend, sid(request), [probe_key, probe_plot], probe_panel,
                                    panel_keys.key_of("probe", values, tuple(values)), frame, best)
            # one component: keep returns its one value (indexing it took the line's first character)
            line = relabel.keep(backend, sid(request), [status], *relabel.text("probed", layer=best)) \
                if best is not None else ""
            return (key, fig, table(frame), gr.update(value=best) if best is not None else gr.skip(),
                    gr.update(value=False) if best is not None else gr.skip(), line)

        async for out in follow(backend, request, status, work):
            yield out

    @handler(backend, status=status)
    async def train(data: dict, request: gr.Request):
        """The form's Train button; ``data`` maps every input component to its value (a set of inputs)."""
        def work():
            chosen = data[method]
            mine = [(spec, data[component]) for name, spec, component in fields if name == chosen]
            settings = form_values([s for s, _ in mine], [v for _, v in mine])
            name, result = backend.train(sid(request), chosen, None if data[auto_layer] else data[layer],
                                         settings=settings)
            choices = backend.vector_names(sid(request))
            values = {name_: data[component] for name_, component in key_controls.items()}
            key_fields = ("method", "auto_layer") + (() if data[auto_layer] else ("layer",)) + \
                tuple(name_ for name_ in key_controls if name_.startswith(f"{chosen}."))
            shown = relabel.keep(backend, sid(request), [train_key, status, curves, results, report], train_panel,
                                 panel_keys.key_of("train", values, key_fields), key_fields, name, result)
            trained = result.get("layer")  # the layer the method chose (auto) or was given: the slider says it
            at = gr.update(value=trained) if isinstance(trained, int) and not isinstance(trained, bool) else gr.skip()
            return shown + (at, gr.update(choices=picker_choices(choices), value=name))

        async for out in follow(backend, request, status, work):
            yield out

    def ready(request: gr.Request):
        """The status line for the session's data: what is loaded and that it can be trained on."""
        lang = lang_of(backend, request)
        try:
            info = backend.dataset_summary(sid(request))
        except UserError:
            return i18n.label(lang, "train.empty")
        return i18n.markdown(lang, "train_ready", name=info["name"], rows=info["rows"])

    method.change(show_groups, [method], list(groups.values()), api_name="train_method_options",
                  api_visibility="undocumented", queue=False)
    auto_layer.change(lambda auto: gr.update(interactive=not auto), [auto_layer], [layer], api_name="auto_layer",
                      api_visibility="undocumented", queue=False)
    probe_inputs = [c for c in (position, seed) if c is not None]
    # one progress line per job, the status under the buttons (ui/job_line.py): no output draws its own
    tab.probe_event = probe_btn.click(probe_layers, probe_inputs, [probe_key, probe_plot, probe_table, layer,
                                                                   auto_layer, status], api_name="probe_layers",
                                      show_progress="hidden", **MODEL)
    # Cancel runs outside the model queue (queue=False): it only raises a flag that the job's next progress
    # report sees (or its wait in line), so the job stops within a step and the session keeps what it had.
    cancel_btn.click(cancel_fn(backend), None, [status], api_name="cancel", queue=False)
    tab.train_inputs = {method, layer, auto_layer} | {c for _n, _s, c in fields}
    tab.train_fn = train
    tab.ready_fn = ready
    tab.train_outputs = [train_key, status, curves, results, report, layer]
    # the results answer to the method, its layer (unless chosen by the probe) and that method's own settings;
    # the probe chart to the default method's position and seed, which it runs with
    panel_keys.watch("train", key_controls)
    return tab
