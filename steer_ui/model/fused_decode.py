"""The fused decode path: each Gemma 3 decoder block of a CPU decode step is one C call (``block_kernel.c``).

Through Hugging Face's modules a decode step of Gemma 3 270M dispatched ~1,350 torch operators from Python: on
two cores that overhead cost about what reading the int8 weights did (docs/bench.md, "Where a step's time
goes", issue #50).  :class:`FusedDecode` runs the same step with the same calls as
:class:`~.dynamic_decode.DynamicDecode` (``join``, ``keep``, ``set_steering``, ``step``, ``report``), so a
:class:`~.generation.DecodeBatch` runs it without asking which path it has:

* **KV store**: per block, keys and values ``(rows, kv_heads, capacity, head_dim)``, every row at the same
  column (its real tokens right-aligned, padding before, as the dynamic cache's left padding); a row attends to
  its columns from ``start[row]`` (and, in a sliding block, to the last ``window`` columns only: HF's rule, key
  column > column − window).  Prefill stays Hugging Face's (one pass per join); its cache is copied in.
* **Steering** is what the dynamic path's hooks do, called in the same places: a block's residual steers are
  added to its output by :func:`.hooks.apply_steers` (special tokens masked), per-head (ITI) shifts go into the
  C call before the output projection (:meth:`.hooks.HeadSteer.addition`), the final block's output is kept
  before its steering (as :func:`.capture.recording` sees it), and ``pause`` runs before each block and before
  the final norm.
* **Twins**: a request's counterfactual row equals its steered row, bit for bit, below the request's first steered
  block (:func:`.generation.row_twins`); those blocks compute the steered row alone and the counterfactual row
  takes its output.  Such rows are stored last, so each block computes a prefix of the stored rows.
* **Arithmetic**: the products are int8_kernel.c's, as on the dynamic path; the norms, rope, attention and
  activation are the same formulas summed in another order, so the two paths agree to float32 rounding, not
  bit for bit (tests/unit/test_fused_decode.py bounds the difference and checks the tokens).  Each row is
  computed alone, so a batch of requests equals each request alone, bit for bit.

:func:`unsupported` says why a model cannot take this path (anything but Gemma 3 with int8 weights on a CPU with
the C kernel): it then decodes on the dynamic path.
"""
from __future__ import annotations

import ctypes
import functools
import threading
from contextlib import contextmanager
from pathlib import Path

import torch

from .fused_ops import norm_gain
from .hooks import HeadSteer, Steer, StepState, apply_steers, special_positions
from .int8 import Int8Linear, _library
from .layer_kinds import SLIDING, kinds_problem, layer_types, text_config
from .switches import Setting

_SOURCE = Path(__file__).with_name("block_kernel.c")
_GROW = 64  # columns added past what a join needs; the store grows by half again when a step outruns it
_P = ctypes.c_void_p
_I = ctypes.c_int64


_built_from: list = []  # a build :func:`kernel_built_from` puts in place of this tree's (A/B runs)
# rows with twins skip the blocks their twins compute for them (every_row_computed turns it off)
_SHARING = Setting(True)


@contextmanager
def every_row_computed():
    """Inside, batches made here compute every row in every block, twins or not (A/B runs and tests: the
    outputs are the same bit for bit)."""
    with _SHARING.held(False):
        yield


def _kernel():
    """``block_step`` and ``block_scratch`` of the built block kernel, or None where no C compiler works."""
    return _built_from[-1] if _built_from else _this_tree_kernel()


@functools.lru_cache(maxsize=None)
def _this_tree_kernel():
    return _bind(_library(_SOURCE, ()))


@contextmanager
def kernel_built_from(source: Path):
    """Inside, every fused step calls the block kernel built from ``source`` (an ``int8_kernel.c`` beside it):
    two builds alternated in one process, as ``steer_ui.tools.kernel_ab`` runs them."""
    if "const int64_t *cols" not in Path(source).read_text():  # the call this module binds (per-row columns)
        raise RuntimeError(f"{source} is a block kernel from before per-row columns (3a21222), which takes another "
                           "call: compare builds from that commit on")
    kernel = _bind(_library(Path(source), ()))
    if kernel is None:
        raise RuntimeError(f"{source} did not build")
    _built_from.append(kernel)
    try:
        yield
    finally:
        _built_from.pop()


