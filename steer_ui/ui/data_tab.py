"""Data: upload (or pick a bundled) dataset; schema, preview, class balance, group split, problems in plain words."""
from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from .. import plots
from ..service import Service
from . import i18n, relabel
from .common import T, handler, sid, table

SCHEMAS = ["auto", "statements", "answers", "truthfulqa", "pairs", "caa"]


@dataclass
class DataTab:
    file: gr.File
    bundled: gr.Dropdown
    schema: gr.Dropdown
    summary: gr.Markdown
    preview: gr.Dataframe
    balance: gr.Plot
    info: gr.JSON

    @property
    def relabelled(self) -> list:
        """The outputs a language switch redraws (ui/relabel.py)."""
        return [self.summary, self.balance]


def summary_markdown(lang: str, info: dict) -> str:
    text = i18n.markdown(lang, "dataset_summary", name=info["name"], kind=info.get("kind") or "?", rows=info["rows"],
                        columns=", ".join(info["columns"]))
    for warning in info.get("warnings", []):
        text += "\n\n" + i18n.markdown(lang, "dataset_warning", detail=warning)
    return text


def data_panel(lang: str, summary: dict, balance) -> tuple:
    """(summary, class-balance chart) of the loaded dataset in ``lang``."""
    return summary_markdown(lang, summary), plots.class_balance(balance, labels=i18n.plot_labels(lang, "balance"))


def build_data_tab(backend: Service) -> DataTab:
    with gr.Row():
        # No file_types filter: gradio would refuse other files with its own untranslated message; the data
        # module names the file and the problem (pickle, binary, wrong columns) in plain words instead.
        file = gr.File(label=T("data.file"), type="filepath", scale=2, elem_id="data-file")
        with gr.Column(scale=1):
            bundled = gr.Dropdown(choices=backend.bundled_datasets(), value=None, label=T("data.bundled"),
                                  allow_custom_value=True, elem_id="data-bundled")
            schema = gr.Dropdown(choices=SCHEMAS, value="auto", allow_custom_value=True, label=T("data.schema"),
                                 info=T("data.schema_info"))
            use_bundled = gr.Button(T("data.use_bundled"), elem_id="data-use-bundled")
    summary = gr.Markdown(T("data.empty"), elem_id="data-summary")
    with gr.Row():
        preview = gr.Dataframe(label=T("data.preview"), interactive=False, wrap=True, elem_id="data-preview",
                               headers=["prompt", "label"],
                               max_height=420, scale=2)
        balance = gr.Plot(label=T("data.balance"), scale=1)
    with gr.Accordion(T("data.details"), open=False):
        info = gr.JSON(label=T("data.details"))
    tab = DataTab(file=file, bundled=bundled, schema=schema, summary=summary, preview=preview, balance=balance,
                  info=info)

    def view(request):
        session = sid(request)
        summary_ = backend.dataset_summary(session)
        text, chart = relabel.keep(backend, session, [summary, balance], data_panel, summary_,
                                   backend.class_balance(session))
        return text, table(backend.dataset_preview(session)), chart, summary_

    @handler(backend)
    def upload_dataset(file, schema, request: gr.Request):
        backend.upload_dataset(sid(request), file, schema)
        return view(request)

    @handler(backend)
    def bundled_dataset(name, schema, request: gr.Request):
        backend.upload_dataset(sid(request), None, schema, bundled=name)
        return view(request)

    outputs = [summary, preview, balance, info]
    # .upload, not .change: clearing the file box must not look like a failed upload.  The events, for the tabs
    # that follow the data (Train's status line)
    tab.loaded_events = [file.upload(upload_dataset, [file, schema], outputs, api_name="upload_dataset"),
                         use_bundled.click(bundled_dataset, [bundled, schema], outputs, api_name="bundled_dataset")]
    return tab
