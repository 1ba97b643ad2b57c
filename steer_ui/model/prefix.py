"""The one frozen-prefix engine: run rows once up to block L, then re-run only the blocks above.

Steering at block L leaves blocks 0..L untouched.  :func:`run_prefix` runs a
batch once and keeps block L's output, the last-position outputs of blocks
0..L (what input-dependent steers read as context), the unsteered final
residual, and the arguments every later block was called with (masks, rotary
tables).  Each further α or vector then costs blocks L+1.. only:

* :meth:`Prefix.logits`: :class:`~.hooks.Steer` s (per-row α allowed) → the
  last position's logits; the slider's fast path and α sweeps.  The steer at
  block L itself is added by :func:`~.hooks.apply_steers`, the code the
  steering hook runs, and steers at later blocks by the hooks themselves.
* :meth:`Prefix.final`: a plain tensor added to block L's output → the final
  residual at the last position, with autograd through it (TSV training,
  :func:`steer_ui.methods.constraints.constrain_vector`).

:func:`for_prompt` builds the one-prompt prefix the slider uses;
:func:`for_texts` builds left-padded, length-sorted batches of many texts.
"""
from __future__ import annotations

import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from typing import Callable, Iterator, Sequence

import torch

from ..messages import Said
from . import cuda_graphs, fused_pass
from .capture import CaptureError, forward, left_pad, length_batches, recording, thread_owned
from .generation import encode_prompt
from .hooks import Steer, StepState, apply_steers, special_positions, steering, validate

Progress = Callable[[float, str], None]
# the one-row call on a prefix at which its re-run is recorded (CUDA): a prompt viewed once pays no recording
_RECORD_AT_CALL = 2


def _quiet_rows(steers: Sequence[Steer], rows: int) -> list[bool] | None:
    """Per row, whether no steer adds anything to it (α 0, or a zero row of a per-row vector); None where that
    cannot be read off the steers (an input-dependent or per-head steer).  A decision made on the host."""
    quiet = [True] * rows
    for s in steers:
        if not isinstance(s, Steer) or s.fn is not None or s.alpha.numel() not in (1, rows):
            return None
        alphas = s.alpha.reshape(-1).expand(rows).tolist()
        if s.vector.ndim == 2:
            if s.vector.shape[0] != rows:
                return None
            moving = (s.vector != 0).any(dim=-1).tolist()
        else:
            moving = [True] * rows
        quiet = [q and not (a != 0 and m) for q, a, m in zip(quiet, alphas, moving)]
    return quiet


