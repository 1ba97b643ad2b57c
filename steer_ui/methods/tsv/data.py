"""TSV's rows: reading labelled answers, the prompt template, the held-out split, exemplars.

The template is user input (a form field, an API value) and, worse, comes
back from any imported vector's metadata, so it is never given to
``str.format`` (whose ``{question.__class__...}`` and ``{question:>999999999}``
reach attributes and allocate at will).  :func:`template_pieces` accepts
exactly the fields ``{question}`` and ``{answer}`` and :func:`_render` joins
literal text and values by hand.
"""
from __future__ import annotations

import random
import string
from functools import lru_cache
from typing import Sequence

import pandas as pd

from ...data import DatasetError, group_split

PROMPT_TEMPLATE = "Answer the question concisely. Q: {question} A:"
TEMPLATE_FIELDS = ("question", "answer")
MAX_TEMPLATE = 500  # characters: a QA prompt, not a document
CLASSES = ("hallucinated", "truthful")  # class index = label: 1 means truthful
SPLIT_ATTEMPTS = 20  # seeds tried until both sides of the split hold both classes


class TSVError(DatasetError):  # the CLI and the UI report DatasetError as a one-line message
    """A TSV request that cannot run as asked (bad data, bad settings)."""


# ---------------------------------------------------------------- template
@lru_cache(maxsize=64)
def template_pieces(template: str) -> tuple[tuple[str, str | None], ...]:
    """``template`` as (literal text, field or None) pieces; anything but ``{question}``/``{answer}`` is refused.

    ``{{`` and ``}}`` are literal braces.  ``{question}`` must appear;
    ``{answer}`` may appear once, after every ``{question}`` (the text before
    it is the prompt the answer continues).
    """
    if not isinstance(template, str):
        raise TSVError.from_key("tsv_template_type", type=type(template).__name__)
    if len(template) > MAX_TEMPLATE:
        raise TSVError.from_key("tsv_template_long", length=len(template), limit=MAX_TEMPLATE)
    try:
        parsed = list(string.Formatter().parse(template))  # parsing only: nothing is looked up or formatted
    except ValueError as exc:
        raise TSVError.from_key("tsv_template_braces", detail=str(exc)) from None
    pieces = []
    for literal, field, spec, conversion in parsed:
        if field is not None and (field not in TEMPLATE_FIELDS or spec or conversion):
            written = "{" + field + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
            raise TSVError.from_key("tsv_template_field", field=repr(written[:60]))
        pieces.append((literal, field))
    fields = [f for _, f in pieces if f is not None]
    if "question" not in fields:
        raise TSVError.from_key("tsv_template_question")
    if fields.count("answer") > 1 or ("answer" in fields and fields[-1] != "answer"):
        raise TSVError.from_key("tsv_template_answer")
    return tuple(pieces)


def _render(pieces, question: str, answer: str | None) -> str:
    """The template filled in; with ``answer=None``, only the prompt (the text before ``{answer}``)."""
    out = []
    for literal, field in pieces:
        out.append(literal)
        if field == "question":
            out.append(question)
        elif field == "answer":
            if answer is None:
                break
            out.append(answer)
    return "".join(out)


def _head(pieces) -> str:
    """The template's text before the first ``{question}`` (how a pre-formatted prompt starts)."""
    head = []
    for literal, field in pieces:
        head.append(literal)
        if field == "question":
            break
    return "".join(head).strip()


def prefix_text(prompt: str, template: str = PROMPT_TEMPLATE) -> str:
    """The prompt the model reads before the answer ('' for a statement); a pre-formatted prompt is kept."""
    prompt = str(prompt or "").strip()
    if not prompt:
        return ""
    pieces = template_pieces(template)
    head = _head(pieces)
    return prompt if head and prompt.startswith(head) else _render(pieces, prompt, None)


def format_text(prompt: str, answer: str, template: str = PROMPT_TEMPLATE) -> str:
    """The text the model reads: the QA template around the question, then the answer.

    Statements (no prompt) are read alone.  A prompt that already starts like
    the template is used as it is.
    """
    answer = str(answer).strip()
    prompt = str(prompt or "").strip()
    if not prompt:
        return answer
    pieces = template_pieces(template)
    head = _head(pieces)
    if head and prompt.startswith(head):
        return f"{prompt} {answer}"
    if any(field == "answer" for _, field in pieces):
        return _render(pieces, prompt, answer)
    return f"{_render(pieces, prompt, None)} {answer}"


# -------------------------------------------------------------------- rows
_TRUE = {"1", "true", "yes", "truthful", "correct", "t", "y"}
_FALSE = {"0", "false", "no", "hallucinated", "hallucination", "incorrect", "f", "n"}
_ANSWER_COLUMNS = ("completion", "answer", "statement", "text")
_PROMPT_COLUMNS = ("prompt", "question")


def _label_of(value, row: int) -> int:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float)) and value in (0, 1):
        return int(value)
    text = str(value).strip().lower()
    if text in _TRUE:
        return 1
    if text in _FALSE:
        return 0
    raise TSVError.from_key("tsv_label", row=row, value=value)


def _columns(frame: pd.DataFrame) -> tuple[str | None, str | None]:
    """(prompt column, answer column) of ``frame``, either None when absent."""
    cols = {str(c).lower(): c for c in frame.columns}
    answer_col = next((cols[c] for c in _ANSWER_COLUMNS if c in cols), None)
    prompt_col = next((cols[c] for c in _PROMPT_COLUMNS if c in cols), None)
    return prompt_col, answer_col


