"""A decode step over a static, pre-allocated KV store: capturable once (CUDA graph), replayed every step.

The dynamic path (:class:`~.dynamic_decode.DynamicDecode`) decodes with Hugging Face's cache:
every step concatenates one column onto every layer's keys and values, builds
an attention mask of a new width, and installs Python steering hooks.  Shapes
change every step, so a step cannot be captured, and on a GPU the launch of a
few hundred small kernels per step costs several times the reading of the
weights.  :class:`StaticDecode` keeps every tensor a step touches at a fixed
address and shape, so the whole step can be recorded once as a CUDA graph and
replayed:

* **KV store** (:class:`SlotCache`): per layer, keys and values of shape
  ``(slots, kv_heads, max_len, head_dim)``.  A *slot* is one batch row; the
  batch's rows (three per request) map to slots (``row_slots``), so a joining
  request's prefill KV is copied into free slots and a leaving one frees its
  slots, with no other row moved.  Every slot consumes the same *column* per
  step (the one write index, a device tensor), as the dynamic path's rows
  do; a row's real tokens sit right-aligned before it and the columns before
  them are masked, exactly the dynamic cache's left padding.
* **Sliding-window layers** keep ``max_len`` columns too, and their window
  is a mask (key column ``> column − window``, HF's own rule), not a ring
  buffer: one write index for every layer, and joins, leaves and
  compaction are the same copy for every layer.  The cost is memory for
  columns a sliding layer never reads again.
* **Masks** are built inside the step from a ``(slots, max_len)`` validity
  buffer and the column, and passed to the model as prepared 4-D masks
  (a dict by layer type where a model mixes full and sliding layers), which
  transformers uses as given.
* **Steering** is a buffer read: one ``(slots, hidden)`` matrix per decoder
  block (Σ α·v of the row's request; zero rows for unsteered rows and free
  slots), added by a hook that reads the buffer.  Under a CUDA graph the hook
  runs only while the step is captured; afterwards moving a slider or
  setting a new vector is an in-place write of those rows and takes effect
  at the next replay, with no re-capture.  α is folded into the row rather
  than kept as a separate (slots,) buffer: a slider move rewrites the row of
  each block it steers (hidden values, the same in-place write as one
  number, off the replay), and several vectors with their own α on one block
  stay one addition.  Every block has its matrix on a
  captured path (so a vector at a new layer needs no new graph); the eager
  path adds only the blocks some row steers.  Per-head (ITI) shifts get the
  same treatment at the attention output projections' inputs, allocated the
  first time a request carries one (one re-build).
* **Special tokens** are masked as the dynamic path's hooks mask them: a
  ``(slots, 1)`` buffer, written with the step's ids, holds 0 where a row is
  fed a special token (BOS, EOS, a turn marker) and 1 elsewhere, and the
  matrices multiply by it.  Steers that also take special tokens
  (``special_tokens=True``) go to a second set of matrices, added unmasked,
  allocated the first time a request carries one (one re-build).
* **Inputs** (token ids, position ids) are buffers written before each step.
* **Position masks** have nothing left to do while decoding: every decoded
  position is a generated one, so a prompt-only steer has dropped out and
  every other one adds at every step (``Request._after_prefill`` sums them
  into one row per block).  Prompt positions are steered at prefill, which
  stays on the dynamic path (one pass per join, not worth a graph).

A re-build (a new store shape, and on CUDA a new capture) happens only when
the batch needs more slots or more columns than it has; slots double, columns
grow to the next multiple of ``_COLUMN_BUCKET`` that holds the joining rows'
prompts and token budgets (a running row moved right by a longer prompt can
still outgrow them: then the step grows the store one bucket), and the store
is compacted (leading columns that are padding in every live row are dropped,
as :func:`.kv_rows.drop_leading` does) before it grows.
:attr:`StaticDecode.builds` and :attr:`StaticDecode.captures` count them.

Why explicit CUDA graphs rather than ``torch.compile(mode="reduce-overhead")``:
the steering and recording hooks are per-thread Python closures (the model is
shared by threads that must not see each other's hooks), and dynamo guards on
the hooks present, so a compiled step would recompile whenever they are
re-installed; a graph records only the kernels the hooks launched, and no
Python runs at replay.  It also needs no compile time (minutes for an 8B model).

Where capture is impossible (CPU, MPS, a multi-device map, an attention
implementation or layer type this module does not know) :func:`choose` picks
the dynamic path; ``decode="static"`` (or ``STEER_UI_DECODE=static``) forces
this module's step, run eagerly off CUDA, which is how the tests check it
equals the dynamic path token for token.  On CPU the dynamic path stays the
default: it attends to the real columns only and adds only the steered blocks.
"""
from __future__ import annotations