def _bind(library):
    if library is None:
        return None
    step = library.block_step
    step.restype = ctypes.c_int
    step.argtypes = [_I, _I, _P, _P, ctypes.c_float, _P, _P, _I, _I, _I, _P, _P, _P, _P, _I, _P, _P, _P, _I,
                     ctypes.c_float, ctypes.c_float, _P, _P, _I, _P, ctypes.c_int, _P]
    scratch = library.block_scratch
    scratch.restype = _I
    scratch.argtypes = [_I] * 7
    return step, scratch


def _packed_kernel() -> int | None:
    """The address of w8a16_kernel.c's product on packed weights, where this machine has a packed path (AMX's
    tiles or AVX-512 VNNI)."""
    from .int8 import _w8a16_kernel

    fn = _w8a16_kernel()
    return ctypes.cast(fn.packed_matmul, ctypes.c_void_p).value if fn is not None and fn.packed else None


def unsupported(handle) -> str | None:
    """Why the fused step cannot decode ``handle``'s model, or None when it can."""
    if handle.input_device.type != "cpu" or handle.dtype != torch.float32:
        return f"{handle.input_device.type} {str(handle.dtype).replace('torch.', '')} (the fused step is float32 on the CPU)"
    layers = handle.arch.layers
    if any(type(layer).__name__ != "Gemma3DecoderLayer" for layer in layers):
        return "not a Gemma 3 model (the fused step is Gemma 3's block)"
    config = text_config(handle)
    if getattr(config, "hidden_activation", None) != "gelu_pytorch_tanh":
        return f"activation {getattr(config, 'hidden_activation', None)!r}"
    kinds = kinds_problem(handle)
    if kinds:
        return kinds
    for layer in layers:
        for linear in _linears(layer):
            if type(linear) is not Int8Linear or linear.bias is not None:
                return "weights that are not int8 (the fused step takes int8_kernel.c's products)"
            w = linear.int8
            if w.w8a8:
                return "integer products on int8 activations are on (the fused step has float or int16 ones)"
            if w.w8a16 and _packed_kernel() is None:
                return ("integer products on int16 activations without AMX's tiles or AVX-512 VNNI (the fused "
                        "step takes them on weights packed for those)")
            if w.w8a16 and w.packed_form() is None:
                return f"an int8 group of {w.group} that the packed int16 product does not take"
            if w.group <= 0 or w.shape[1] % w.group:
                return f"an int8 group of {w.group} that does not divide {w.shape[1]} inputs"
            if not all(t is None or t.is_contiguous() for t in (w.codes, w.scale, w.offset)):
                return "int8 weights that are views, not contiguous (the kernel reads them in place)"
    if handle.arch.final_norm is None:
        return "no final norm"
    if getattr(handle.model.base_model, "rotary_emb", None) is None:  # a multimodal wrapper keeps it elsewhere
        return "no rotary embedding on the text model"
    if _kernel() is None:
        return "no C compiler to build the block kernel"
    return None


def _linears(layer) -> list:
    attn, mlp = layer.self_attn, layer.mlp
    return [attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj]


def _norms(layer) -> list:
    attn = layer.self_attn
    return [layer.input_layernorm, layer.post_attention_layernorm, layer.pre_feedforward_layernorm,
            layer.post_feedforward_layernorm, attn.q_norm, attn.k_norm]


def _stored_order(twins: list[tuple[int, int]]) -> torch.Tensor:
    """The batch's rows in the order :class:`FusedDecode` stores them for ``twins`` (its set_steering's): the rows
    computed in every block first, in the batch's order, then the rows with twins, fewest shared blocks first."""
    plain = [r for r, (twin, blocks) in enumerate(twins) if twin < 0 or blocks <= 0]
    shared = sorted((r for r, (twin, blocks) in enumerate(twins) if twin >= 0 and blocks > 0),
                    key=lambda r: twins[r][1])
    for r in shared:
        twin = twins[r][0]
        if twin >= len(twins) or twin == r or (twins[twin][0] >= 0 and twins[twin][1] > 0):
            raise ValueError(f"row {r}'s twin {twin} is not a row computed in every block")
    return torch.tensor(plain + shared, dtype=torch.long)