def rows_of(dataset) -> pd.DataFrame:
    """(prompt, completion, label, group) rows from a Dataset, a DataFrame or a list of tuples/dicts.

    Labelled statements count as answers with an empty prompt.
    """
    frame = getattr(dataset, "frame", dataset)
    if isinstance(frame, (list, tuple)):
        records = []
        for i, item in enumerate(frame):
            if isinstance(item, dict):
                records.append(item)
            elif isinstance(item, (list, tuple)) and len(item) in (2, 3, 4):
                if len(item) == 2:
                    records.append({"prompt": "", "completion": item[0], "label": item[1]})
                else:
                    rec = {"prompt": item[0], "completion": item[1], "label": item[2]}
                    if len(item) == 4:
                        rec["group"] = item[3]
                    records.append(rec)
            else:
                raise TSVError.from_key("tsv_row_shape", row=i, type=type(item).__name__)
        frame = pd.DataFrame(records)
    if not isinstance(frame, pd.DataFrame):
        raise TSVError.from_key("tsv_needs_labelled", type=type(dataset).__name__)
    cols = {c.lower(): c for c in frame.columns}
    if "positive" in cols and "negative" in cols and "label" not in cols:
        raise TSVError.from_key("tsv_not_pairs")
    prompt_col, answer_col = _columns(frame)
    if answer_col is None or "label" not in cols:
        raise TSVError.from_key("tsv_needs_columns", found=list(frame.columns))
    out = pd.DataFrame({
        "prompt": frame[prompt_col].fillna("").astype(str) if prompt_col else "",
        "completion": frame[answer_col].fillna("").astype(str),
        "label": [_label_of(v, i) for i, v in enumerate(frame[cols["label"]])],
    })
    if "group" in cols:
        out["group"] = frame[cols["group"]].astype(str).values
    else:
        out["group"] = [p if p.strip() else a for p, a in zip(out.prompt, out.completion)]
    empty = out.completion.str.strip() == ""
    if empty.any():
        raise TSVError.from_key("tsv_empty_answer", row=int(empty.idxmax()))
    if len(out) == 0:
        raise TSVError.from_key("tsv_no_rows")
    return out.reset_index(drop=True)


def has_labels(dataset) -> bool:
    """Whether ``dataset`` (a Dataset, frame, or list of tuples/dicts) carries a label per row."""
    frame = getattr(dataset, "frame", dataset)
    if isinstance(frame, pd.DataFrame):
        return "label" in {str(c).lower() for c in frame.columns}
    if not frame:
        return False
    first = frame[0]
    return (isinstance(first, dict) and "label" in first) or (isinstance(first, (list, tuple)) and len(first) >= 3)


def unlabelled_rows(dataset) -> pd.DataFrame:
    """(prompt, completion) rows of data without labels: (prompt, answer) pairs or a frame with an answer column."""
    frame = getattr(dataset, "frame", dataset)
    if isinstance(frame, (list, tuple)):
        return pd.DataFrame([{"prompt": p, "completion": a} for p, a in frame])
    prompt_col, answer_col = _columns(frame)
    if answer_col is None:
        raise TSVError.from_key("tsv_detect_needs_column", found=list(frame.columns))
    return pd.DataFrame({"prompt": frame[prompt_col].fillna("").astype(str) if prompt_col else "",
                         "completion": frame[answer_col].fillna("").astype(str)})


# ------------------------------------------------------------------- split
def split_groups(groups: Sequence[str], labels: Sequence[int], test_fraction: float = 0.25,
                 seed: int = 0) -> tuple[list[int], list[int]]:
    """(train rows, test rows) by the project's group split, both sides holding both classes.

    :func:`steer_ui.data.group_split` with ``seed``; when a side ends up with
    one class (few groups, most of them one-class), the next seeds are tried.
    """
    labels = list(labels)
    for attempt in range(SPLIT_ATTEMPTS):
        train, test = group_split(groups, labels, test_fraction, seed + 1000 * attempt)
        if len({labels[i] for i in train}) == 2 and len({labels[i] for i in test}) == 2:
            return train, test
    raise TSVError.from_key("tsv_split_one_class")


def subsample_groups(frame: pd.DataFrame, max_rows: int, seed: int = 0) -> pd.DataFrame:
    """Whole groups, drawn at random, until ``max_rows`` rows."""
    if len(frame) <= max_rows:
        return frame
    groups = sorted(frame.group.unique())
    random.Random(seed).shuffle(groups)
    keep, count = set(), 0
    sizes = frame.group.value_counts()
    for g in groups:
        if count + sizes[g] > max_rows and keep:
            continue
        keep.add(g)
        count += sizes[g]
        if count >= max_rows:
            break
    return frame[frame.group.isin(keep)].reset_index(drop=True)


def pick_exemplars(train: list[int], labels: Sequence[int], n: int, seed: int) -> list[int]:
    """``n`` training rows, with at least two of each class when the data allows."""
    rng = random.Random(seed + 7)
    order = train[:]
    rng.shuffle(order)
    n = min(n, len(order))
    chosen = order[:n]
    for cls in (0, 1):
        have = [i for i in chosen if labels[i] == cls]
        spare = [i for i in order[n:] if labels[i] == cls]
        while len(have) < 2 and spare:
            other = [i for i in chosen if labels[i] != cls]
            if len(other) <= 2:
                break
            chosen.remove(other[-1])
            chosen.append(spare.pop(0))
            have = [i for i in chosen if labels[i] == cls]
    if len({labels[i] for i in chosen}) < 2:
        raise TSVError.from_key("tsv_exemplars_one_class")
    return chosen
