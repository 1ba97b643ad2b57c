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
-dependent steering, L2S).  Hooks only exist inside :func:`steering`, which
holds the model lock and removes them in ``finally``.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import torch

POSITIONS = ("all", "prompt", "generated")


class SteeringError(ValueError):
    """A steering request that cannot be applied to this model."""


@dataclass
class Steer:
    """Add ``alpha * vector`` (raw units) to the output of block ``layer``.

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
    _cache: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.positions not in POSITIONS:
            raise SteeringError(f"positions must be one of {POSITIONS}, got '{self.positions}'")
        if (self.vector is None) == (self.fn is None):
            raise SteeringError("a Steer needs exactly one of a vector or an input-dependent fn")
        if self.fn is not None and self.context_layer is None:
            raise SteeringError("an input-dependent Steer needs context_layer")
        alpha = torch.as_tensor(self.alpha, dtype=torch.float32).reshape(-1)
        if not torch.isfinite(alpha).all():
            raise SteeringError(f"alpha must be a finite number, got {self.alpha!r}")
        self.alpha = alpha
        if self.vector is not None:
            self.vector = torch.as_tensor(self.vector).detach().float().reshape(-1)
            if not torch.isfinite(self.vector).all():
                raise SteeringError("the steering vector contains NaN or inf values")

    def with_alpha(self, alpha) -> "Steer":
        """A copy with another α (scalar or per row); the side-by-side loop uses it for (0, α, 0)."""
        return Steer(layer=self.layer, vector=self.vector, alpha=alpha, positions=self.positions, fn=self.fn,
                     context_layer=self.context_layer)

    @property
    def scalar_alpha(self) -> torch.Tensor:
        return self.alpha.reshape(-1)[0]

    def alpha_for(self, rows: int, device, dtype) -> torch.Tensor:
        a = self.alpha
        if a.numel() not in (1, rows):
            raise SteeringError(f"{a.numel()} alphas given for a batch of {rows} rows")
        key = ("alpha", rows, device, dtype)
        if key not in self._cache:
            self._cache[key] = a.to(device=device, dtype=dtype).expand(rows).reshape(rows, 1, 1)
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
    """

    prompt_len: int | None = None
    offset: int = 0
    context: dict[int, torch.Tensor] = field(default_factory=dict)
    input_vectors: dict[int, torch.Tensor] = field(default_factory=dict)
    fn_calls: int = 0

    def position_mask(self, seq_len: int, positions: str, device) -> torch.Tensor | None:
        """(1, seq, 1) 0/1 mask of the positions to steer, or None for all of them."""
        if positions == "all":
            return None
        absolute = torch.arange(self.offset, self.offset + seq_len, device=device)
        boundary = self.prompt_len if self.prompt_len is not None else self.offset + seq_len
        is_prompt = absolute < boundary
        keep = is_prompt if positions == "prompt" else ~is_prompt
        return keep.reshape(1, seq_len, 1)


def _output_tensor(output):
    return output[0] if isinstance(output, tuple) else output


def _replace_output(output, hidden):
    if isinstance(output, tuple):
        return (hidden,) + tuple(output[1:])
    return hidden


def _make_steer_hook(steers: list[Steer], state: StepState):
    def hook(_module, _inputs, output):
        hidden = _output_tensor(output)
        rows, seq, _ = hidden.shape
        total = None
        for s in steers:
            if s.fn is not None:
                key = id(s)
                if key not in state.input_vectors:
                    if s.context_layer not in state.context:
                        raise SteeringError(
                            f"input-dependent vector at layer {s.layer} needs the context activation of layer "
                            f"{s.context_layer}, which comes later in the forward pass; use a context layer <= "
                            f"{s.layer} or steer generated positions only"
                        )
                    state.fn_calls += 1
                    vec = s.fn(state.context[s.context_layer].float())
                    if vec.shape != (state.context[s.context_layer].shape[0], hidden.shape[-1]):
                        raise SteeringError(f"input-dependent vector has shape {tuple(vec.shape)}")
                    state.input_vectors[key] = vec.detach()
                vec = state.input_vectors[key].to(device=hidden.device, dtype=hidden.dtype).unsqueeze(1)
            else:
                vec = s.vector_on(hidden.device, hidden.dtype)
            add = s.alpha_for(rows, hidden.device, hidden.dtype) * vec
            mask = state.position_mask(seq, s.positions, hidden.device)
            if mask is not None:
                add = add * mask.to(hidden.dtype)
            total = add if total is None else total + add
        return _replace_output(output, hidden + total)

    hook._steer_ui = True
    return hook


def _make_context_hook(layer: int, state: StepState):
    def hook(_module, _inputs, output):
        if state.offset == 0:  # prefill: record the last prompt token
            hidden = _output_tensor(output)
            last = (state.prompt_len or hidden.shape[1]) - 1
            state.context[layer] = hidden[:, last, :].detach()

    hook._steer_ui = True
    return hook


def validate(steers: Sequence[Steer], num_layers: int, hidden_size: int) -> None:
    for s in steers:
        if not isinstance(s, Steer):
            continue  # extensions (see `steering`) validate themselves
        if not 0 <= s.layer < num_layers:
            raise SteeringError(f"layer {s.layer} does not exist: the model has layers 0..{num_layers - 1}")
        if s.vector is not None and s.vector.numel() != hidden_size:
            raise SteeringError(
                f"vector has {s.vector.numel()} values but the model's hidden size is {hidden_size}"
            )
        if s.context_layer is not None and not 0 <= s.context_layer < num_layers:
            raise SteeringError(f"context layer {s.context_layer} does not exist (0..{num_layers - 1})")


@contextmanager
def steering(handle, steers: Sequence[Steer] = (), state: StepState | None = None) -> Iterator[StepState]:
    """Install ``steers`` on ``handle``'s model for the duration of the block.

    Holds ``handle.lock`` throughout; hooks are removed in ``finally`` so an
    exception anywhere inside leaves the model clean.

    Besides :class:`Steer`, any object with ``install(handle, state) -> list of
    removable handles`` and ``with_alpha(alpha)`` may be passed (e.g. ITI's
    per-head interventions); its hooks are removed the same way.
    """
    state = state or StepState()
    arch = handle.arch
    validate(steers, arch.num_layers, arch.hidden_size)
    with handle.lock:
        removers = []
        try:
            by_layer: dict[int, list[Steer]] = {}
            for s in steers:
                if isinstance(s, Steer):
                    by_layer.setdefault(s.layer, []).append(s)
                else:
                    removers.extend(s.install(handle, state))
            context_layers = {s.context_layer for s in steers if isinstance(s, Steer) and s.fn is not None}
            # Context hooks first so a context layer equal to the steered layer sees the unsteered activation.
            for layer in sorted(context_layers):
                removers.append(arch.layers[layer].register_forward_hook(_make_context_hook(layer, state)))
            for layer, group in by_layer.items():
                removers.append(arch.layers[layer].register_forward_hook(_make_steer_hook(group, state)))
            yield state
        finally:
            for h in removers:
                h.remove()


def hook_count(handle) -> int:
    """How many of our hooks are installed anywhere in the model (0 outside :func:`steering`).

    transformers installs output-recording hooks of its own; those are not counted.
    Extensions mark their hook functions with ``_steer_ui = True`` to be counted.
    """
    count = 0
    for module in handle.model.modules():
        for hooks in (module._forward_hooks, module._forward_pre_hooks):
            count += sum(1 for fn in hooks.values() if getattr(fn, "_steer_ui", False))
    return count