@dataclass
class Prefix:
    """Rows run once through the frozen model, ready to re-run the blocks after ``layer``."""

    handle: object = field(repr=False)
    layer: int
    hidden: torch.Tensor  # (rows, seq, width): output of block `layer`, unsteered
    calls: dict[int, tuple[tuple, dict]]  # block i > layer -> (extra args, kwargs) it was called with
    context: dict[int, torch.Tensor]  # block i <= layer -> (rows, width) its output at the last position
    final_last: torch.Tensor  # (rows, width) float: unsteered final residual (before the final norm), last position
    normed_last: torch.Tensor  # (rows, width): the same after the final norm (the model's last hidden state)
    input_ids: torch.Tensor  # (rows, seq)
    attention_mask: torch.Tensor | None = None  # (rows, seq), 1 for real tokens (left padding)
    final_all: torch.Tensor | None = None  # (rows, seq, width): final residual everywhere, when asked for
    index: list[int] = field(default_factory=list)  # rows of this batch in the caller's list
    # what other modules derive from this prefix and keep with it (the slider's unsteered side of its views)
    memo: dict = field(default_factory=dict, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.index)

    @property
    def rows(self) -> int:
        return self.hidden.shape[0]

    @property
    def layer_last(self) -> torch.Tensor:
        """(rows, width) float: output of block ``layer`` at the last position, unsteered."""
        return self.hidden[:, -1, :].float()

    @cached_property
    def unsteered_logits(self) -> torch.Tensor:
        """(rows, vocab) next-token logits of the unsteered model, on the CPU (computed once).

        Where the steered rows take the fused pass, so does this one (one more pass, once a prefix): against the
        modules' own logits every steered view would carry the two paths' rounding (up to ~0.01 in a logit on
        the embedded model), a Δlogit and a KL that do not go to 0 with α and a sweep that jumps at its centre;
        from the same arithmetic a row at α 0 is these logits bit for bit."""
        with torch.inference_mode():
            if fused_pass.why_not(self) is None:
                return self._logits_above(self.hidden).cpu()
            return self.handle.arch.logits(self.normed_last).cpu()

    def _blocks_above(self, hidden: torch.Tensor, every_position: bool = False) -> torch.Tensor:
        """Blocks ``layer + 1``.. on ``hidden`` with the recorded arguments; the final residual.

        Unless ``every_position``, only the last position of the result is
        meant to be read: the final block's MLP runs on that position alone
        (see :func:`_last_position_mlp`), which leaves the others wrong by
        that MLP's output.
        """
        layers = self.handle.arch.layers
        last = len(layers) - 1
        for i in range(self.layer + 1, len(layers)):
            args, kwargs = self.calls[i]
            if i == last and not every_position and _final_mlp_sliceable(self.handle, layers[i], hidden, args,
                                                                          kwargs):
                with _last_position_mlp(self.handle):
                    out = layers[i](hidden, *args, **kwargs)
            else:
                out = layers[i](hidden, *args, **kwargs)
            hidden = out[0] if isinstance(out, tuple) else out
        return hidden

    def _plus(self, added: torch.Tensor | None) -> torch.Tensor:
        """Block L's output with ``added``: (width,) at every position, (rows, width) per row, or None."""
        h = self.hidden
        if added is None:
            return h
        add = added.to(h.device, h.dtype)
        add = add.unsqueeze(1) if add.ndim == 2 else add.reshape(1, 1, -1)
        # special tokens stay unsteered, as the hooks leave them (steer_ui.model.hooks)
        return h + add * self.ordinary.to(h.device, h.dtype)

    @property
    def ordinary(self) -> torch.Tensor:
        """(rows, seq, 1) 1 where the position holds an ordinary token, 0 at special tokens (made per call, not
        kept: one made under inference mode could not take part in autograd later)."""
        return (~special_positions(self.handle, self.input_ids)).unsqueeze(-1).float()

    def final(self, added: torch.Tensor | None = None) -> torch.Tensor:
        """(rows, width) float: the final residual (before the final norm) at the last position.

        ``added``: (width,) added to block L's output at every position, or
        (rows, width) per row, or None.  Gradients flow to ``added`` when it
        requires them; the model's weights are frozen.
        """
        return self._blocks_above(self._plus(added))[:, -1, :].float()

    def final_everywhere(self, added: torch.Tensor | None = None) -> torch.Tensor:
        """(rows, seq, width) float: :meth:`final` at every position, every block run on every position
        (with ``added``; the unsteered one, when kept, is the field ``final_all``)."""
        return self._blocks_above(self._plus(added), every_position=True).float()

    def logits(self, steers: Sequence[Steer], rows: int | None = None) -> torch.Tensor:
        """Last-position logits (rows, vocab) on the CPU with ``steers`` applied.

        ``rows``: how many rows to run (α may differ per row); a one-row
        prefix is broadcast to them.  Every steer must sit at block ``layer``
        or above; one at ``layer`` must be a residual :class:`Steer`.
        """
        handle, arch = self.handle, self.handle.arch
        rows = self.rows if rows is None else int(rows)
        validate(steers, arch.num_layers, arch.hidden_size)
        if any(s.layer < self.layer for s in steers):
            raise ValueError(f"the prefix is cached at block {self.layer}, above a steered block")
        here = [s for s in steers if s.layer == self.layer]
        if not all(isinstance(s, Steer) for s in here):
            raise ValueError(f"only residual steers can act at the cached block {self.layer}")
        quiet = _quiet_rows(steers, rows) if self.rows == 1 else None
        if quiet is not None and any(quiet):
            return self._with_quiet_rows(steers, quiet)
        later = [s for s in steers if s.layer > self.layer]
        state = StepState(prompt_len=None, special=special_positions(handle, self.input_ids))
        with torch.inference_mode(), steering(handle, later, state):
            state.context.update({i: c.expand(rows, -1) for i, c in self.context.items()})
            h = apply_steers(here, state, self.hidden.expand(rows, -1, -1))
            if not later:  # nothing but ``h`` differs from one call to the next: the re-run can be a recording
                replayed = self._replayed_logits(h)
                if replayed is not None:
                    return replayed
            return self._logits_above(h, later, state).cpu()

    def _with_quiet_rows(self, steers: Sequence[Steer], quiet: list[bool]) -> torch.Tensor:
        """:meth:`logits` where the rows marked ``quiet`` add nothing: those rows are the unsteered logits, which
        the prefix keeps, and only the others re-run.  A sweep's centre (α = 0) and a slider at 0 cost no pass; on
        int8 weights the re-run of such a row gives these logits bit for bit (its products do not depend on the
        rows beside it), elsewhere it would differ from them by float rounding only."""
        out = self.unsteered_logits.expand(len(quiet), -1).clone()
        loud = torch.tensor([i for i, q in enumerate(quiet) if not q], dtype=torch.long)
        if loud.numel():
            out[loud] = self.logits([s.rows_of(loud) for s in steers], rows=int(loud.numel()))
        return out

    def _logits_above(self, h: torch.Tensor, later: Sequence = (), state: StepState | None = None) -> torch.Tensor:
        """Last-position logits (rows, vocab) of blocks ``layer + 1``.. on ``h`` (on the model's device).

        One C call a block where the model takes the fused kernel (:mod:`.fused_pass`), with the ``later`` steers
        added between the calls as their hooks add them (``state``: the pass's, as the hooks see it); else the
        modules' forwards, where those hooks (installed by the caller) act."""
        arch = self.handle.arch
        if fused_pass.why_not(self, later) is None:
            final = fused_pass.final_last(self, h, later, state).to(h.dtype).unsqueeze(1)
        else:
            final = self._blocks_above(h)[:, -1:, :]
        return arch.logits(arch.final_hidden(final)[:, -1, :])

    def _replayed_logits(self, h: torch.Tensor) -> torch.Tensor | None:
        """:meth:`logits` of a one-row ``h`` from the re-run recorded as a CUDA graph, on the CPU; None where
        there is no recording: off CUDA, several rows, the prefix's first call, or a re-run that cannot be
        recorded (then this prefix stays eager).

        On a GPU the re-run of 15 blocks on a short prompt is a few hundred small kernels, launch-bound (an
        8B shape on an H200: 10.5 ms eagerly for a few ms of weight reads).  The slider calls one prefix again
        and again with one row, so the second call records the re-run (:mod:`.cuda_graphs`) and every later
        α is a copy into its input and a replay.  The recording's input and output are this prefix's, shared
        by every thread that moves a slider on the same prompt: a lock keeps one replay's copy-in to its
        copy-out together.
        """
        if h.device.type != "cuda" or h.shape[0] != 1:
            return None
        memo = self.memo
        lock = memo.setdefault("rerun_graph_lock", threading.Lock())  # setdefault is atomic: one lock per prefix
        with lock:
            recorded = memo.get("rerun_graph")
            if recorded is None:
                memo["rerun_calls"] = memo.get("rerun_calls", 0) + 1
                if memo["rerun_calls"] < _RECORD_AT_CALL or "rerun_graph_error" in memo:
                    return None
                inputs = h.clone()  # the recording reads its input from this address
                try:
                    graph, out = cuda_graphs.record(inputs.device, torch.cuda.Stream(device=inputs.device),
                                                    lambda: self._logits_above(inputs))
                except RuntimeError as exc:
                    memo["rerun_graph_error"] = f"{type(exc).__name__}: {exc}"
                    return None
                recorded = memo["rerun_graph"] = (inputs, graph, out)
            inputs, graph, out = recorded
            inputs.copy_(h)
            graph.replay()
            return out.cpu()

    def select(self, rows: Sequence[int]) -> "Prefix":
        """The same prefix restricted to some of its rows (positions within this batch)."""
        rows = list(rows)
        n = self.rows
        pick = torch.tensor(rows, dtype=torch.long)

        def cut(x):
            # batch-major tensors only: a 1-D tensor (e.g. cache positions) is per position, never per row
            if isinstance(x, torch.Tensor):
                return x[pick.to(x.device)] if x.ndim >= 2 and x.shape[0] == n and n > 1 else x
            if isinstance(x, tuple):
                return tuple(cut(v) for v in x)
            if isinstance(x, list):
                return [cut(v) for v in x]
            if isinstance(x, dict):
                return {k: cut(v) for k, v in x.items()}
            return x

        changes = {f.name: cut(getattr(self, f.name)) for f in fields(self)
                   if f.name not in ("handle", "layer", "memo")}
        changes["index"] = [self.index[r] for r in rows]
        changes["memo"] = {}  # derived from the rows before the cut
        return replace(self, **changes)


