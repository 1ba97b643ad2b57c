"""L2S's input: contrastive pairs ``(prompt, positive, negative, group)`` from any of the shapes users have."""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from ...messages import KeyedError


class L2SError(KeyedError):
    """An L2S request that cannot be carried out (bad data, layers, vector); by key where it has one, so a front
    says it in the visitor's language (the English is the exception's own)."""


@dataclass
class Pair:
    prompt: str
    positive: str
    negative: str
    group: str = ""


def as_pairs(dataset) -> list[Pair]:
    """Contrastive pairs from a ``Dataset`` (pairs, or labelled kinds paired within groups), a DataFrame with
    prompt/positive/negative columns, or a list of ``(prompt, positive, negative[, group])`` tuples / dicts."""
    frame = pairs_frame(dataset)
    pairs = []
    for i, row in enumerate(frame.itertuples(index=False), start=1):
        prompt, pos, neg = row.prompt, row.positive, row.negative
        for col, value in (("prompt", prompt), ("positive", pos), ("negative", neg)):
            if not isinstance(value, str):
                raise L2SError.from_key("l2s_pair_not_text", row=i, column=col, type=type(value).__name__)
        if not prompt.strip():
            raise L2SError.from_key("l2s_pair_no_prompt", row=i)
        if not pos.strip() or not neg.strip():
            raise L2SError.from_key("l2s_pair_empty", row=i)
        if pos == neg:
            raise L2SError.from_key("l2s_pair_identical", row=i, text=pos)
        group = str(getattr(row, "group", "") or prompt)
        pairs.append(Pair(prompt, pos, neg, group))
    if not pairs:
        raise L2SError.from_key("l2s_no_pairs")
    return pairs


def pairs_frame(dataset) -> pd.DataFrame:
    """A frame with prompt/positive/negative(/group) columns from any input :func:`as_pairs` takes (unchecked)."""
    kind = getattr(dataset, "kind", None)
    if kind is not None:  # steer_ui.data.Dataset
        if kind != "pairs":
            dataset = dataset.as_pairs()
        return dataset.frame
    if isinstance(dataset, pd.DataFrame):
        missing = [c for c in ("prompt", "positive", "negative") if c not in dataset.columns]
        if missing:
            raise L2SError.from_key("l2s_pairs_columns", missing=missing, found=list(dataset.columns))
        return dataset
    rows = []
    for i, item in enumerate(dataset, start=1):
        if isinstance(item, Pair):
            rows.append(vars(item))
        elif isinstance(item, dict):
            rows.append({k: item.get(k) for k in ("prompt", "positive", "negative", "group")})
        elif isinstance(item, (tuple, list)) and len(item) in (3, 4):
            rows.append(dict(zip(("prompt", "positive", "negative", "group"), item)))
        else:
            raise L2SError.from_key("l2s_pair_shape", row=i, item=f"{item!r:.80}")
    return pd.DataFrame(rows, columns=["prompt", "positive", "negative", "group"])


def join_text(prompt: str, completion: str) -> tuple[str, str]:
    """Prompt and completion as they are concatenated: a space is inserted when neither side has one."""
    if prompt and not prompt[-1].isspace() and completion and not completion[0].isspace():
        completion = " " + completion
    return prompt, completion
