"""The unsteered side a session decoded last, kept for its next generation of the same prompt and sampling.

The page's loop is: move α, generate, compare.  Each generation decodes three rows (unsteered, steered,
counterfactual), and the unsteered one is the same every time: the model without steering, on the same prompt,
with the same sampling and seed (its noise is the request's, drawn per step whatever rows it has).  So a session
keeps the unsteered side of its generations that ran to their end, and a generation that finds its own there
decodes the steered and counterfactual rows only, showing the kept side at once.

What it equals: on the fused CPU step every row is computed alone and prompts are never padded, so the kept
side is bit for bit what decoding the row again would give (``tests/unit/test_unsteered_memo.py`` checks it);
elsewhere (a GPU's batch pads prompts) it is what a decode of this request gave, within the float rounding by
which batches differ there.  Kept per session, not shared: a side another visitor's prompt made would tell,
by its speed, which prompts others had typed.
"""
from __future__ import annotations

import copy
import dataclasses
import weakref
from collections import OrderedDict

MEMO = "unsteered_memo"  # Session.cache key
KEPT = 8  # sides a session keeps (a prompt and sampling each; the oldest goes first)
# Sampling's fields that change only the steered or counterfactual rows, or which rows run
_NOT_UNSTEERED = ("max_delta_logit", "unsteered", "counterfactual")


def key(prompt: str, sampling) -> tuple | None:
    """What the unsteered side depends on beside the model, or None where it cannot be kept or reused (the
    request does not decode it, or measures its first token against the steered one, which needs its row)."""
    if not sampling.unsteered or sampling.measure:
        return None
    fields = dataclasses.asdict(sampling)
    return (prompt,) + tuple((name, _hashable(value)) for name, value in sorted(fields.items())
                             if name not in _NOT_UNSTEERED)


def recall(cache: dict, handle, memo_key: tuple | None):
    """A copy of the kept unsteered side for ``memo_key`` on ``handle``'s model, or None."""
    if memo_key is None:
        return None
    kept = cache.get(MEMO)
    entry = kept.get(memo_key) if kept is not None else None
    if entry is None or entry[0]() is not handle:  # another model since: its side says nothing
        return None
    kept.move_to_end(memo_key)
    return copy.deepcopy(entry[1])


def remember(cache: dict, handle, memo_key: tuple | None, side) -> None:
    """Keep a copy of ``side``, the finished unsteered side of a generation that ran to its end."""
    if memo_key is None or side.finished is None:
        return
    kept = cache.setdefault(MEMO, OrderedDict())
    kept[memo_key] = (weakref.ref(handle), copy.deepcopy(side))
    kept.move_to_end(memo_key)
    while len(kept) > KEPT:
        kept.popitem(last=False)


def _hashable(value):
    return tuple(value) if isinstance(value, (list, tuple)) else value