@contextmanager
def _last_position_mlp(handle) -> Iterator[None]:
    """Feed the final block's MLP the last position only.

    After its attention, a block works on each position alone, and of the
    final block's output only the last position is read (the next token), so
    its MLP (most of a block's work) need not run on the others.  The block
    adds the one-position result to its residual by broadcasting, which
    leaves the other positions wrong and the last one exact.
    """
    def last_only(_m, args):
        return (args[0][:, -1:, :],) + tuple(args[1:])

    # tied to this thread: another thread's forward pass through the final block must see every position
    remover = handle.arch.final_mlp.register_forward_pre_hook(thread_owned(last_only))
    try:
        yield
    finally:
        remover.remove()


def _final_mlp_sliceable(handle, block, hidden: torch.Tensor, args: tuple, kwargs: dict) -> bool:
    """Whether :func:`_last_position_mlp` gives this model's final block the same last position (checked once).

    A family whose block reshapes the MLP's output by the sequence length,
    or has no single MLP module, keeps the full block.
    """
    verdict = handle.__dict__.get("_final_mlp_sliceable")
    if verdict is not None:
        return verdict
    if hidden.shape[1] < 2:
        return False  # a one-position pass has nothing to cut; decide on a longer one
    verdict = False
    if handle.arch.final_mlp is not None:
        with torch.no_grad():
            full = block(hidden, *args, **kwargs)
            full = (full[0] if isinstance(full, tuple) else full)[:, -1]
            try:
                with _last_position_mlp(handle):
                    cut = block(hidden, *args, **kwargs)
                cut = (cut[0] if isinstance(cut, tuple) else cut)[:, -1]
                scale = float(full.abs().max()) or 1.0
                verdict = cut.shape == full.shape and torch.allclose(cut, full, rtol=1e-3, atol=1e-3 * scale)
            except (RuntimeError, ValueError, IndexError):
                verdict = False
    handle.__dict__["_final_mlp_sliceable"] = verdict
    return verdict