import os
from contextlib import ExitStack

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from ..policy import DECODE_SETTINGS
from . import cuda_graphs, fused_decode, kv_rows
from .layer_kinds import FULL, SLIDING, kinds_problem, layer_types, text_config
from .capture import out_projection, site_width
from .hooks import HeadSteer, Installed, Steer, between_blocks, special_ids

ENV = "STEER_UI_DECODE"
_COLUMN_BUCKET = 128  # the store's columns grow in these steps (each growth is a re-build)
# the step's steering matrices (layers, slots, width): residual and per-head, masked at special tokens and not
_STEERING_BUFFERS = ("resid", "heads", "resid_special", "heads_special")


class StaticDecodeError(ValueError):
    """The static decode cannot serve this model (the caller falls back to the dynamic path)."""


# ------------------------------------------------------------------ choice
def unsupported(handle) -> str | None:
    """Why the static step cannot run this model, or None when it can."""
    config = text_config(handle)
    attention = getattr(config, "_attn_implementation", None)
    if attention not in ("sdpa", "eager"):
        return f"attention implementation {attention!r} (the static step builds sdpa and eager masks only)"
    kinds = kinds_problem(handle)
    if kinds:
        return kinds
    if getattr(config, "add_cross_attention", False):
        return "cross-attention"
    if getattr(config, "num_kv_shared_layers", 0):
        return "layers that share another layer's keys and values"
    dynamic_rope = sorted(kind for kind in _rope_types(handle) if "dynamic" in kind)
    if dynamic_rope:  # transformers compares the longest position with its cache on the host: a sync per step
        return f"rotary embeddings that re-compute their frequencies from the positions ({', '.join(dynamic_rope)})"
    devices = {p.device for p in handle.model.parameters()}
    if len(devices) > 1:
        return f"parameters on {len(devices)} devices (a device map)"
    return None


def _rope_types(handle) -> set[str]:
    """The rotary embedding kinds of the model's rotary modules (one per layer type where they differ)."""
    kinds: set[str] = set()
    for module in handle.model.modules():
        kind = getattr(module, "rope_type", None)
        if isinstance(kind, str):
            kinds.add(kind)
        elif isinstance(kind, dict):  # by layer type (Gemma 3)
            kinds |= {str(k) for k in kind.values()}
    return kinds


def setting(decode: str | None) -> str:
    """The decode setting: the argument, else ``STEER_UI_DECODE``, else ``auto``; refused unless one of three."""
    value = (decode or os.environ.get(ENV) or "auto").strip().lower()
    if value not in DECODE_SETTINGS:
        raise StaticDecodeError(f"decode must be one of {DECODE_SETTINGS}, got {value!r}")
    return value


def decide(handle, decode: str | None = None) -> tuple[str, str]:
    """(the decode path a batch on ``handle`` takes: ``dynamic``, ``static (eager)`` or ``static+cuda-graph``; why).

    ``auto``: the static step captured as a CUDA graph on a CUDA model this
    module supports, the dynamic path elsewhere.  ``static``: this module's
    step wherever it is supported (eager off CUDA).  ``dynamic``: never.
    Builds nothing, so the app can show the path before anyone generates.
    """
    wanted = setting(decode)
    device = handle.input_device
    if wanted == "dynamic":
        return "dynamic", f"{ENV} or the decode setting asks for the dynamic path"
    if wanted == "fused" or (wanted == "auto" and device.type != "cuda"):
        why = fused_decode.unsupported(handle)
        if why is None:
            return "fused", (f"{device.type}: each decoder block is one C call (fewer operators dispatched from "
                             "Python a step than through the model's modules)")
        if wanted == "fused":
            return "dynamic", f"the fused step does not support this model: {why}"
    why = unsupported(handle)
    if why:
        return "dynamic", f"the static step does not support this model: {why}"
    if device.type == "cuda":
        return "static+cuda-graph", f"{wanted}: a CUDA model, the step is captured as a CUDA graph"
    if wanted == "static":
        return "static (eager)", f"asked for; no CUDA graphs on {device.type}: the step runs eagerly"
    return "dynamic", (f"{device.type}: no CUDA graphs to capture, and eagerly the dynamic step is the faster one "
                       "(it attends to real columns only and adds only the steered blocks)")


