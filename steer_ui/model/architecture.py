"""Where the parts of a causal LM live, per family.

Every family we support exposes the same five things: the list of decoder
blocks (whose outputs are the steering site), the final norm applied before
the unembedding, the unembedding itself (``lm_head``; tied or not), the hidden
size and the number of layers.  Discovery is by attribute paths, tried in
order, so a new family usually needs one line here.
"""
from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

# Rows of W_U per slice when an unembedding may pause (a slider move waits at most one slice): 16,384 rows of
# Gemma's int8 W_U took ~2 ms for the eight sampled rows of four requests, 65,536 rows 7 ms, the longest wait
# a decode made a move take beside its turn (docs/bench.md, "Many users at once").  On int8 weights each
# vocabulary row is its own sum, so slicing changes no logit (a float32 BLAS rounds by its blocking).  On a GPU
# the products are queued, not computed, while the host runs: slices there are as the H200 runs measured them.
PAUSE_VOCAB_ROWS = 1 << 14
PAUSE_VOCAB_ROWS_GPU = 1 << 16


class ArchitectureError(ValueError):
    """The model's layout is not one we know how to steer."""


# (path to the decoder block list, path to the final norm), relative to the
# CausalLM wrapper.  First match wins.
_LAYER_PATHS = (
    "model.layers",  # Llama, Mistral, Qwen2/3, Gemma 1/2/3, Phi3
    "model.language_model.layers",  # multimodal wrappers (Gemma3ForConditionalGeneration)
    "transformer.h",  # GPT-2, GPT-J, Bloom
    "gpt_neox.layers",  # GPT-NeoX, Pythia
    "model.decoder.layers",  # OPT
    "transformer.blocks",  # MPT
)
_NORM_PATHS = (
    "model.norm",
    "model.language_model.norm",
    "transformer.ln_f",
    "gpt_neox.final_layer_norm",
    "model.decoder.final_layer_norm",
    "transformer.norm_f",
)


def _get_path(root: nn.Module, path: str):
    obj = root
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


