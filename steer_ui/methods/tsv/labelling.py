"""Generate-and-label: the model answers the questions, and each answer is labelled against the references.

TSV's unlabelled rows should be the model's own answers (their truthfulness
is what detection scores), so given TruthfulQA-style questions with correct
and incorrect references, :func:`generate_and_label` answers each greedily
and labels the answer lexically (:mod:`steer_ui.lexical`).
"""
from __future__ import annotations

import pandas as pd
import torch

from ...lexical import label_answer, split_references
from ..base import Progress, noop
from .data import PROMPT_TEMPLATE, TSVError, prefix_text, rows_of


def question_table(questions) -> pd.DataFrame:
    """(question, correct, incorrect) from a TruthfulQA-style frame or labelled (prompt, completion, label) rows."""
    frame = getattr(questions, "frame", questions)
    if isinstance(frame, (list, tuple)):
        if all(isinstance(q, str) for q in frame):
            raise TSVError("generate-and-label needs reference answers, not questions alone")
        frame = rows_of(frame)
    cols = {c.lower().replace("_", " "): c for c in frame.columns}
    if "question" in cols and ("correct answers" in cols or "best answer" in cols):
        out = []
        for _, r in frame.iterrows():
            correct = split_references(r[cols["correct answers"]]) if "correct answers" in cols else []
            if "best answer" in cols:
                correct = split_references(r[cols["best answer"]])[:1] + correct
            incorrect = split_references(r[cols["incorrect answers"]]) if "incorrect answers" in cols else []
            out.append({"question": str(r[cols["question"]]).strip(), "correct": correct, "incorrect": incorrect})
        return pd.DataFrame(out)
    rows = rows_of(frame)
    if (rows.prompt.str.strip() == "").all():
        raise TSVError("generate-and-label needs questions (a prompt/question column), not bare statements")
    out = []
    for q, g in rows.groupby("prompt", sort=False):
        out.append({"question": q, "correct": g.completion[g.label == 1].tolist(),
                    "incorrect": g.completion[g.label == 0].tolist()})
    return pd.DataFrame(out)


def clean_answer(text: str) -> str:
    """Cut a generated answer at the first newline or at a new 'Q:' (the model starting another question)."""
    text = text.split("\n")[0]
    for marker in ("Q:", "A:", "Answer the question"):
        if marker in text:
            text = text.split(marker)[0]
    return text.strip()


def generate_and_label(handle, questions_frame, progress: Progress | None = None, max_new_tokens: int = 32,
                       batch_size: int = 8, metric: str = "rouge_l", threshold: float = 0.5,
                       template: str = PROMPT_TEMPLATE, max_questions: int | None = None) -> pd.DataFrame:
    """Answer each question greedily with ``template`` and label the answer lexically against the references.

    Returns a frame with prompt (the question), completion (the answer),
    label (1 truthful), group, the similarity to the best correct and best
    incorrect reference, and the references used, ready for :func:`train`.
    """
    progress = progress or noop
    table = question_table(questions_frame)
    table = table[table.question.str.strip() != ""].reset_index(drop=True)
    if max_questions:
        table = table.iloc[:max_questions]
    if table.empty:
        raise TSVError("no questions to answer")
    if not any(len(c) for c in table.correct):
        raise TSVError("generate-and-label needs correct reference answers for the questions")
    tok = handle.tokenizer
    answers: list[str] = []
    eos = tok.eos_token_id
    for start in range(0, len(table), batch_size):
        qs = table.question.iloc[start:start + batch_size].tolist()
        prompts = [prefix_text(q, template) for q in qs]
        enc = tok(prompts, return_tensors="pt", padding=True).to(handle.input_device)
        with handle.lock, torch.inference_mode():
            out = handle.model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
                                        pad_token_id=tok.pad_token_id, eos_token_id=eos,
                                        temperature=None, top_p=None, top_k=None)
        for row in out[:, enc.input_ids.shape[1]:]:
            answers.append(clean_answer(tok.decode(row, skip_special_tokens=True)))
        progress(min(1.0, (start + len(qs)) / len(table)), f"answered {start + len(qs)}/{len(table)} questions")
    labelled = [label_answer(a, c, i, metric=metric, threshold=threshold)
                for a, c, i in zip(answers, table.correct, table.incorrect)]
    result = pd.DataFrame({
        "prompt": table.question,
        "completion": answers,
        "label": [lab for lab, _, _ in labelled],
        "group": table.question,
        "similarity_correct": [sc for _, sc, _ in labelled],
        "similarity_incorrect": [si for _, _, si in labelled],
        "correct_answers": ["; ".join(c) for c in table.correct],
        "incorrect_answers": ["; ".join(i) for i in table.incorrect],
    })
    empty = result.completion.str.strip() == ""
    result.attrs["metric"] = metric
    result.attrs["empty_answers"] = int(empty.sum())
    return result[~empty].reset_index(drop=True)