def one_off_setting(device: torch.device) -> str:
    """The decode setting for a batch made for one request and dropped (CLI generate, the Concepts tab), on
    ``device``.

    ``auto`` means dynamic there on CUDA: a capture synchronises the whole
    device and holds graph memory, which pays off only for a batch that lives
    across many steps and requests (the engine's).  Elsewhere it stays ``auto``
    (the fused CPU step costs nothing to set up).  An explicit setting is obeyed.
    """
    wanted = setting(None)
    return "dynamic" if wanted == "auto" and device.type == "cuda" else wanted


def choose(handle, decode: str | None = None) -> tuple["StaticDecode | fused_decode.FusedDecode | None", str]:
    """(a :class:`StaticDecode` or :class:`.fused_decode.FusedDecode`, or None for the dynamic path; why that
    path), as :func:`decide` says."""
    path, reason = decide(handle, decode)
    if path == "dynamic":
        return None, reason
    if path == "fused":
        return fused_decode.FusedDecode(handle), reason
    return StaticDecode(handle, graph=path == "static+cuda-graph"), reason


# ------------------------------------------------------------------ the KV store
class SlotLayer(CacheLayerMixin):
    """One layer's keys and values, ``(slots, kv_heads, max_len, head_dim)``, written at a device-held column.

    ``update`` writes the step's key and value into column ``column`` (a
    one-element long tensor shared by every layer, so the write address is
    data, not code) and returns the whole store; the mask hides the columns
    a row must not see.
    """

    is_compileable = True
    is_sliding = False

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, column: torch.Tensor, sliding: bool):
        super().__init__()
        self.keys, self.values, self.column = keys, values, column
        self.is_sliding = sliding
        self.is_initialized = True

    def lazy_initialization(self, key_states, value_states) -> None:  # allocated up front
        return None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        self.keys.index_copy_(2, self.column, key_states)
        self.values.index_copy_(2, self.column, value_states)
        return self.keys, self.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.keys.shape[-2], 0

    def get_seq_length(self) -> int:
        return self.keys.shape[-2]

    def get_max_length(self) -> int:
        return self.keys.shape[-2]


class SlotCache(Cache):
    """The :class:`SlotLayer` s of every decoder block, passed to the model as its ``past_key_values``."""

    def __init__(self, layers: list[SlotLayer]):
        super().__init__(layers=layers)