class _Block:
    """One block's weights as the C call takes them: 7 × (codes, scale, offset) pointers and (group, out, in)."""

    def __init__(self, layer):
        self.norms = _norms(layer)
        self.weights = [linear.int8 for linear in _linears(layer)]  # read in place: unsupported() checked them
        # a weight on int16 activations is passed packed (w8a16_pack), its group negated (block_kernel.c)
        self._forms = [w.packed_form()[1:] if w.w8a16 else (w.codes, w.scale, w.offset) for w in self.weights]
        # (kept: the C call reads them through these addresses, even if a weight is packed again meanwhile)
        self.pointers = (_P * 21)(*[t.data_ptr() if t is not None else None for form in self._forms for t in form])
        self.dims = (_I * 21)(*[d for w in self.weights for d in (-w.group if w.w8a16 else w.group, *w.shape)])
        self.eps = float(layer.input_layernorm.eps)
        self._norm_weights = [norm.weight for norm in self.norms]
        self._versions: tuple = ()
        self._gains: tuple = (None, [])  # (addresses, the tensors behind them), replaced together
        self._lock = threading.Lock()  # a pass on one thread and a decode step on another share these blocks

    def gain_pointers(self) -> tuple:
        """(the addresses of the six norms' ``1 + w``, the tensors behind them): the caller holds the second while
        its C call reads the first, so a rebuild on another thread cannot free them under it.  Made again only
        where a weight was written since (its version counter moved): a step reads them 18 times, so the check is
        one tuple of counters."""
        versions = tuple(w._version for w in self._norm_weights)
        with self._lock:
            if versions != self._versions:
                gains = [norm_gain(norm) for norm in self.norms]
                self._gains, self._versions = ((_P * 6)(*[g.data_ptr() for g in gains]), gains), versions
            return self._gains


class Blocks:
    """A model's decoder blocks as ``block_kernel.c`` takes them: their weights and norms (:class:`_Block`), the
    attention's shape and each block's kind; :meth:`run` is one block's C call.  The decode step
    (:class:`FusedDecode`) and a pass over a prompt's positions (:mod:`.fused_pass`) both call it."""

    def __init__(self, handle):
        config = text_config(handle)
        arch = handle.arch
        self.blocks = [_Block(layer) for layer in arch.layers]
        attn = arch.layers[0].self_attn
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = attn.head_dim
        self.inter = arch.layers[0].mlp.gate_proj.int8.shape[0]  # the MLP's width
        self.scaling = float(attn.scaling)
        self.softcap = float(getattr(config, "attn_logit_softcapping", None) or 0.0)
        self.kinds = layer_types(handle)
        self.window = int(getattr(config, "sliding_window", 0) or 0)

    def rope(self, handle, like: torch.Tensor, position_ids: torch.Tensor, repeat: int = 1) -> dict:
        """Per block kind, the rotary tables (cos, sin) the kernel takes: one row per position of
        ``position_ids`` (the model's own rotary embedding), the whole ``repeat`` times (float32, contiguous)."""
        rope = {}
        for kind in set(self.kinds):
            cos, sin = handle.model.base_model.rotary_emb(like, position_ids, kind)
            rope[kind] = tuple(t.reshape(-1, t.shape[-1]).float().repeat(repeat, 1).contiguous() for t in (cos, sin))
        return rope

    def scratch_floats(self, rows: int, hidden: int, capacity: int) -> int:
        """How many floats a call on ``rows`` rows works in."""
        return int(_kernel()[1](rows, hidden, self.heads, self.kv_heads, self.head_dim, self.inter, capacity))

    def scratch(self, rows: int, hidden: int, capacity: int) -> torch.Tensor:
        """The floats a call on ``rows`` rows works in."""
        return torch.empty(self.scratch_floats(rows, hidden, capacity))

    def run(self, i: int, rows: int, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, keys: torch.Tensor,
            values: torch.Tensor, columns: torch.Tensor, stores: torch.Tensor | None, start: torch.Tensor,
            head_add: torch.Tensor | None, ff_rows: torch.Tensor | None, scratch: torch.Tensor, packed) -> None:
        """Block ``i`` on the first ``rows`` rows of ``h`` (float32, contiguous), in place: row r at column
        ``columns[r]`` of store row ``stores[r]`` (None: r) of ``keys``/``values`` (store rows, kv heads,
        capacity, head dim), from that store row's ``start``; the MLP on ``ff_rows`` only (None: every row).
        ``packed``: :func:`_packed_kernel`'s address, looked up once by the caller."""
        block = self.blocks[i]
        gains, _held = block.gain_pointers()  # _held: the gains' tensors, alive until the call returns
        status = _kernel()[0](
            rows, h.shape[-1], h.data_ptr(), gains, block.eps, block.pointers, block.dims,
            self.heads, self.kv_heads, self.head_dim, cos.data_ptr(), sin.data_ptr(), keys.data_ptr(),
            values.data_ptr(), keys.shape[2], columns.data_ptr(), None if stores is None else stores.data_ptr(),
            start.data_ptr(), self.window if self.kinds[i] == SLIDING else 0, self.scaling, self.softcap,
            None if head_add is None else head_add.data_ptr(), None if ff_rows is None else ff_rows.data_ptr(),
            0 if ff_rows is None else ff_rows.shape[0], scratch.data_ptr(), torch.get_num_threads(), packed)
        if status != 0:
            raise RuntimeError(f"the block kernel refused block {i}'s shapes")