@dataclass(frozen=True)
class Architecture:
    """The handles steering needs, found once per model."""

    model_type: str
    layers: nn.ModuleList
    final_norm: nn.Module | None
    lm_head: nn.Module
    hidden_size: int
    num_layers: int
    vocab_size: int
    tied_lm_head: bool
    logit_softcap: float | None
    layers_path: str
    # a dequantised W_U while a training loop that reads it every step runs (int8 weights; dense_unembedding)
    _dense: list = field(default_factory=list, repr=False, compare=False)

    @property
    def unembedding(self) -> torch.Tensor:
        """W_U with shape (vocab, hidden): logits = final_norm(h) @ W_U.T.

        With int8 weights this is the dequantised float32 matrix, made afresh on each call (vector analysis),
        or once for a whole training loop (:meth:`dense_unembedding`); the decode paths (:meth:`logits`,
        :meth:`logits_at`) read the codes."""
        if self._dense:
            return self._dense[0]
        return self.lm_head.weight

    @contextlib.contextmanager
    def dense_unembedding(self):
        """With int8 weights, dequantise W_U once for the block (a training loop's penalty reads it at every
        step); float models, and a block inside another, change nothing.  The copy is dropped on leaving."""
        if self.int8_unembedding is None or self._dense:
            yield
            return
        self._dense.append(self.int8_unembedding.dequantise())
        try:
            yield
        finally:
            self._dense.clear()

    @property
    def int8_unembedding(self):
        """The unembedding's :class:`~steer_ui.model.int8.Int8Weight` when the model's weights are int8, else None."""
        return getattr(self.lm_head, "int8", None)

    @property
    def final_mlp(self) -> nn.Module | None:
        """The last block's MLP as one module (``mlp`` in every family that has one; OPT's is not a module)."""
        mlp = getattr(self.layers[-1], "mlp", None)
        return mlp if isinstance(mlp, nn.Module) else None

    def final_hidden(self, h: torch.Tensor) -> torch.Tensor:
        """Apply the final norm (what the model does before lm_head)."""
        return self.final_norm(h) if self.final_norm is not None else h

    def logits(self, normed: torch.Tensor, pause: Callable[[], None] | None = None) -> torch.Tensor:
        """Unembed already-normalised hidden states of shape (..., hidden).

        ``pause``: called before each slice of :data:`PAUSE_VOCAB_ROWS` rows of
        W_U (:data:`PAUSE_VOCAB_ROWS_GPU` off the CPU), so a long unembedding can give way (the decode engine to a
        slider move) in between.

        With a 262k-token vocabulary the unembedding is most of a decode step,
        and for a handful of rows the CPU kernels for ``h @ W.T`` (what
        ``nn.Linear`` does), ``(W @ h.T).T`` and oneDNN's linear differ
        severalfold depending on the row and thread counts.  :func:`unembed`
        times them once per (rows, threads) and keeps the fastest.  Results
        agree to float rounding (not bit-for-bit) with ``lm_head(normed)``.
        """
        int8 = self.int8_unembedding
        w = int8 if int8 is not None else self.lm_head.weight
        shape = normed.shape
        flat = normed.reshape(-1, shape[-1]).to(torch.float32 if int8 is not None else w.dtype)

        def rows(start: int, end: int | None) -> torch.Tensor:
            return int8.slice(start, end).matmul(flat) if int8 is not None else unembed(w[start:end], flat)

        step = PAUSE_VOCAB_ROWS if flat.device.type == "cpu" else PAUSE_VOCAB_ROWS_GPU
        if pause is None or w.shape[0] <= step:
            out = rows(0, None)
        else:
            out = flat.new_empty((flat.shape[0], w.shape[0]))
            for start in range(0, w.shape[0], step):
                pause()
                end = start + step
                out[:, start:end] = rows(start, end)
        bias = getattr(self.lm_head, "bias", None)
        if bias is not None:
            out = out + bias
        out = out.float()
        if self.logit_softcap:
            out = torch.tanh(out / self.logit_softcap) * self.logit_softcap
        return out.reshape(*shape[:-1], out.shape[-1])

    def logits_at(self, normed: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        """The logit of one token per row: ``logits(normed)[i, token_ids[i]]`` without the full vocabulary.

        ``normed``: (rows, hidden); ``token_ids``: (rows,).  A dot product per
        row instead of a pass over W; equal to :meth:`logits` up to float rounding.
        """
        int8 = self.int8_unembedding
        if int8 is not None:
            ids = token_ids.reshape(-1).to(int8.device)
            out = (int8.rows(ids) * normed.reshape(-1, normed.shape[-1]).float()).sum(-1)
        else:
            w = self.lm_head.weight
            ids = token_ids.reshape(-1).to(w.device)
            flat = normed.reshape(-1, normed.shape[-1]).to(w.dtype)
            out = (w.index_select(0, ids) * flat).sum(-1)
        bias = getattr(self.lm_head, "bias", None)
        if bias is not None:
            out = out + bias.index_select(0, ids)
        out = out.float()
        if self.logit_softcap:
            out = torch.tanh(out / self.logit_softcap) * self.logit_softcap
        return out


def _onednn(w: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(flat, w, None, "none", [], "")


# The CPU candidates for ``flat @ w.T``, all equal up to float rounding.  On this machine's CPU (AMD EPYC) the
# BLAS (MKL) runs a one-row product at about half the speed its memory allows, while oneDNN's kernel for
# the same product reads the weights about 1.7x faster (and 2x for the 21 rows of a sweep).
_UNEMBED_KERNELS = {
    "plain": lambda w, flat: flat @ w.T,  # what nn.Linear does
    "transposed": lambda w, flat: torch.matmul(w, flat.T).T,
    "onednn": _onednn,
}
# kernel_key(w, rows) -> the name of the kernel that won on this machine
_UNEMBED_KERNEL: dict[tuple, str] = {}


def kernel_key(w: torch.Tensor, rows: int) -> tuple:
    """What a kernel's speed depends on: the weight's shape, layout and dtype, the rows, the threads.

    Not the weight's storage, so the equal slices of W_U that a pausable
    unembedding reads (:meth:`Architecture.logits`) share one timing.
    """
    return (tuple(w.shape), w.stride(), w.dtype, rows, torch.get_num_threads())


_TUNE_MIN_VOCAB = 16384  # below this every kernel takes microseconds: not worth timing
_TUNE_MAX_ROWS = 64


def _time_once(fn) -> float:
    import time

    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _candidates(w: torch.Tensor) -> list[str]:
    names = ["plain", "transposed"]
    # oneDNN has no backward and no reduced-precision kernel on every CPU: float32, inference only
    if w.dtype == torch.float32 and torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn,
                                                                                      "_linear_pointwise"):
        names.append("onednn")
    return names


def unembed(w: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
    """``flat @ w.T`` for (rows, hidden) ``flat`` and (vocab, hidden) ``w``, with the fastest CPU kernel.

    On CPU, for a large vocabulary and up to 64 rows, the first call for a
    given row count times each kernel of :data:`_UNEMBED_KERNELS` (best of
    three, alternated) and remembers the winner; ``flat @ w.T`` is kept
    unless another is at least 10 % faster.  Calls that need gradients, and
    other devices, use ``flat @ w.T``.
    """
    rows = flat.shape[0]
    if (flat.device.type != "cpu" or rows > _TUNE_MAX_ROWS or w.shape[0] < _TUNE_MIN_VOCAB
            or (torch.is_grad_enabled() and (flat.requires_grad or w.requires_grad))):
        return flat @ w.T
    key = kernel_key(w, rows)
    name = _UNEMBED_KERNEL.get(key)
    if name is None:
        best: dict[str, float] = {}
        names = _candidates(w)
        for _ in range(3):
            for candidate in list(names):
                try:
                    t = _time_once(lambda: _UNEMBED_KERNELS[candidate](w, flat))
                except RuntimeError:  # a kernel this build or CPU lacks
                    names.remove(candidate)
                    continue
                best[candidate] = min(best.get(candidate, t), t)
        name = min(best, key=best.get)
        if best[name] > 0.9 * best["plain"]:
            name = "plain"
        _UNEMBED_KERNEL[key] = name
    return _UNEMBED_KERNELS[name](w, flat)


_FAST_LINEAR_MAX_ROWS = 64  # decode steps, the slider's prefix re-runs, small prefills


def _fast_linear_forward(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    if (x.dtype == torch.float32 and x.device.type == "cpu"
            and not (torch.is_grad_enabled() and (x.requires_grad or module.weight.requires_grad))):
        flat = x.reshape(-1, x.shape[-1])
        if flat.shape[0] <= _FAST_LINEAR_MAX_ROWS:
            out = torch.ops.mkldnn._linear_pointwise(flat.contiguous(), module.weight, module.bias, "none", [], "")
            return out.reshape(*x.shape[:-1], out.shape[-1])
    return torch.nn.functional.linear(x, module.weight, module.bias)


_FAST_LINEAR_MIN_WEIGHTS = 1 << 16  # smaller matrices take microseconds either way (and tiny test models stay put)


def fast_cpu_linears(model: torch.nn.Module, layers) -> int:
    """Let the decoder blocks' linear layers use oneDNN's kernel for few rows, where it is faster; returns how many.

    A decode step multiplies 3 to 24 rows by each weight matrix.  On this
    machine's CPU (AMD EPYC, 2 cores) the BLAS (MKL) does that at a fraction
    of the speed the memory allows, and oneDNN's linear takes 40-50 % of its
    time for Gemma 3 270M's shapes.  One check per process decides: a
    (2048, 640) product on 3 rows, best of five samples of ten calls,
    alternated; oneDNN is used only if at least 20 % faster, and then for
    every float32 CPU weight of at least 2^16 values (the same choice for
    every shape, so results do not depend on how a timing came out per layer).
    Calls that need gradients (TSV training through the frozen blocks), other
    dtypes and devices, and more than 64 rows keep ``F.linear``.  Results
    equal ``F.linear``'s up to float rounding.
    """
    if not _onednn_linear_wins():
        return 0
    import functools

    changed = 0
    for block in layers:
        for module in block.modules():
            if type(module) is not torch.nn.Linear or "forward" in module.__dict__:
                continue
            w = module.weight
            if w.device.type == "cpu" and w.dtype == torch.float32 and w.numel() >= _FAST_LINEAR_MIN_WEIGHTS:
                module.forward = functools.partial(_fast_linear_forward, module)
                changed += 1
    return changed


@functools.lru_cache(maxsize=1)
def _onednn_linear_wins() -> bool:
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        return False
    probe = torch.nn.Linear(640, 2048, bias=False)
    x = torch.randn(3, 640)
    try:
        with torch.no_grad():
            plain = dnn = float("inf")
            for _ in range(5):  # ten calls a sample: one call is microseconds, below timer noise
                plain = min(plain, _time_once(lambda: [torch.nn.functional.linear(x, probe.weight) for _ in range(10)]))
                dnn = min(dnn, _time_once(lambda: [_fast_linear_forward(probe, x) for _ in range(10)]))
    except RuntimeError:  # a kernel this build or CPU lacks
        return False
    return dnn < 0.8 * plain


_BLOCK = 1024  # elements per block for the vocabulary-sized top-k / argmax below
_BLOCK_MAX_K = 64


def _blocks(x: torch.Tensor):
    """(rows, n) -> a (rows, n // _BLOCK, _BLOCK) view of the whole blocks, and the tail's start."""
    rows, n = x.shape
    whole = n // _BLOCK
    return x[:, : whole * _BLOCK].view(rows, whole, _BLOCK), whole * _BLOCK


def _use_blocks(x: torch.Tensor, k: int = 1) -> bool:
    return (x.dim() == 2 and x.device.type == "cpu" and x.is_contiguous() and x.shape[-1] >= 64 * _BLOCK
            and 0 < k <= _BLOCK_MAX_K)


def topk_last(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.topk(x, k, dim=-1)`` (values, indices; sorted) for (rows, vocab) ``x``, several times faster on CPU.

    ``torch.topk`` over 262,144 logits costs about 1 ms a row on this CPU, a
    noticeable slice of a decode step; a max over each block of 1,024 is a
    vectorised reduction costing a few percent of that.  Exact: a block holding
    one of the k largest values has fewer than k blocks with a larger maximum,
    so the k blocks with the largest maxima (plus the tail that fills no block)
    hold all of them.  Equal values may come back in a different order than
    ``torch.topk`` gives, as its order for ties is unspecified too.
    """
    if not _use_blocks(x, k):  # NaN needs no case: amax and topk both rank it above everything
        return tuple(torch.topk(x, k, dim=-1))
    main, tail_start = _blocks(x)
    kb = min(k, main.shape[1])
    picked = main.amax(-1).topk(kb, dim=-1).indices  # (rows, kb)
    span = torch.arange(_BLOCK, device=x.device)
    values = main.gather(1, picked.unsqueeze(-1).expand(-1, -1, _BLOCK)).reshape(x.shape[0], -1)
    index = (picked.unsqueeze(-1) * _BLOCK + span).reshape(x.shape[0], -1)
    if tail_start < x.shape[1]:
        values = torch.cat([values, x[:, tail_start:]], dim=1)
        tail = torch.arange(tail_start, x.shape[1], device=x.device).expand(x.shape[0], -1)
        index = torch.cat([index, tail], dim=1)
    top, where = values.topk(k, dim=-1)
    return top, index.gather(1, where)


def centred(delta_logits: torch.Tensor) -> torch.Tensor:
    """Δlogit minus its mean over the vocabulary (last dimension).

    Softmax ignores a shift shared by every logit, so the raw |Δlogit| can be
    large while no probability moves.  The centred change is shift-invariant:
    ``centred(d + c) == centred(d)`` for any per-row constant ``c``.  (The
    change of log-probabilities is the other shift-invariant choice; it
    subtracts the change of the log-normaliser instead of the mean, which a
    few dominant tokens set.)
    """
    return delta_logits - delta_logits.mean(-1, keepdim=True)


def argmax_last(x: torch.Tensor) -> torch.Tensor:
    """``x.argmax(-1)`` for (rows, vocab) ``x`` (the first maximal index, as torch documents), faster on CPU.

    ``argmax`` over a 262,144 vocabulary is not vectorised on this CPU (about
    0.3 ms a row), ``amax`` is; so the maximum comes from block maxima and
    only the first block that reaches it is searched for the index.
    """
    if not _use_blocks(x):
        return x.argmax(-1)
    main, tail_start = _blocks(x)
    block_max = main.amax(-1)  # (rows, blocks)
    best = block_max.amax(-1)
    if tail_start < x.shape[1]:
        best = torch.maximum(best, x[:, tail_start:].amax(-1))
    if torch.isnan(best).any():  # NaN counts as the maximum for argmax; leave those semantics to torch
        return x.argmax(-1)
    out = []
    for row in range(x.shape[0]):
        hits = (block_max[row] == best[row]).nonzero()
        if len(hits):
            b = int(hits[0])
            out.append(b * _BLOCK + int((main[row, b] == best[row]).nonzero()[0]))
        else:  # the maximum is only in the tail
            out.append(tail_start + int((x[row, tail_start:] == best[row]).nonzero()[0]))
    return torch.tensor(out, dtype=torch.long, device=x.device)


def discover(model: nn.Module) -> Architecture:
    """Find decoder blocks, final norm and unembedding; raise a clear error if not found."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", type(model).__name__)
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config

    layers, layers_path = None, None
    for path in _LAYER_PATHS:
        found = _get_path(model, path)
        if isinstance(found, nn.ModuleList) and len(found) > 0:
            layers, layers_path = found, path
            break
    norm = None
    for path in _NORM_PATHS:
        found = _get_path(model, path)
        if isinstance(found, nn.Module):
            norm = found
            break
    lm_head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None

    missing = []
    if layers is None:
        missing.append("decoder block list (tried: " + ", ".join(_LAYER_PATHS) + ")")
    if norm is None:
        missing.append("final norm (tried: " + ", ".join(_NORM_PATHS) + ")")
    if lm_head is None or (getattr(lm_head, "int8", None) is None and getattr(lm_head, "weight", None) is None):
        missing.append("unembedding (get_output_embeddings() returned nothing)")
    if missing:
        raise ArchitectureError(
            f"cannot steer model type '{model_type}' ({type(model).__name__}): could not find "
            + "; ".join(missing)
        )

    int8 = getattr(lm_head, "int8", None)  # int8 weights: shapes and tying from the codes, not a dequantised copy
    vocab, hidden = int8.shape if int8 is not None else lm_head.weight.shape
    input_emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if int8 is not None:
        tied = input_emb is not None and getattr(input_emb, "int8", None) is int8
    else:
        tied = input_emb is not None and input_emb.weight.data_ptr() == lm_head.weight.data_ptr()
    softcap = getattr(text_config, "final_logit_softcapping", None)
    return Architecture(
        model_type=str(model_type),
        layers=layers,
        final_norm=norm,
        lm_head=lm_head,
        hidden_size=int(hidden),
        num_layers=len(layers),
        vocab_size=int(vocab),
        tied_lm_head=bool(tied),
        logit_softcap=float(softcap) if softcap else None,
        layers_path=layers_path,
    )


def with_dense_unembedding(fn):
    """Run ``fn(handle, ...)`` inside ``handle.arch.dense_unembedding()`` (training loops with a logit penalty)."""
    @functools.wraps(fn)
    def run(handle, *args, **kwargs):
        with handle.arch.dense_unembedding():
            return fn(handle, *args, **kwargs)
    return run
