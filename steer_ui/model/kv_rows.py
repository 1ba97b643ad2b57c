"""Row surgery on a Hugging Face KV cache: join two batches, drop rows, trim columns.

Continuous batching needs rows to enter and leave a running decode.  A batch
here is a cache whose every row has consumed the same number of *columns*;
a row's real tokens sit at the right end of them and the columns before are
padding, masked out by the attention mask (so a row sees the positions and
keys it would see alone).  Joining a batch of ``T`` columns with one of
``P`` pads the shorter on the left to ``max(T, P)`` and stacks the rows.

Only the dynamic cache layers transformers uses for decoder models are
handled: full attention (``DynamicLayer``, keys ``(rows, heads, T, dim)``)
and sliding-window attention (``DynamicSlidingWindowLayer``, which keeps the
last ``window − 1`` columns and counts all of them in
``cumulative_length``).  Anything else (quantised, offloaded, linear
attention, KV sharing) is reported by :func:`joinable` and the engine then
lets a new request wait for the running batch to finish instead.
"""
from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer, DynamicSlidingWindowLayer

_KINDS = (DynamicLayer, DynamicSlidingWindowLayer)


def joinable(cache: Cache) -> bool:
    """Whether rows can be added to and trimmed from ``cache`` by this module."""
    layers = getattr(cache, "layers", None)
    return (bool(layers) and not getattr(cache, "offloading", False)
            and all(type(layer) in _KINDS and layer.is_initialized for layer in layers))


def _stored(layer, columns: int) -> int:
    """How many of ``columns`` consumed columns ``layer`` keeps (a sliding layer keeps the last window − 1)."""
    if isinstance(layer, DynamicSlidingWindowLayer):
        return min(columns, layer.sliding_window - 1)
    return columns


def _pad_left(x: torch.Tensor, width: int) -> torch.Tensor:
    missing = width - x.shape[-2]
    if missing <= 0:
        return x
    pad = x.new_zeros(x.shape[:-2] + (missing, x.shape[-1]))
    return torch.cat([pad, x], dim=-2)


def join(cache: Cache, columns: int, other: Cache, other_columns: int) -> int:
    """Append ``other``'s rows to ``cache`` (in place), both padded on the left; returns the joined column count."""
    total = max(columns, other_columns)
    joined = []  # built in full before any layer changes, so a failure (out of memory) leaves ``cache`` intact
    for mine, theirs in zip(cache.layers, other.layers):
        width = _stored(mine, total)
        joined.append((torch.cat([_pad_left(mine.keys, width), _pad_left(theirs.keys, width)], dim=0),
                       torch.cat([_pad_left(mine.values, width), _pad_left(theirs.values, width)], dim=0)))
    for mine, (keys, values) in zip(cache.layers, joined):
        mine.keys, mine.values = keys, values
        if isinstance(mine, DynamicSlidingWindowLayer):
            mine.cumulative_length = total
    return total


def keep_rows(cache: Cache, rows: torch.Tensor) -> None:
    """Keep only ``rows`` (a long tensor of row indices, in the new order)."""
    for layer in cache.layers:
        layer.keys = layer.keys.index_select(0, rows.to(layer.keys.device))
        layer.values = layer.values.index_select(0, rows.to(layer.values.device))


def drop_leading(cache: Cache, columns: int, count: int) -> int:
    """Drop the first ``count`` of ``columns`` columns (padding in every row); returns the new column count."""
    left = columns - count
    for layer in cache.layers:
        width = _stored(layer, left)
        layer.keys = layer.keys[:, :, layer.keys.shape[-2] - width:, :]
        layer.values = layer.values[:, :, layer.values.shape[-2] - width:, :]
        if isinstance(layer, DynamicSlidingWindowLayer):
            layer.cumulative_length = left
    return left