# ------------------------------------------------------------------ the step
class StaticDecode:
    """The static KV store, the step's buffers, and the step (captured once per store shape on CUDA).

    Rows are in the batch's order (three per request); each has a slot.
    :meth:`join` copies new rows' prefill KV into free slots, :meth:`keep`
    frees the slots of rows that leave, :meth:`set_steering` writes the
    steering buffers, :meth:`step` runs one decode step for every row.
    Not thread-safe: one thread drives it (the one that owns the batch).
    """

    def __init__(self, handle, graph: bool):
        self.handle = handle
        self.graph = bool(graph)
        self.builds = 0  # store shapes allocated (each needs a new capture on CUDA)
        self.captures = 0  # CUDA graphs captured
        self.capture_error: str | None = None  # why capture failed, if it did (the step then runs eagerly)
        # the eager step adds steering at the steered blocks only; True: at every block, from the buffers, as the
        # captured step does (so tests check on CPU the hooks a graph records)
        self.every_block = False
        config = text_config(handle)
        self._kinds = layer_types(handle)
        self._window = int(getattr(config, "sliding_window", 0) or 0)
        self._device = handle.input_device
        # additive masks, made once a step: eager attention needs them, and on CUDA torch's attention turns a
        # boolean mask into one at every call (two kernels a layer in the captured 8B step)
        self._float_masks = getattr(config, "_attn_implementation", "sdpa") == "eager" or self._device.type == "cuda"
        self._last_block = handle.arch.num_layers - 1
        self.slots = 0
        self.max_len = 0
        self.columns = 0  # columns every slot has consumed (host copy of ``_column``)
        self.row_slots: list[int] = []  # the slot of each batch row, in row order
        self._first_column: dict[int, int] = {}  # slot -> column of its row's first real token
        self._live_layers: set = set()  # blocks (and ("heads", block)) some row steers: the eager step's hooks
        self._heads = False  # per-head steering buffers allocated
        self._special = False  # the matrices of steers that also take special tokens allocated
        self._special_ids = special_ids(handle).to(self._device)
        self._graph = None
        self._out = None
        self._stream = None  # this store's warm-up and capture stream (CUDA), made at the first capture
        self.cache: SlotCache | None = None
        self.resid: torch.Tensor | None = None  # (layers, slots, hidden): Σ α·v of each slot's request per block
        self.heads: torch.Tensor | None = None  # (layers, slots, heads · head_dim), once a row has per-head shifts
        # the same shapes for steers that also take special tokens, once a row has one (added unmasked)
        self.resid_special: torch.Tensor | None = None
        self.heads_special: torch.Tensor | None = None

    # ------------------------------------------------------------ shape
    @property
    def path(self) -> str:
        return "static+cuda-graph" if self.graph and self.capture_error is None else "static (eager)"

    @property
    def can_join(self) -> bool:
        """Rows can always join: they take free slots, and the store grows when there are none."""
        return True

    def report(self, reason: str) -> dict:
        """The decode path, why it was chosen, and the counters (plus why capture failed, if it did)."""
        out = {"path": self.path, "reason": reason, "builds": self.builds, "captures": self.captures}
        if self.capture_error:
            out["capture_error"] = self.capture_error
        return out

    def _allocate(self, slots: int, max_len: int, like: Cache) -> None:
        """A store of ``slots`` × ``max_len`` holding the old one's contents (same slots, same columns)."""
        old = self.cache
        dtype, dev = self.handle.dtype, self._device
        column = torch.zeros(1, dtype=torch.long, device=dev)
        column.fill_(self.columns)
        new_layers = []
        for i, src in enumerate(like.layers):
            keys = src.keys.new_zeros((slots, src.keys.shape[1], max_len, src.keys.shape[3]))
            values = src.values.new_zeros((slots, src.values.shape[1], max_len, src.values.shape[3]))
            if old is not None:
                mine = old.layers[i]
                keys[: self.slots, :, : self.max_len].copy_(mine.keys)
                values[: self.slots, :, : self.max_len].copy_(mine.values)
            new_layers.append(SlotLayer(keys, values, column, self._kinds[i] == SLIDING))
        valid = torch.zeros((slots, max_len), dtype=torch.bool, device=dev)
        ids = torch.zeros((slots, 1), dtype=torch.long, device=dev)
        positions = torch.zeros((slots, 1), dtype=torch.long, device=dev)
        active = torch.zeros((slots, 1), dtype=torch.long, device=dev)
        ordinary = torch.ones((slots, 1), dtype=dtype, device=dev)
        steering = {name: self._steering_buffer(name, slots, dtype, dev) for name in _STEERING_BUFFERS}
        if old is not None:
            valid[: self.slots, : self.max_len].copy_(self.valid)
            ids[: self.slots].copy_(self.ids)
            positions[: self.slots].copy_(self.positions)
            active[: self.slots].copy_(self.active)
            ordinary[: self.slots].copy_(self.ordinary)
            for name, buffer in steering.items():
                if buffer is not None:
                    buffer[:, : self.slots].copy_(getattr(self, name))
        # from here on nothing can fail: the batch switches to the new store at once
        self.cache = SlotCache(new_layers)
        self._column = column
        self.valid, self.ids, self.positions, self.active, self.ordinary = valid, ids, positions, active, ordinary
        for name, buffer in steering.items():
            setattr(self, name, buffer)
        self._columns_index = torch.arange(max_len, device=dev)
        self.slots, self.max_len = slots, max_len
        self._graph = self._out = None
        self.builds += 1

    def _steering_buffer(self, name: str, slots: int, dtype, dev) -> torch.Tensor | None:
        """The (layers, slots, width) matrices ``name`` (one of :data:`_STEERING_BUFFERS`), or None while no row
        has needed them."""
        heads, special = name.startswith("heads"), name.endswith("_special")
        if (heads and not self._heads) or (special and not self._special):
            return None
        width = site_width(self.handle, "heads") if heads else self.handle.arch.hidden_size
        return torch.zeros((self.handle.arch.num_layers, slots, width), dtype=dtype, device=dev)

    def _ensure(self, rows: int, columns: int, like: Cache) -> None:
        """Room for ``rows`` live rows and ``columns`` columns (a growth is a re-build; callers compact first)."""
        slots = max(self.slots, 3)
        while slots < rows:
            slots *= 2
        max_len = max(self.max_len, -(-columns // _COLUMN_BUCKET) * _COLUMN_BUCKET)
        if self.cache is None or slots != self.slots or max_len != self.max_len:
            self._allocate(slots, max_len, like)

    def _shift(self, by: int) -> None:
        """Move every slot's columns ``by`` to the right (> 0) or left (< 0); the column index follows."""
        if by == 0:
            return
        t = self.columns
        src, dst = (slice(0, t), slice(by, t + by)) if by > 0 else (slice(-by, t), slice(0, t + by))
        for layer in self.cache.layers:
            for store in (layer.keys, layer.values):
                store[:, :, dst] = store[:, :, src].clone()
        self.valid[:, dst] = self.valid[:, src].clone()
        self.valid[:, t + by if by < 0 else 0: t if by < 0 else by] = False
        self.columns += by
        self._column.add_(by)
        self._first_column = {s: c + by for s, c in self._first_column.items()}

    def _compact(self) -> int:
        """Drop the leading columns that hold no live row's token (``kv_rows.drop_leading``'s rule); how many."""
        lead = min(self._first_column.values(), default=self.columns)
        self._shift(-lead)
        return lead

    # ------------------------------------------------------------ rows
    @torch.inference_mode()
    def join(self, cache: Cache, columns: int, mask: torch.Tensor, positions: torch.Tensor, reserve: int,
             twins: list[tuple[int, int]] | None = None) -> None:
        """Append rows from a prefill: their KV (``cache``, ``columns`` left-padded columns), attention
        ``mask`` (rows, columns) and next position ids (rows,); room is kept for ``reserve`` more steps.

        The new rows' real tokens end where the running rows' do (the column
        before the next write), as :func:`.kv_rows.join` aligns them; a prompt
        longer than the batch's columns moves the running rows right first.
        ``twins`` (:meth:`set_steering`) do not matter here.
        """
        n = mask.shape[0]
        if not kv_rows.joinable(cache) or len(cache.layers) != len(self._kinds):
            raise StaticDecodeError(f"the prefill made a cache the static store cannot take: {cache!r}")
        # the longer of the running rows and the new prompt, then one column per step
        if self.cache is not None and max(self.columns, columns) + reserve + 1 > self.max_len:
            self._compact()
        self._ensure(len(self.row_slots) + n, max(self.columns, columns) + reserve + 1, cache)
        if columns > self.columns:
            self._shift(columns - self.columns)
        t = self.columns
        taken = set(self.row_slots)
        free = [s for s in range(self.slots) if s not in taken][:n]
        slots = torch.tensor(free, device=self._device)
        for mine, theirs in zip(self.cache.layers, cache.layers):
            for store, src in ((mine.keys, theirs.keys), (mine.values, theirs.values)):
                kept = src.shape[-2]  # a sliding layer keeps its last window − 1 columns only
                store[:, :, t - kept:t].index_copy_(0, slots, src.to(store.dtype))
        rows_valid = torch.zeros((n, self.max_len), dtype=torch.bool, device=self._device)
        rows_valid[:, t - columns:t] = mask.to(self._device).bool()
        self.valid.index_copy_(0, slots, rows_valid)
        self.positions.index_copy_(0, slots, positions.to(self._device, torch.long).reshape(n, 1))
        self.active.index_fill_(0, slots, 1)
        for slot, real in zip(free, mask.sum(1).tolist()):
            self._first_column[slot] = t - int(real)
        self.row_slots += free
        self._slot_index = torch.tensor(self.row_slots, device=self._device)

    @torch.inference_mode()
    def keep(self, rows: list[int]) -> None:
        """Keep only ``rows`` (indices into the current row order, in the new order); free the other slots."""
        kept = [self.row_slots[i] for i in rows]
        gone = sorted(set(self.row_slots) - set(kept))
        if gone:
            index = torch.tensor(gone, device=self._device)
            self.valid.index_fill_(0, index, False)
            self.active.index_fill_(0, index, 0)
            self.positions.index_fill_(0, index, 0)
            for buffer in self._steering_buffers():
                buffer.index_fill_(1, index, 0)
            for slot in gone:
                self._first_column.pop(slot, None)
        self.row_slots = kept
        self._slot_index = torch.tensor(kept, device=self._device) if kept else None
        if not kept:  # an empty batch starts its columns again from 0
            self._shift(-self.columns)

    @torch.inference_mode()
    def set_steering(self, steers: list, twins: list[tuple[int, int]] | None = None) -> None:
        """Write the rows' steering: ``Steer`` s with one (rows, hidden) matrix each and a ``HeadSteer`` of
        (rows, width) shifts, as :meth:`DecodeBatch._steers_for` makes them.  In place: no re-build, no re-capture
        (except the first per-head shift, or the first steer that also takes special tokens, which allocates
        their buffers).  ``twins`` (:meth:`.fused_decode.FusedDecode.set_steering`): the captured step computes
        every row."""
        heads = self._heads or any(isinstance(s, HeadSteer) for s in steers)
        special = self._special or any(getattr(s, "special_tokens", False) for s in steers)
        if (heads, special) != (self._heads, self._special):
            self._heads, self._special = heads, special
            for name in _STEERING_BUFFERS:
                if getattr(self, name) is None:
                    setattr(self, name, self._steering_buffer(name, self.slots, self.resid.dtype, self._device))
            self._graph = self._out = None
            self.builds += 1
        for buffer in self._steering_buffers():
            buffer.zero_()
        live = set()
        for s in steers:
            # added, not copied, as the dynamic path sums the steers of one site
            if isinstance(s, Steer):
                target = self.resid_special if s.special_tokens else self.resid
                target[s.layer].index_add_(0, self._slot_index, s.vector.to(target))
                live.add(s.layer)
            elif isinstance(s, HeadSteer):
                target = self.heads_special if s.special_tokens else self.heads
                for layer, shift in s.shifts.items():
                    target[layer].index_add_(0, self._slot_index, shift.to(target))
                    live.add(("heads", layer))
        self._live_layers = live

    def _steering_buffers(self) -> list[torch.Tensor]:
        return [b for b in (getattr(self, name) for name in _STEERING_BUFFERS) if b is not None]

    def _additions(self, masked: torch.Tensor | None, special: torch.Tensor | None) -> torch.Tensor | None:
        """(layers, slots, width): every block's steering for the step's tokens, masked at special ones (the
        dynamic path's :meth:`~.hooks.StepState.masked`), plus that of steers that also take special tokens.  One
        kernel or two for all blocks rather than per block (the captured 8B step launched 64 for this)."""
        if masked is None:
            return None
        add = masked * self.ordinary
        return add if special is None else add + special

    # ------------------------------------------------------------ the step
    def _masks(self):
        """The step's 4-D masks from the validity buffer and the column (runs inside the captured step)."""
        valid = self.valid
        full = valid[:, None, None, :]
        masks = {FULL: full}
        if SLIDING in self._kinds:
            inside = self._columns_index > (self._column - self._window)
            masks[SLIDING] = (valid & inside)[:, None, None, :]
        if self._float_masks:
            low = torch.finfo(self.handle.dtype).min
            zero = torch.zeros((), dtype=self.handle.dtype, device=self._device)
            masks = {k: torch.where(m, zero, low) for k, m in masks.items()}
        kinds = set(self._kinds)
        return masks[kinds.pop()] if len(kinds) == 1 else {k: masks[k] for k in set(self._kinds)}

    def _install(self, hooks: Installed, every_block: bool, final: dict) -> None:
        """The step's hooks: steering reads from the buffers, and the last block's output is recorded."""
        arch = self.handle.arch
        resid = self._additions(self.resid, self.resid_special)
        heads = self._additions(self.heads, self.heads_special)

        def steer(layer):
            def hook(_module, _inputs, output):
                hidden = output[0] if isinstance(output, tuple) else output
                if layer == self._last_block:  # recorded before the steering, as the dynamic path records it
                    final["resid"] = hidden[:, -1, :]
                if every_block or layer in self._live_layers:
                    hidden = hidden + resid[layer].unsqueeze(1)
                return (hidden,) + tuple(output[1:]) if isinstance(output, tuple) else hidden
            return hook

        def head(layer):
            def hook(_module, args):
                return (args[0] + heads[layer].unsqueeze(1),) + tuple(args[1:])
            return hook

        for layer in range(arch.num_layers):
            if every_block or layer in self._live_layers or layer == self._last_block:
                hooks.after(arch.layers[layer], steer(layer))
            if self.heads is not None and (every_block or ("heads", layer) in self._live_layers):
                hooks.before(out_projection(self.handle, layer), head(layer))

    def _forward(self, every_block: bool, pause=None):
        """One step on the buffers; returns (last hidden (slots, hidden), last block's output (slots, hidden)).

        Idempotent until the column moves: it writes this column's keys and
        values and marks this column valid in every slot (a free slot then
        attends to its own new key, so no row is fully masked and no NaN can
        appear), so a warm-up run before a capture is the step itself.
        """
        self.valid.index_fill_(1, self._column, True)
        final: dict = {}
        with ExitStack() as stack:
            hooks = Installed()
            stack.callback(hooks.remove_all)
            self._install(hooks, every_block, final)
            if pause is not None:
                stack.enter_context(between_blocks(self.handle, pause))
            out = self.handle.model.base_model(input_ids=self.ids, attention_mask=self._masks(),
                                               position_ids=self.positions, past_key_values=self.cache,
                                               use_cache=True)
        return out.last_hidden_state[:, -1, :], final["resid"]

    def _capture(self) -> None:
        """Warm up (the step itself, eagerly), then record the step as a CUDA graph; both on this store's stream.

        The caller replays the graph for the step's results, so no tensor made on
        the capture stream is handed to the batch's stream (their memory could be
        reused on that stream while the batch's stream still reads it), and a
        broken capture shows at the first step, not the second.
        """
        device = self._device
        if self._stream is None:  # its own stream, as torch.cuda.graph's shared default one may be capturing
            self._stream = torch.cuda.Stream(device=device)
        graph, out = cuda_graphs.record(device, self._stream, lambda: self._forward(every_block=True))
        self._graph, self._out = graph, out
        self.captures += 1

    @torch.inference_mode()
    def step(self, next_ids: torch.Tensor, pause=None) -> tuple[torch.Tensor, torch.Tensor]:
        """One decode step: feed each row its ``next_ids`` (rows, 1); returns the rows' (last hidden, final
        block output), each (rows, hidden), in row order.

        ``pause`` (the engine's turn-taking) is called between blocks on the
        eager step; a replayed graph runs no Python, so it is called once before.
        """
        if self.columns + 1 > self.max_len:  # the reserves did not cover it (a longer prompt moved the rows right)
            self._compact()
            self._ensure(len(self.row_slots), self.columns + 1, self.cache)
        next_ids = next_ids.reshape(-1, 1).to(self._device)
        self.ids.index_copy_(0, self._slot_index, next_ids)
        # a row fed a special token is not steered there (unless a steer asks): the step's mask, off the graph
        self.ordinary.index_copy_(0, self._slot_index,
                                  (~torch.isin(next_ids, self._special_ids)).to(self.ordinary.dtype))
        if self.graph and self.capture_error is None:
            if pause is not None:
                pause()
            if self._graph is None:
                try:
                    self._capture()
                except RuntimeError as exc:  # a model whose step cannot be recorded: run it eagerly from now on
                    self.capture_error = f"{type(exc).__name__}: {exc}"
                    self._graph = self._out = None
            if self._graph is not None:
                with torch.cuda.device(self._device):
                    self._graph.replay()
                hidden, final = self._out  # the captured outputs, overwritten in place by each replay
            else:
                hidden, final = self._forward(every_block=False, pause=pause)
        else:
            hidden, final = self._forward(every_block=self.every_block, pause=pause)
        hidden = hidden.index_select(0, self._slot_index)
        final = final.index_select(0, self._slot_index)
        self.columns += 1
        self._column.add_(1)
        self.positions.add_(self.active)
        return hidden, final
