"""Detect: p(truthful) for typed or generated answers with a TSV vector; AUROC on a labelled file."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gradio as gr
import pandas as pd

from .. import plots
from ..service import RANDOM, Service, UserError
from . import i18n, panel_keys, relabel
from .common import T, handler, sid, table
from .job_line import follow


@dataclass
class DetectTab:
    vector: gr.Dropdown
    answers: gr.Dataframe
    file: gr.File
    summary: gr.Markdown
    scores: gr.Dataframe
    histogram: gr.Plot
    details: gr.JSON
    key: gr.HTML | None = None

    @property
    def relabelled(self) -> list:
        """The outputs a language switch redraws (ui/relabel.py)."""
        return [self.key, self.summary, self.histogram]


def _frame(value) -> pd.DataFrame:
    """The editable table's value as a frame (gradio sends a DataFrame, an API client may send rows)."""
    if value is None:
        return pd.DataFrame()
    return value if isinstance(value, pd.DataFrame) else pd.DataFrame(value)


def answers_from_table(value) -> list[tuple[str, str]]:
    """Rows (prompt, answer) from the editable table; blank answers are skipped."""
    frame = _frame(value)
    if frame.empty:
        return []
    if frame.shape[1] < 2:
        raise UserError("answers_table")
    rows = []
    for prompt, answer in frame.iloc[:, :2].itertuples(index=False):
        answer = "" if answer is None or (isinstance(answer, float) and pd.isna(answer)) else str(answer)
        prompt = "" if prompt is None or (isinstance(prompt, float) and pd.isna(prompt)) else str(prompt)
        if answer.strip():
            rows.append((prompt, answer))
    return rows


def table_rows(value) -> list[list]:
    """The answers table's cells as the page holds them (its stale check compares them)."""
    frame = _frame(value)
    return frame.astype(object).where(frame.notna(), None).values.tolist()


def detect_panel(lang: str, made_for: dict, n: int, auroc: float | None, frame: pd.DataFrame) -> tuple:
    """(made-for element, summary, score histogram) of one detection in ``lang``."""
    text = i18n.message(lang, "detect_summary", n=n, auroc="—" if auroc is None else f"{auroc:.3f}")
    fig = plots.detection_scores(frame, labels=i18n.plot_labels(lang, "detect")) if len(frame) else \
        plots.empty_figure()
    return panel_keys.made_for(lang, "detect", made_for), text, fig


def build_detect_tab(backend: Service) -> DetectTab:
    with gr.Row():
        with gr.Column(scale=1, min_width=320):
            vector = gr.Dropdown(choices=[], value=None, allow_custom_value=True, label=T("detect.vector"),
                                 info=T("detect.vector_info"), elem_id="detect-vector")
            answers = gr.Dataframe(headers=["prompt", "answer"], value=[["", ""]], column_count=(2, "fixed"),
                                   interactive=True, label=T("detect.answers"), wrap=True, elem_id="detect-answers")
            from_explore = gr.Button(T("detect.from_explore"), elem_id="detect-from-explore")
            file = gr.File(label=T("detect.file"), type="filepath", elem_id="detect-file")
            detect_btn = gr.Button(T("detect.run"), variant="primary", elem_id="detect-btn")
        with gr.Column(scale=2):
            detect_key = gr.HTML(elem_id="detect-made-for", elem_classes="made-for-holder")
            summary = gr.Markdown(T("detect.empty"), elem_id="detect-summary")
            scores = gr.Dataframe(label=T("detect.scores"), interactive=False, wrap=True,
                                  headers=["prompt", "answer", "score"])
            histogram = gr.Plot(label=T("detect.histogram"))
            with gr.Accordion(T("detect.details"), open=False):
                details = gr.JSON()
    tab = DetectTab(vector=vector, answers=answers, file=file, summary=summary, scores=scores, histogram=histogram,
                    details=details, key=detect_key)

    @handler(backend, status=summary)
    async def detect(vector, answers, file, request: gr.Request):
        """A long job like training: it waits in the server's line, and its summary line says for what
        (ui/job_line.py) until the scores arrive."""
        if not vector or vector == RANDOM:
            raise UserError("pick_tsv")
        pairs = None if file else answers_from_table(answers)

        def work():
            out = backend.detect(sid(request), vector, pairs, path=file)
            frame = pd.DataFrame(out.get("scores", []))
            made_for = panel_keys.key_of("detect", {"vector": vector, "answers": table_rows(answers),
                                                    "file": Path(file).name if file else None})
            key, text, fig = relabel.keep(backend, sid(request), [detect_key, summary, histogram], detect_panel,
                                          made_for, len(frame), out.get("auroc"), frame)
            return key, text, table(frame), fig, out

        async for shown in follow(backend, request, summary, work):
            yield shown

    @handler(backend)
    def use_generation(request: gr.Request):
        generation = backend.session(sid(request)).last_generation
        if not generation:
            raise UserError("no_generation")
        prompt = generation["prompt"]
        return [[prompt, generation["unsteered"]["text"]], [prompt, generation["steered"]["text"]]]

    # its own slots: scoring typed answers takes seconds and a refusal ("pick a TSV vector") none, so neither
    # waits behind another visitor's training or Concepts job in the "model" slot (issue #36)
    detect_btn.click(detect, [vector, answers, file], [detect_key, summary, scores, histogram, details],
                     api_name="detect", concurrency_id="detect", concurrency_limit=2, show_progress="hidden")
    panel_keys.watch("detect", {"vector": vector, "answers": answers, "file": file})
    from_explore.click(use_generation, None, [answers], api_name="answers_from_explore", api_visibility="undocumented")
    return tab
