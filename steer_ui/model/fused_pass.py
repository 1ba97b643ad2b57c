"""Blocks above a cached prefix re-run in one C call a block (``block_kernel.c``): the slider, sweeps, α grids.

A slider move or a sweep re-runs blocks L+1.. of the model on every position of the prompt, once per α (the
steering changes every position's residual, and the last position attends to them all).  Through Hugging Face's
modules each block is some twenty torch operators a call, over tensors of rows × positions; here it is the fused
decode step's kernel (:class:`.fused_decode.Blocks`), fed each position as a row of its own: row (r, t) at
column t of store row r, so it attends to positions 0..t of its own α's row, whose keys and values the same call
wrote.  The final block's MLP runs on the last positions only (what :meth:`.prefix.Prefix.logits` reads), as
the torch path's ``_last_position_mlp`` does.

The arithmetic is the fused decode step's: the same int8 products as the torch path, the norms, rope, attention
and activation summed in another order, so the two paths agree to float32 rounding (tests/unit/test_fused_pass.py
bounds it), and every row is computed alone, so a row's logits do not depend on the rows beside it: a sweep's
row equals the slider's one-row call at the same α bit for bit.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch

from .fused_decode import Blocks, _packed_kernel, unsupported
from .hooks import Steer, StepState, apply_steers
from .int8 import int8_weights
from .switches import Setting

_ON = Setting(True)  # modules_only() turns it off


@contextmanager
def modules_only():
    """Inside, prefixes re-run their blocks through the model's modules (A/B runs and tests)."""
    with _ON.held(False):
        yield


def _blocks(handle) -> tuple[Blocks | None, str | None]:
    """(the model's blocks for the kernel, None) or (None, why not), kept on the handle while its int8 weights'
    paths stay as they were (a tool may switch a product's activations; the kept blocks hold the addresses of
    the packed codes that path reads).  Checking a model is ~2 ms and building the blocks ~1 ms, against a
    slider move's ~15: so not once a move."""
    kept = handle.__dict__.get("_fused_pass")
    weights = kept[0] if kept else int8_weights(handle.model)
    key = tuple((w.w8a8, w.w8a16, id(w.packed)) for w in weights)
    if kept and kept[1] == key:
        return kept[2], kept[3]
    reason = unsupported(handle)
    blocks = Blocks(handle) if reason is None else None
    handle.__dict__["_fused_pass"] = (weights, key, blocks, reason)
    return blocks, reason


def why_not(prefix, later=()) -> str | None:
    """Why :func:`final_last` cannot re-run ``prefix``'s blocks with the ``later`` steers (at blocks above the
    prefix's) between them (then the torch modules do), or None."""
    if not _ON.value:
        return "the modules asked for (modules_only)"
    if any(not isinstance(s, Steer) or s.fn is not None for s in later):
        return "a per-head or input-dependent steer above the prefix (the modules' hooks add those)"
    _, reason = _blocks(prefix.handle)
    if reason:
        return reason
    mask = prefix.attention_mask
    if mask is not None and not bool(mask.all()):
        return "a left-padded batch (the pass takes prompts of one length, positions counted from 0)"
    return None


# the most scratch floats one call works in (128 MB): a long prompt's attention scores grow with its length squared,
# so a sweep over one is run a few α rows at a time (rows are computed alone: the same numbers)
SCRATCH_FLOATS = 32 * 2**20


def final_last(prefix, h: torch.Tensor, later=(), state: StepState | None = None) -> torch.Tensor:
    """(rows, width) float: blocks ``prefix.layer + 1``.. run on ``h`` (rows, positions, width), the block L
    output with its steering added, and the final block's output at the last position (before the final norm).
    ``later``: residual steers at blocks above L, added to their block's output as the steering hook adds them
    (:func:`.hooks.apply_steers`, with the pass's ``state``).  No gradients flow through it:
    :meth:`.prefix.Prefix.final` (training) keeps the modules."""
    model, reason = _blocks(prefix.handle)
    if model is None:
        raise ValueError(f"the fused pass cannot run this model: {reason}")
    rows, positions, width = h.shape
    per_row = model.scratch_floats(positions, width, positions)
    step = max(1, SCRATCH_FLOATS // max(per_row, 1))
    if step >= rows:
        return _final_last(prefix, model, h, later, state)
    out = []
    for i in range(0, rows, step):
        part = torch.arange(i, min(i + step, rows))
        special = None if state is None or state.special is None else \
            state.special if state.special.shape[0] == 1 else state.special.index_select(0, part)
        out.append(_final_last(prefix, model, h[i:i + step], [s.rows_of(part) for s in later],
                               StepState(prompt_len=None, special=special)))
    return torch.cat(out)


def _final_last(prefix, model: Blocks, h: torch.Tensor, later=(), state: StepState | None = None) -> torch.Tensor:
    handle = prefix.handle
    rows, positions, width = h.shape
    n = rows * positions
    x = h.float().reshape(n, width).clone()  # the kernel writes its rows in place; h may be the prefix's own
    rope = model.rope(handle, x, torch.arange(positions).unsqueeze(0), repeat=rows)
    shape = (rows, model.kv_heads, positions, model.head_dim)
    keys, values = torch.empty(shape), torch.empty(shape)  # every block writes all its columns before reading
    columns = torch.arange(positions, dtype=torch.int64).repeat(rows)
    stores = torch.arange(rows, dtype=torch.int64).repeat_interleave(positions)
    start = torch.zeros(rows, dtype=torch.int64)
    last = torch.arange(1, rows + 1, dtype=torch.int64) * positions - 1
    scratch = model.scratch(n, width, positions)
    packed = _packed_kernel()
    final = len(model.blocks) - 1
    by_block: dict[int, list] = {}
    for s in later:
        by_block.setdefault(s.layer, []).append(s)
    with torch.inference_mode():
        for i in range(prefix.layer + 1, final + 1):
            cos, sin = rope[model.kinds[i]]
            model.run(i, n, x, cos, sin, keys, values, columns, stores, start, None,
                      last if i == final else None, scratch, packed)
            if i in by_block:  # after the block, as the steering hook on its output adds them
                x = apply_steers(by_block[i], state or StepState(), x.view(rows, positions, width)) \
                    .reshape(n, width).contiguous()
    return x.index_select(0, last)
