"""Interventions on the residual stream at the output of decoder block L.

The site is the tensor a decoder block returns: the residual stream after
block L.  In other tools' words that is HF ``output_hidden_states[L + 1]``
(for L below the last block; HF's final entry is taken after the final norm),
repeng / llama.cpp control-vector ``direction.L``, steering-vectors
``layer_type="decoder_block"`` layer L, and TransformerLens
``blocks.L.hook_resid_post``.

A :class:`Steer` adds ``alpha[row] * v`` there.  ``alpha`` may differ per batch
row, so the unsteered (α = 0) and steered rows of a side-by-side generation
share every forward pass.  ``v`` is either fixed or computed per row by a
callable from the last prompt token's activation at a context layer L′ (input
-dependent steering, L2S).  A :class:`HeadSteer` adds ``alpha[row] * shift``
to chosen attention heads' outputs instead (ITI's site, the input of a block's
attention output projection).

:func:`apply_steers` is the one place a residual steer is added: the forward
hook calls it, and so does the frozen-prefix engine (:mod:`.prefix`) for the
block whose output it keeps instead of re-running.  Hooks only exist inside
:func:`steering`, act only in the thread that installed them, are tracked the
moment they are registered and are all removed in ``finally``, even when an
intervention fails half-way through installing.

Special tokens (BOS, EOS, padding, a chat template's turn markers: the tokenizer's special ids) are left
unsteered unless a steer asks (``special_tokens=True``): a chat's steering then acts on the conversation's words,
not on the markers that tell the model whose turn it is, and a plain prompt's BOS, which many models use as an
attention sink, stays as the model knows it.  llama.cpp control vectors, repeng and steering-vectors add to every
position, BOS included: ``special_tokens=True`` (``"apply": {"special_tokens": true}`` in a steering spec) gives
their numbers.  :func:`steering` learns which positions hold special tokens from the ids the input embedding
reads; the frozen-prefix engine sets them from its own ids.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import torch

from ..messages import KeyedError
from ..vector import POSITIONS
from .capture import out_projection, thread_owned


class SteeringError(KeyedError):
    """A steering request that cannot be applied to this model.

    ``key`` and ``params``, when given, name the message in :mod:`steer_ui.messages` (as a VectorError's do), so
    a front can say it in the visitor's language; the English text is the exception's own."""


def _check_positions(positions: str) -> str:
    if positions not in POSITIONS:
        raise SteeringError(f"positions must be one of {POSITIONS}, got '{positions}'")
    return positions


def _as_alpha(alpha) -> torch.Tensor:
    """α as a flat float32 tensor (one value, or one per batch row), refused unless finite."""
    out = torch.as_tensor(alpha, dtype=torch.float32).reshape(-1)
    if not torch.isfinite(out).all():
        raise SteeringError(f"alpha must be a finite number, got {alpha!r}")
    return out


def _alpha_rows(alpha: torch.Tensor, rows: int, device, dtype) -> torch.Tensor:
    """(rows, 1, 1) α per batch row from one α or one per row."""
    if alpha.numel() not in (1, rows):
        raise SteeringError(f"{alpha.numel()} alphas given for a batch of {rows} rows")
    return alpha.to(device=device, dtype=dtype).expand(rows).reshape(rows, 1, 1)


@dataclass
class Steer:
    """Add ``alpha * vector`` (raw units) to the output of block ``layer``.

    ``vector``: (hidden,), or (rows, hidden) for a different vector per
    batch row (the decode engine puts many requests' vectors in one matrix).
    ``alpha``: a number, or one number per batch row.
    ``positions``: ``all`` positions, only ``prompt`` positions, or only
    ``generated`` ones (positions at or after the prompt length given to the
    :class:`StepState`).
    ``fn``: input-dependent vector: maps the (rows, hidden) activation of the
    last prompt token at ``context_layer`` to (rows, hidden) vectors.  It is
    called once per prompt (at prefill) and its result reused while decoding.
    """

    layer: int
    vector: torch.Tensor | None = None
    alpha: float | Sequence[float] | torch.Tensor = 1.0
    positions: str = "all"
    fn: Callable[[torch.Tensor], torch.Tensor] | None = None
    context_layer: int | None = None
    special_tokens: bool = False  # also steer positions holding special tokens (see the module's docstring)
    _cache: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        _check_positions(self.positions)
        if (self.vector is None) == (self.fn is None):
            raise SteeringError("a Steer needs exactly one of a vector or an input-dependent fn")
        if self.fn is not None and self.context_layer is None:
            raise SteeringError("an input-dependent Steer needs context_layer")
        self.alpha = _as_alpha(self.alpha)
        if self.vector is not None:
            vector = torch.as_tensor(self.vector).detach().float()
            # (rows, hidden): one vector per batch row (many users' rows in one decode batch)
            self.vector = vector if vector.ndim == 2 else vector.reshape(-1)
            if not torch.isfinite(self.vector).all():
                raise SteeringError("the steering vector contains NaN or inf values")

    def with_alpha(self, alpha) -> "Steer":
        """A copy with another α (scalar or per row); the side-by-side loop uses it for (0, α, 0)."""
        return Steer(layer=self.layer, vector=self.vector, alpha=alpha, positions=self.positions, fn=self.fn,
                     context_layer=self.context_layer, special_tokens=self.special_tokens)

    def rows_of(self, rows: torch.Tensor) -> "Steer":
        """This steer for ``rows`` of its batch only (its per-row α and vectors taken at those rows; a fixed
        vector only: an input-dependent one has no rows of its own)."""
        alpha = self.alpha if self.alpha.numel() == 1 else self.alpha.index_select(0, rows)
        vector = self.vector if self.vector.ndim == 1 else self.vector.index_select(0, rows.to(self.vector.device))
        return Steer(layer=self.layer, vector=vector, alpha=alpha, positions=self.positions,
                     special_tokens=self.special_tokens)

    @property
    def scalar_alpha(self) -> torch.Tensor:
        return self.alpha.reshape(-1)[0]

    def alpha_for(self, rows: int, device, dtype) -> torch.Tensor:
        key = ("alpha", rows, device, dtype)
        if key not in self._cache:
            self._cache[key] = _alpha_rows(self.alpha, rows, device, dtype)
        return self._cache[key]

    def vector_on(self, device, dtype) -> torch.Tensor:
        key = ("vec", device, dtype)
        if key not in self._cache:
            self._cache[key] = self.vector.to(device=device, dtype=dtype)
        return self._cache[key]


@dataclass
class StepState:
    """What the hooks need to know about the current forward pass.

    ``prompt_len``: padded prompt length; positions ``>= prompt_len`` are
    generated ones.  ``None`` means every position is a prompt position.
    ``offset``: how many positions the KV cache already holds.
    ``special``: (rows or 1, seq) bool, which positions of the current pass
    hold special tokens (set by :func:`steering`'s embedding hook each pass,
    or by the prefix engine); None: none known, every position is steered.
    """

    prompt_len: int | None = None
    offset: int = 0
    special: torch.Tensor | None = None
    context: dict[int, torch.Tensor] = field(default_factory=dict)
    input_vectors: dict[int, torch.Tensor] = field(default_factory=dict)
    fn_calls: int = 0

    def position_mask(self, seq_len: int, positions: str, device, special_tokens: bool = False
                      ) -> torch.Tensor | None:
        """(1 or rows, seq, 1) 0/1 mask of the positions to steer, or None for all of them.

        Positions holding special tokens are left out unless ``special_tokens``."""
        ordinary = None
        if not special_tokens and self.special is not None:
            if self.special.shape[-1] != seq_len:  # a pass the ids were not read for: a bug, not a guess
                raise SteeringError(f"special-token mask for {self.special.shape[-1]} positions, pass of {seq_len}")
            if bool(self.special.any()):
                ordinary = ~self.special.to(device).reshape(-1, seq_len, 1)
        if positions == "all":
            return ordinary
        absolute = torch.arange(self.offset, self.offset + seq_len, device=device)
        boundary = self.prompt_len if self.prompt_len is not None else self.offset + seq_len
        is_prompt = absolute < boundary
        if positions == "prompt":
            keep = is_prompt
        elif positions == "last":  # ITI's positions: the last prompt token and every generated one
            keep = (absolute == boundary - 1) | ~is_prompt
        else:
            keep = ~is_prompt
        keep = keep.reshape(1, seq_len, 1)
        return keep if ordinary is None else keep & ordinary

    def touches(self, seq_len: int, positions: str) -> bool:
        """Whether this pass holds any position of the kind ``positions`` (decided on the host, no device sync).

        At prefill every position is a prompt position, so a generated-only
        steer touches nothing there; while decoding, a prompt-only one does not.
        """
        if positions == "all":
            return True
        boundary = self.prompt_len if self.prompt_len is not None else self.offset + seq_len
        if positions == "prompt":
            return boundary > self.offset
        generated = boundary < self.offset + seq_len
        if positions == "last":
            return generated or self.offset <= boundary - 1 < self.offset + seq_len
        return generated

    def masked(self, add: torch.Tensor, seq_len: int, positions: str, special_tokens: bool = False
               ) -> torch.Tensor:
        """``add`` (rows or 1, seq or 1, width) zeroed at the positions ``positions`` leaves alone (and at special
        tokens unless ``special_tokens``)."""
        mask = self.position_mask(seq_len, positions, add.device, special_tokens)
        return add if mask is None else add * mask.to(add.dtype)


def _output_tensor(output):
    return output[0] if isinstance(output, tuple) else output


def _replace_output(output, hidden):
    if isinstance(output, tuple):
        return (hidden,) + tuple(output[1:])
    return hidden


def input_vector(s: Steer, state: StepState, like: torch.Tensor) -> torch.Tensor:
    """(rows, 1, width) vector of an input-dependent steer: ``fn`` of its context, once per prompt."""
    key = id(s)
    if key not in state.input_vectors:
        if s.context_layer not in state.context:
            raise SteeringError(
                f"input-dependent vector at layer {s.layer} needs the context activation of layer "
                f"{s.context_layer}, which comes later in the forward pass; use a context layer <= "
                f"{s.layer} or steer generated positions only"
            )
        context = state.context[s.context_layer]
        state.fn_calls += 1
        vec = s.fn(context.float())
        if vec.shape != (context.shape[0], like.shape[-1]):
            raise SteeringError(f"input-dependent vector has shape {tuple(vec.shape)}")
        if not torch.isfinite(vec).all():  # 0 · inf would put NaN even in rows this steer leaves alone
            raise SteeringError("the input-dependent vector function returned NaN or inf")
        state.input_vectors[key] = vec.detach()
    return state.input_vectors[key].to(device=like.device, dtype=like.dtype).unsqueeze(1)


def apply_steers(steers: Sequence[Steer], state: StepState, hidden: torch.Tensor) -> torch.Tensor:
    """``hidden`` (rows, seq, width), a block's output, plus each steer's ``α · v`` at the positions it steers.

    The one place a residual steer is added (the forward hook and the
    frozen-prefix engine both call it).  A steer whose positions this pass
    does not hold is skipped before its vector is looked at: a generated-only
    input-dependent steer at prefill adds nothing, so its context layer may
    come later in the pass (the context is recorded, unsteered, at prefill and
    the vector computed at the first generated token).  An input-dependent
    vector is still computed as soon as its context is known, so the decode
    loop knows the steered direction from the start.
    """
    rows, seq, _ = hidden.shape
    total = None
    for s in steers:
        touches = state.touches(seq, s.positions)
        if s.fn is not None and (touches or s.context_layer in state.context):
            vec = input_vector(s, state, hidden)
        if not touches:
            continue
        if s.fn is None:
            vec = s.vector_on(hidden.device, hidden.dtype)
            if vec.ndim == 2:  # one vector per row
                vec = vec.unsqueeze(1)
        add = state.masked(s.alpha_for(rows, hidden.device, hidden.dtype) * vec, seq, s.positions, s.special_tokens)
        total = add if total is None else total + add
    return hidden if total is None else hidden + total


def _make_steer_hook(steers: list[Steer], state: StepState):
    def hook(_module, _inputs, output):
        return _replace_output(output, apply_steers(steers, state, _output_tensor(output)))

    return hook


def _make_context_hook(layer: int, state: StepState):
    def hook(_module, _inputs, output):
        if state.offset == 0:  # prefill: record the last prompt token
            hidden = _output_tensor(output)
            last = (state.prompt_len or hidden.shape[1]) - 1
            state.context[layer] = hidden[:, last, :].detach()

    return hook


class HeadSteer:
    """Adds ``alpha[row] · shift`` to the input of each listed block's attention output projection (ITI).

    That input is the per-head attention outputs concatenated, so a shift
    that is zero outside some heads' slices steers those heads only.
    ``shifts``: {layer: (heads · head_dim) tensor, or (rows, heads · head_dim)
    for one shift per batch row}.  ``alpha``: a number or one per batch row.
    ``positions`` as for :class:`Steer`.
    """

    def __init__(self, shifts: dict[int, torch.Tensor], alpha=1.0, positions: str = "all",
                 special_tokens: bool = False):
        self.positions = _check_positions(positions)
        self.special_tokens = bool(special_tokens)
        self.alpha = _as_alpha(alpha)
        self.shifts = {}
        for k, v in shifts.items():
            v = torch.as_tensor(v).float()
            self.shifts[int(k)] = v if v.ndim == 2 else v.reshape(-1)

    @property
    def layer(self) -> int:
        return min(self.shifts)

    @property
    def scalar_alpha(self) -> torch.Tensor:
        return self.alpha.reshape(-1)[0]

    def with_alpha(self, alpha) -> "HeadSteer":
        return HeadSteer(self.shifts, alpha, self.positions, self.special_tokens)

    def install(self, handle, state: StepState, hooks: "Installed") -> None:
        """Register one pre-hook per layer through ``hooks`` (so a refusal half-way leaves none behind)."""
        for layer, shift in self.shifts.items():
            if not 0 <= layer < handle.arch.num_layers:
                raise SteeringError(f"ITI head at layer {layer}, but the model has layers "
                                    f"0..{handle.arch.num_layers - 1}")
            module = out_projection(handle, layer)
            width = module.weight.shape[0] if type(module).__name__ == "Conv1D" else module.weight.shape[1]
            if shift.shape[-1] != width:
                raise SteeringError(f"ITI shift for layer {layer} has {shift.shape[-1]} values but the attention "
                                    f"output projection takes {width}")
            hooks.before(module, self._hook(shift, state))

    def _hook(self, shift: torch.Tensor, state: StepState):
        def hook(_module, args):
            x = args[0]
            rows, seq, _ = x.shape
            add = self.addition(shift, state, rows, seq, x.device, x.dtype)
            return None if add is None else (x + add,) + tuple(args[1:])

        return hook

    def addition(self, shift: torch.Tensor, state: StepState, rows: int, seq: int, device, dtype
                 ) -> torch.Tensor | None:
        """What this steer adds to an output projection's (rows, seq, width) input for one block's ``shift``:
        α · shift at the positions it steers; None where this pass holds none of them (the hook and the fused
        decode step both add it)."""
        if not state.touches(seq, self.positions):
            return None
        per_row = shift.to(device=device, dtype=dtype)
        if per_row.ndim == 2:
            per_row = per_row.unsqueeze(1)
        add = _alpha_rows(self.alpha, rows, device, dtype) * per_row
        return state.masked(add, seq, self.positions, self.special_tokens)


class Installed:
    """The hooks of one :func:`steering` block, each tracked the moment it is registered.

    Interventions register through it (``after`` for forward hooks, ``before``
    for forward pre-hooks), so whatever fails later, :meth:`remove_all`
    finds every hook; each is marked for :func:`hook_count`.
    """

    def __init__(self) -> None:
        self._removers: list = []

    def after(self, module: torch.nn.Module, fn) -> None:
        self._removers.append(module.register_forward_hook(thread_owned(fn)))

    def before(self, module: torch.nn.Module, fn) -> None:
        self._removers.append(module.register_forward_pre_hook(thread_owned(fn)))

    def remove_all(self) -> None:
        while self._removers:
            self._removers.pop().remove()


def validate(steers: Sequence[Steer], num_layers: int, hidden_size: int) -> None:
    for s in steers:
        if not isinstance(s, Steer):
            continue  # extensions (see `steering`) validate themselves
        if not 0 <= s.layer < num_layers:
            raise SteeringError.from_key("steering_no_such_layer", layer=s.layer, last=num_layers - 1)
        if s.vector is not None and s.vector.shape[-1] != hidden_size:
            raise SteeringError(
                f"vector has {s.vector.shape[-1]} values but the model's hidden size is {hidden_size}"
            )
        if s.context_layer is not None and not 0 <= s.context_layer < num_layers:
            raise SteeringError.from_key("steering_no_such_context_layer", layer=s.context_layer, last=num_layers - 1)


def special_ids(handle) -> torch.Tensor:
    """The tokenizer's special token ids (BOS, EOS, padding, added special tokens such as turn markers), sorted,
    read once per handle."""
    cached = handle.__dict__.get("_special_ids")
    if cached is None:
        tok = handle.tokenizer
        ids = set(getattr(tok, "all_special_ids", []) or [])
        for i, added in (getattr(tok, "added_tokens_decoder", None) or {}).items():
            if getattr(added, "special", False):
                ids.add(int(i))
        cached = handle.__dict__["_special_ids"] = torch.tensor(sorted(int(i) for i in ids if i is not None),
                                                                 dtype=torch.long)
    return cached


def _special_id_set(handle) -> frozenset[int]:
    """:func:`special_ids` as a set of ints, read once per handle."""
    cached = handle.__dict__.get("_special_id_set")
    if cached is None:
        cached = handle.__dict__["_special_id_set"] = frozenset(special_ids(handle).tolist())
    return cached


def special_positions(handle, input_ids: torch.Tensor) -> torch.Tensor:
    """(rows, seq) bool: where ``input_ids`` hold special tokens.

    On the CPU the ids are looked up in a set: for a decode step's few ids 0.01 ms against ``torch.isin``'s
    0.14 ms (every step of every decode path asks); for a 672 × 32 sweep 2.2 against 1.4 ms, small beside its
    pass.  Elsewhere ``isin`` on the device, with no read to the host."""
    if input_ids.device.type == "cpu":
        specials = _special_id_set(handle)
        return torch.tensor([i in specials for i in input_ids.reshape(-1).tolist()],
                            dtype=torch.bool).reshape(input_ids.shape)
    return torch.isin(input_ids, special_ids(handle).to(input_ids.device))


def _make_special_hook(handle, state: StepState):
    def hook(_module, args):
        if args and isinstance(args[0], torch.Tensor) and not args[0].is_floating_point():
            state.special = special_positions(handle, args[0])

    return hook


@contextmanager
def steering(handle, steers: Sequence[Steer] = (), state: StepState | None = None) -> Iterator[StepState]:
    """Install ``steers`` on ``handle``'s model for the duration of the block.

    The hooks act only in the calling thread (other threads' forward passes
    on the shared model never see them) and are removed in ``finally``, so
    an exception anywhere inside leaves the model clean.

    Besides :class:`Steer`, any object with ``install(handle, state, hooks)``
    (registering through ``hooks``, an :class:`Installed`) and
    ``with_alpha(alpha)`` may be passed, e.g. :class:`HeadSteer`; its hooks
    are removed the same way, also when its ``install`` raises half-way.
    """
    state = state or StepState()
    arch = handle.arch
    validate(steers, arch.num_layers, arch.hidden_size)
    hooks = Installed()
    try:
        by_layer: dict[int, list[Steer]] = {}
        for s in steers:
            if isinstance(s, Steer):
                by_layer.setdefault(s.layer, []).append(s)
            else:
                s.install(handle, state, hooks)
        if steers and hasattr(handle.model, "get_input_embeddings"):
            # every pass reads its ids here first, so the hooks below know which positions hold special tokens
            hooks.before(handle.model.get_input_embeddings(), _make_special_hook(handle, state))
        context_layers = {s.context_layer for s in steers if isinstance(s, Steer) and s.fn is not None}
        # Context hooks first so a context layer equal to the steered layer sees the unsteered activation.
        for layer in sorted(context_layers):
            hooks.after(arch.layers[layer], _make_context_hook(layer, state))
        for layer, group in by_layer.items():
            hooks.after(arch.layers[layer], _make_steer_hook(group, state))
        yield state
    finally:
        hooks.remove_all()


@contextmanager
def between_blocks(handle, pause: Callable[[], None] | None) -> Iterator[None]:
    """Call ``pause()`` before each decoder block, and before the final norm, of this thread's passes.

    The decode engine uses it to give way to a slider move in the middle of
    a step, at block granularity, rather than only between steps; the final
    norm's pause splits the unembedding (a large product on a big
    vocabulary) from the last block.
    """
    if pause is None:
        yield
        return
    hooks = Installed()
    try:
        for block in handle.arch.layers:
            hooks.before(block, lambda _module, _args: pause())
        if handle.arch.final_norm is not None:
            hooks.before(handle.arch.final_norm, lambda _module, _args: pause())
        yield
    finally:
        hooks.remove_all()


def hook_count(handle) -> int:
    """How many of our hooks are installed anywhere in the model (0 outside :func:`steering`).

    transformers installs output-recording hooks of its own; those are not counted.
    Hooks registered through :class:`Installed` (and :mod:`.capture`'s and
    :mod:`.prefix`'s) carry ``_steer_ui = True`` and are.
    """
    count = 0
    for module in handle.model.modules():
        for hooks in (module._forward_hooks, module._forward_pre_hooks):
            count += sum(1 for fn in hooks.values() if getattr(fn, "_steer_ui", False))
    return count