@contextmanager
def _recording_calls(handle, layers: Sequence[int]) -> Iterator[dict[int, tuple[tuple, dict]]]:
    """Yield a dict that a forward pass fills with the (extra args, kwargs) each of ``layers`` is called with."""
    calls: dict[int, tuple[tuple, dict]] = {}

    def pre(i):
        def hook(_m, args, kwargs):
            calls[i] = (tuple(args[1:]), dict(kwargs))
        return thread_owned(hook)

    removers = []
    try:
        for i in layers:
            removers.append(handle.arch.layers[i].register_forward_pre_hook(pre(i), with_kwargs=True))
        yield calls
    finally:
        for r in removers:
            r.remove()


def _last(h: torch.Tensor) -> torch.Tensor:
    # a copy, so the full (rows, seq, width) activation is not kept alive by a view
    return h[:, -1, :].clone()


def run_prefix(handle, input_ids: torch.Tensor, layer: int, attention_mask: torch.Tensor | None = None,
               position_ids: torch.Tensor | None = None, keep_final_all: bool = False,
               index: Sequence[int] | None = None) -> Prefix:
    """Run one (optionally left-padded) batch once through the frozen model and keep what re-running needs.

    Runs under ``torch.no_grad`` rather than inference mode so the cached
    tensors can take part in autograd later.  ``keep_final_all`` also keeps
    the unsteered final residual at every position (answer log-probabilities).
    """
    n = handle.arch.num_layers
    layer = int(layer)
    if not 0 <= layer < n:
        raise CaptureError(f"layer {layer} does not exist: the model has layers 0..{n - 1}")
    with torch.no_grad(), \
            recording(handle, range(layer + 1), reduce=_last) as context, \
            recording(handle, [layer]) as at_layer, \
            recording(handle, [n - 1], reduce=None if keep_final_all else _last) as final, \
            _recording_calls(handle, range(layer + 1, n)) as calls:
        out = forward(handle, input_ids, attention_mask, position_ids)
    final_h = final[n - 1]
    return Prefix(handle=handle, layer=layer, hidden=at_layer[layer], calls=calls, context=dict(context),
                  final_last=(final_h[:, -1, :] if keep_final_all else final_h).float(),
                  normed_last=out.last_hidden_state[:, -1, :], input_ids=input_ids, attention_mask=attention_mask,
                  final_all=final_h if keep_final_all else None,
                  index=list(index) if index is not None else list(range(input_ids.shape[0])))


