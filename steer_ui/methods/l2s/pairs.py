"""L2S's input: contrastive pairs ``(prompt, positive, negative, group)`` from any of the shapes users have."""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd


class L2SError(ValueError):
    """An L2S request that cannot be carried out (bad data, layers, vector)."""


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
                raise L2SError(f"pair {i}: column '{col}' must be text, found {type(value).__name__}")
        if not prompt.strip():
            raise L2SError(f"pair {i}: L2S needs a prompt (the input it predicts a vector from); the prompt is empty")
        if not pos.strip() or not neg.strip():
            raise L2SError(f"pair {i}: empty positive or negative completion")
        if pos == neg:
            raise L2SError(f"pair {i}: positive and negative completions are identical ('{pos}')")
        group = str(getattr(row, "group", "") or prompt)
        pairs.append(Pair(prompt, pos, neg, group))
    if not pairs:
        raise L2SError("no contrastive pairs given")
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
            raise L2SError(f"pairs need columns prompt, positive, negative; missing {missing} "
                           f"(found {list(dataset.columns)})")
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
            raise L2SError(f"pair {i}: expected (prompt, positive, negative[, group]), found {item!r:.80}")
    return pd.DataFrame(rows, columns=["prompt", "positive", "negative", "group"])


def join_text(prompt: str, completion: str) -> tuple[str, str]:
    """Prompt and completion as they are concatenated: a space is inserted when neither side has one."""
    if prompt and not prompt[-1].isspace() and completion and not completion[0].isspace():
        completion = " " + completion
    return prompt, completion
