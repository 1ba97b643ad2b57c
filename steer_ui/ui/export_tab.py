"""Export / Import: the selected vector in every format; vector files validated against the loaded model."""
from __future__ import annotations

import html
from dataclasses import dataclass

import gradio as gr

from ..formats import export_notes
from ..service import FORMATS, RANDOM, Service
from . import i18n, relabel
from .common import T, handler, lang_of, picker_choices, sid


@dataclass
class ExportTab:
    vector: gr.Dropdown
    fmt: gr.Radio
    files: gr.File
    export_status: gr.Markdown
    upload: gr.File
    import_status: gr.Markdown
    info: gr.JSON

    @property
    def relabelled(self) -> list:
        """The outputs a language switch redraws (ui/relabel.py)."""
        return [self.export_status, self.import_status]


def exported_markdown(lang: str, fmt: str, names: list[str], notes: list[str]) -> str:
    """The export's status line in ``lang``: the files written, then how approximate that copy is (e.g. an ITI
    vector leaving as residual-stream directions)."""
    text = i18n.markdown(lang, "exported", n=len(names), fmt=fmt, names=", ".join(names))
    for note in notes:
        text += f"\n\n⚠ {i18n.plain(i18n.say(lang, note))}"
    return text


def imported_markdown(lang: str, name: str, warnings: list[str]) -> str:
    """The import's status line in ``lang``, with what to check about the vector."""
    text = i18n.markdown(lang, "imported", name=name)
    for w in warnings:
        text += "\n\n" + i18n.markdown(lang, "import_warning", detail=w)
    return text


def build_export_tab(backend: Service) -> ExportTab:
    with gr.Row():
        with gr.Column():
            gr.Markdown(T("export.export_title"))
            vector = gr.Dropdown(choices=picker_choices([RANDOM]), value=RANDOM, allow_custom_value=True,
                                 label=T("export.vector"), elem_id="export-vector")
            fmt = gr.Radio(list(FORMATS), value="native", label=T("export.format"), info=T("export.format_info"),
                           elem_id="export-format")
            export_btn = gr.Button(T("export.export"), variant="primary", elem_id="export-btn")
            export_status = gr.Markdown(elem_id="export-status")
            files = gr.File(label=T("export.files"), file_count="multiple", interactive=False, elem_id="export-files")
        with gr.Column():
            gr.Markdown(T("export.import_title"))
            upload = gr.File(label=T("export.upload"), type="filepath", elem_id="import-file")
            import_status = gr.Markdown(elem_id="import-status")
            info = gr.JSON(label=T("export.info"), elem_id="import-info")
    tab = ExportTab(vector=vector, fmt=fmt, files=files, export_status=export_status, upload=upload,
                    import_status=import_status, info=info)

    @handler(backend, status=export_status)
    def export_vector(vector, fmt, request: gr.Request):
        written = backend.export_vector(sid(request), vector, fmt)
        notes = export_notes(backend.get_vector(sid(request), vector), fmt)
        return [str(p) for p in written], relabel.keep(backend, sid(request), [export_status], exported_markdown, fmt,
                                                       [p.name for p in written], notes)

    @handler(backend)
    def show_info(vector, request: gr.Request):
        return backend.vector_info(sid(request), vector)

    export_btn.click(export_vector, [vector, fmt], [files, export_status], api_name="export_vector")
    vector.change(show_info, [vector], [info], api_name="vector_info", api_visibility="undocumented")

    # a refused file empties the metadata panel: the previous vector's metadata beside the refusal read as the file's
    @handler(backend, status=import_status, clear=[info])
    def import_vector(path, request: gr.Request):
        session = sid(request)
        name, warnings = backend.import_vector(session, path)
        lang = lang_of(backend, request)
        for w in warnings:
            gr.Warning(i18n.message(lang, "import_warning", detail=html.escape(i18n.say(lang, w), quote=False)))
        text = relabel.keep(backend, session, [import_status], imported_markdown, name, list(warnings))
        picker = gr.update(choices=picker_choices(backend.vector_names(session)), value=name)
        return text, backend.vector_info(session, name), picker

    tab.import_fn = import_vector
    return tab


# Opening the tab picks the vector Explore shows, unless this tab's picker was set to another vector: a visitor
# who returns by link or reload and picks a vector in Explore exported the random direction (setting this hidden
# picker's value as the page loads did not reach it; its choices did).
JS_FOLLOW_EXPLORE = "(explored, chosen) => (!chosen || chosen === %s) ? explored : chosen" % repr(RANDOM)


def follow_explore(opened: gr.Tab, tab: ExportTab, explore_vector: gr.Dropdown) -> None:
    """When ``opened`` (the Export tab) is selected, its picker takes Explore's vector while it shows none of its own
    (in the browser: no request)."""
    opened.select(None, [explore_vector, tab.vector], [tab.vector], js=JS_FOLLOW_EXPLORE, queue=False)
