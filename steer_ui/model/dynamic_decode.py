"""The dynamic decode path: Hugging Face's own KV cache, one column longer after each step.

:class:`DynamicDecode` holds a :class:`.generation.DecodeBatch`'s KV rows
with the same calls as :class:`.static_decode.StaticDecode` (``join``,
``keep``, ``set_steering``, ``step``, ``report``), so the batch runs either
path without asking which.  This one is the default off CUDA: eagerly it is
the faster step, since it attends to real columns only and adds steering at
the steered blocks only (docs/bench.md, "The decode path").

Rows join by left padding (:func:`.kv_rows.join`); when the longest prompt
leaves, the columns that are padding in every remaining row are dropped.  The
attention mask goes to the model only while some row has padding: without
one, the model takes its plain causal path, as a request alone does, so a
request gets the same tokens alone and in a batch.
"""
from __future__ import annotations

import torch

from . import kv_rows
from .capture import recording
from .hooks import StepState, between_blocks, steering


class DynamicDecode:
    """The rows' dynamic KV cache, their attention mask and next positions, and the steering of the next step.

    Rows are in the batch's order (three per request).  Not thread-safe: the
    batch's thread drives it (the steering hooks act in that thread only).
    """

    path = "dynamic"

    def __init__(self, handle):
        self.handle = handle
        self.cache = None
        self.columns = 0  # KV columns every row has consumed (real tokens at the right, padding at the left)
        self.mask: torch.Tensor | None = None  # (rows, columns): 1 where a column is a real token of that row
        self.positions: torch.Tensor | None = None  # (rows,): each row's next position id
        self.padded = False  # some row has padding columns (then every pass needs the attention mask)
        self._steers: list = []
        self._final_block = handle.arch.num_layers - 1

    @property
    def can_join(self) -> bool:
        """Whether new rows can join now: always when empty, else when the cache's layout allows it."""
        return self.cache is None or kv_rows.joinable(self.cache)

    def report(self, reason: str) -> dict:
        return {"path": self.path, "reason": reason}

    def join(self, cache, columns: int, mask: torch.Tensor, positions: torch.Tensor, reserve: int,
             twins: list[tuple[int, int]] | None = None) -> None:
        """Append rows from a prefill: their KV (``cache``, ``columns`` left-padded columns), attention ``mask``
        (rows, columns) and next position ids (rows,).  ``reserve`` (steps to come) does not matter here: the
        cache grows as it goes; nor do ``twins`` (:meth:`set_steering`)."""
        if self.cache is None:
            self.cache, self.columns, self.mask, self.positions = cache, columns, mask, positions
        else:
            total = kv_rows.join(self.cache, self.columns, cache, columns)

            def widen(m):
                return torch.cat([m.new_zeros((m.shape[0], total - m.shape[1])), m], dim=1)

            self.mask = torch.cat([widen(self.mask), widen(mask)])
            self.columns = total
            self.positions = torch.cat([self.positions, positions])
        self.padded = bool((self.mask == 0).any())

    def keep(self, rows: list[int]) -> None:
        """Keep only ``rows`` (indices into the current row order, in the new order)."""
        if not rows:  # an empty batch starts again from nothing
            self.cache = self.mask = self.positions = None
            self.columns = 0
            self.padded = False
            return
        index = torch.tensor(rows, device=self.mask.device)
        kv_rows.keep_rows(self.cache, index)
        self.mask = self.mask.index_select(0, index)
        self.positions = self.positions.index_select(0, index)
        # columns that are padding in every remaining row (the longest prompt left) need not be attended to
        used = self.mask.any(dim=0)
        lead = int(used.int().argmax()) if bool(used.any()) else 0
        if lead and kv_rows.joinable(self.cache):
            self.columns = kv_rows.drop_leading(self.cache, self.columns, lead)
            self.mask = self.mask[:, lead:]
        self.padded = bool((self.mask == 0).any())

    def set_steering(self, steers: list, twins: list[tuple[int, int]] | None = None) -> None:
        """The steers (one (rows, hidden) matrix per steered block, per-head shifts) the next steps add.  ``twins``
        (rows that equal others in the first blocks, :meth:`.fused_decode.FusedDecode.set_steering`): this path
        computes every row."""
        self._steers = steers

    def step(self, next_ids: torch.Tensor, pause=None) -> tuple[torch.Tensor, torch.Tensor]:
        """One decode step: feed each row its ``next_ids`` (rows, 1); returns the rows' (last hidden, final
        block output), each (rows, hidden).  ``pause`` is called before each decoder block."""
        handle = self.handle
        self.mask = torch.cat([self.mask, self.mask.new_ones((self.mask.shape[0], 1))], dim=1)
        state = StepState(prompt_len=0, offset=self.columns)  # every position from here on is a generated one
        with torch.inference_mode(), \
                recording(handle, [self._final_block], "resid", reduce=lambda h: h[:, -1, :]) as final, \
                steering(handle, self._steers, state), between_blocks(handle, pause):
            out = handle.model.base_model(input_ids=next_ids, attention_mask=self.mask if self.padded else None,
                                          position_ids=self.positions.unsqueeze(1), past_key_values=self.cache,
                                          use_cache=True)
        self.cache = out.past_key_values
        self.columns += 1
        self.positions = self.positions + 1
        return out.last_hidden_state[:, -1, :], final[self._final_block]