class FusedDecode:
    """The rows' KV store, columns, positions and steering; one C call per block a step.  Not thread-safe: the
    batch's thread drives it."""

    path = "fused"

    def __init__(self, handle):
        self.handle = handle
        self.model = Blocks(handle)
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.columns = 0
        self.start: torch.Tensor | None = None  # (rows,) each row's first real column
        self.positions: torch.Tensor | None = None  # (rows,) each row's next position id
        self._steers: list = []
        self._final_block = handle.arch.num_layers - 1
        # Rows that compute what another row computes in the first blocks (a request's counterfactual row is its
        # steered row until the first steered block: set_steering's ``twins``) are stored last, so that each block
        # computes a prefix of the rows and copies the rest (see _share).  _order[i]: the batch's row stored at i
        # (None: the batch's own order); _inverse: where each batch row is stored.
        self._order: torch.Tensor | None = None
        self._inverse: torch.Tensor | None = None
        self._active: list[int] = []  # rows each block computes (a prefix of the stored rows)
        self._copies: dict[int, list[tuple[int, int]]] = {}  # block -> (stored row, its twin) to copy after it

    can_join = True  # every join is a copy into the store

    def report(self, reason: str) -> dict:
        return {"path": self.path, "reason": reason}

    @property
    def rows(self) -> int:
        return 0 if self.start is None else int(self.start.shape[0])

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2] if self.keys else 0

    def _store(self, rows: int, capacity: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        shape = (rows, self.model.kv_heads, capacity, self.model.head_dim)
        # never-written columns are never read (a row attends from its start on), so empty, not zeros
        blocks = self.model.blocks
        return [torch.empty(shape) for _ in blocks], [torch.empty(shape) for _ in blocks]

    def join(self, cache, columns: int, mask: torch.Tensor, positions: torch.Tensor, reserve: int,
             twins: list[tuple[int, int]] | None = None) -> None:
        """Append rows from a prefill: their HF ``cache`` (``columns`` left-padded columns; a sliding layer keeps
        the last ``window − 1``), attention ``mask`` (rows, columns), next position ids (rows,); ``reserve``: the
        steps to come (the store makes room for some of them now and grows when a step needs more).  ``twins``:
        every row's, the new ones included (:meth:`set_steering`): the store is built in the order they ask for,
        so the steering that follows need not copy it again."""
        new_rows = mask.shape[0]
        rows = self.rows + new_rows
        total = max(self.columns, columns)
        shift = total - self.columns  # the running rows move right when a longer prompt joins
        capacity = max(self.capacity, total + 1 + min(int(reserve), _GROW))
        old_order = self._order if self._order is not None else torch.arange(self.rows)
        if twins is not None and len(twins) != rows:
            raise ValueError(f"twins for {len(twins)} rows, the store will hold {rows}")
        shared = _SHARING.value and twins
        order = _stored_order(twins) if shared else torch.cat([old_order, torch.arange(self.rows, rows)])
        at = torch.empty_like(order).index_copy_(0, order, torch.arange(rows))  # where each batch row is stored
        old_at, new_at = at.index_select(0, old_order), at[self.rows:]
        keys, values = self._store(rows, capacity)
        for i, layer in enumerate(cache.layers):
            for mine, old, theirs in ((keys[i], self.keys, layer.keys), (values[i], self.values, layer.values)):
                if self.rows:
                    mine[:, :, shift:shift + self.columns].index_copy_(0, old_at, old[i][:, :, : self.columns])
                stored = theirs.shape[-2]
                mine[:, :, total - stored:total].index_copy_(0, new_at, theirs.float())
        start, place = torch.empty(rows, dtype=torch.int64), torch.empty(rows, dtype=positions.dtype)
        start.index_copy_(0, new_at, total - mask.sum(dim=1).to(torch.int64))
        place.index_copy_(0, new_at, positions)
        if self.rows:
            start.index_copy_(0, old_at, self.start + shift)
            place.index_copy_(0, old_at, self.positions)
        self.start, self.positions = start, place
        self.keys, self.values, self.columns = keys, values, total
        self._set_order(order)

    def keep(self, rows: list[int]) -> None:
        """Keep only ``rows`` (indices into the current row order, in the new order)."""
        if not rows:
            self.keys, self.values, self.columns, self.start, self.positions = [], [], 0, None, None
            self._set_order(None)
            return
        if self._order is None:
            self._reorder(torch.tensor(rows))
            return
        # stored rows keep their relative places; each is renumbered as the batch renumbers it
        renumbered = {old: new for new, old in enumerate(rows)}
        stored = sorted(int(self._inverse[old]) for old in rows)
        self._reorder(torch.tensor(stored), torch.tensor([renumbered[int(self._order[i])] for i in stored]))

    def _reorder(self, stored: torch.Tensor, order: torch.Tensor | None = None) -> None:
        """Keep the stored rows ``stored``, in that order, now holding the batch's rows ``order`` (None: in the
        batch's own order)."""
        self.keys = [k.index_select(0, stored) for k in self.keys]
        self.values = [v.index_select(0, stored) for v in self.values]
        self.start = self.start.index_select(0, stored)
        self.positions = self.positions.index_select(0, stored)
        self._set_order(order)

    def _set_order(self, order: torch.Tensor | None) -> None:
        if order is not None and torch.equal(order, torch.arange(order.shape[0])):
            order = None
        self._order = order
        self._inverse = None if order is None else torch.empty_like(order).index_copy_(
            0, order, torch.arange(order.shape[0]))
        self._active, self._copies = [], {}  # set_steering says them again

    def set_steering(self, steers: list, twins: list[tuple[int, int]] | None = None) -> None:
        """The steers the next steps add: :class:`.hooks.Steer` (one (rows, hidden) matrix per block) and
        :class:`.hooks.HeadSteer` (per-head shifts), as :meth:`.generation.DecodeBatch._steers_for` makes them.

        ``twins``: per row, ``(twin, blocks)``: the row's input to each of blocks ``0 .. blocks - 1`` is bit for
        bit its ``twin``'s (the same tokens, no steer of either before block ``blocks`` and no row steered
        there is a twin); ``(-1, 0)`` for a row computed in every block.  Those blocks compute the twin alone
        and the row takes its output: a request's counterfactual row skips the blocks below its first steered
        one (:meth:`.generation.DecodeBatch._twins_for`)."""
        for s in steers:
            if not isinstance(s, (Steer, HeadSteer)):
                raise TypeError(f"the fused step cannot add a {type(s).__name__}")
        self._steers = list(steers)
        self._share(twins if _SHARING.value and twins else [(-1, 0)] * self.rows)

    def _share(self, twins: list[tuple[int, int]]) -> None:
        """Store the rows with twins last, by how many blocks they skip (fewest first), so each block computes a
        prefix of the stored rows; note what each block computes and copies."""
        n = len(self.model.blocks)
        if len(twins) != self.rows:
            raise ValueError(f"twins for {len(twins)} rows, the store holds {self.rows}")
        order = _stored_order(twins)
        shared = [r for r in order.tolist() if twins[r][0] >= 0 and twins[r][1] > 0]
        if self.rows:
            current = self._order if self._order is not None else torch.arange(self.rows)
            if not torch.equal(order, current):
                inverse = self._inverse if self._inverse is not None else torch.arange(self.rows)
                self._reorder(inverse.index_select(0, order), order)
        stored_at = {int(row): i for i, row in enumerate(order)}
        skips = [min(twins[r][1], n) for r in shared]  # ascending: the rows a block skips are a suffix
        self._active = [self.rows - sum(1 for b in skips if b > i) for i in range(n)]
        self._copies = {}
        for r, b in zip(shared, skips):  # after its last skipped block (before that block's steers)
            self._copies.setdefault(b - 1, []).append((stored_at[r], stored_at[twins[r][0]]))

    def _grow(self) -> None:
        capacity = self.capacity + max(_GROW, self.capacity // 2)
        keys, values = self._store(self.rows, capacity)
        for mine, old in zip(keys + values, self.keys + self.values):
            mine[:, :, : self.columns] = old[:, :, : self.columns]
        self.keys, self.values = keys, values

    def step(self, next_ids: torch.Tensor, pause=None) -> tuple[torch.Tensor, torch.Tensor]:
        """One decode step: feed each row its ``next_ids`` (rows, 1); returns the rows' (last hidden, final
        block output), each (rows, hidden).  ``pause`` is called before each decoder block and the final norm."""
        handle, arch = self.handle, self.handle.arch
        model = self.model
        if self.columns >= self.capacity:
            self._grow()
        rows, column = next_ids.shape[0], self.columns
        state = StepState(prompt_len=0, offset=column)  # every position from here on is a generated one
        if self._steers:  # which rows are fed a special token (their steers leave it alone)
            state.special = special_positions(handle, next_ids)
        by_block: dict[int, list[Steer]] = {}
        for s in self._steers:
            if isinstance(s, Steer):
                by_block.setdefault(s.layer, []).append(s)
        order, inverse = self._order, self._inverse
        with torch.inference_mode():
            stored_ids = next_ids if order is None else next_ids.index_select(0, order.to(next_ids.device))
            h = handle.model.get_input_embeddings()(stored_ids)[:, -1, :].float().contiguous()
            rope = model.rope(handle, h, self.positions.unsqueeze(1))
            scratch = model.scratch(rows, h.shape[-1], self.capacity)
            start = self.start.contiguous()
            columns = torch.full((rows,), column, dtype=torch.int64)  # every row at the same column, its own store row
            packed = _packed_kernel()  # one lookup a step, not one a block
            final = None
            for i in range(len(model.blocks)):
                if pause is not None:
                    pause()
                head_add = self._head_add(i, state, rows)
                if head_add is not None and order is not None:
                    head_add = head_add.index_select(0, order).contiguous()
                cos, sin = rope[model.kinds[i]]
                model.run(i, self._active[i] if self._active else rows, h, cos, sin, self.keys[i], self.values[i],
                          columns, None, start, head_add, None, scratch, packed)
                for row, twin in self._copies.get(i, ()):
                    h[row] = h[twin]  # its input to the next block, as computing it would give, bit for bit
                if i == self._final_block:
                    final = h.clone()  # what the dynamic path's recording sees: the block's output before steering
                steers = by_block.get(i)
                if steers:  # the steers' rows are the batch's: added in its order
                    batch_h = h if order is None else h.index_select(0, inverse)
                    batch_h = apply_steers(steers, state, batch_h.unsqueeze(1)).squeeze(1)
                    h = (batch_h if order is None else batch_h.index_select(0, order)).contiguous()
            if pause is not None:
                pause()
            out = arch.final_norm(h)
        self.columns += 1
        self.positions = self.positions + 1
        if order is not None:
            out, final = out.index_select(0, inverse), final.index_select(0, inverse)
        return out, final

    def _head_add(self, layer: int, state: StepState, rows: int) -> torch.Tensor | None:
        """(rows, heads · head_dim): the per-head shifts added before block ``layer``'s output projection."""
        total = None
        for s in self._steers:
            if isinstance(s, HeadSteer) and layer in s.shifts:
                add = s.addition(s.shifts[layer], state, rows, 1, self.handle.input_device, torch.float32)
                if add is not None:
                    total = add if total is None else total + add
        return None if total is None else total.reshape(rows, -1).contiguous()