def for_prompt(handle, prompt: str, layer: int) -> Prefix:
    """One prompt, unpadded (the slider's fast path); see :func:`steer_ui.model.analysis.prefix_state` for the cache."""
    return run_prefix(handle, encode_prompt(handle, prompt), layer)


def _token_rows(handle, texts: Sequence[str]) -> list[list[int]]:
    rows = [list(r) for r in handle.tokenizer(list(texts)).input_ids]
    if any(not r for r in rows):
        raise ValueError("a text tokenised to nothing")
    return rows


def _pad_id(handle) -> int:
    pad = handle.tokenizer.pad_token_id
    return int(pad) if pad is not None else 0



def for_texts(handle, texts: Sequence[str], layer: int, batch_size: int = 16, progress: Progress | None = None,
              keep_final_all: bool = False) -> list[Prefix]:
    """One :class:`Prefix` per batch of ``texts`` (batched by token length, so with little padding).

    Each batch's ``index`` lists its rows' positions in ``texts``.
    """
    n = handle.arch.num_layers
    if not 0 <= int(layer) < n:
        raise CaptureError(f"layer {layer} does not exist: the model has layers 0..{n - 1}")
    token_rows = _token_rows(handle, texts) if texts else []
    batches = length_batches([len(r) for r in token_rows], max(1, int(batch_size)), sys.maxsize)
    out: list[Prefix] = []
    done = 0
    for batch in batches:
        ids, mask, positions = left_pad([token_rows[i] for i in batch], _pad_id(handle))
        out.append(run_prefix(handle, ids, layer, mask, positions, keep_final_all=keep_final_all, index=batch))
        done += len(batch)
        if progress:
            progress(min(1.0, done / max(len(token_rows), 1)),
                     Said("progress_cached", done=done, total=len(token_rows)))
    return out
