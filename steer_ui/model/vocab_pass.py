"""A decode step's logits summarised in one C pass a row: log-sum-exp and the k largest (``vocab_kernel.c``).

:meth:`~.generation.DecodeBatch.sample` needs, for every sampled row, its log-sum-exp (the chosen token's
log-probability), its k most likely tokens (the alternatives shown beside each token) and, for a greedy row, its
argmax.  Over a 262,144-token vocabulary torch took three passes for these, ~0.4 ms a row on this CPU (~7 ms for
the sixteen sampled rows of a many-users step); the kernel takes one (docs/bench.md, "A decode step's logits in
one pass").  A row's numbers are the same alone and in a batch.  The log-sum-exp sums in a different order than
torch's (in double within each of eight slices), so it agrees with ``torch.logsumexp`` to float32's rounding,
not bit for bit; the k largest and their indices are torch's (ties: the lower index first, so the first is
``argmax``).  Where the kernel cannot say (no C compiler, a GPU, NaN or an infinity in a row, a short
vocabulary) :func:`summarise` returns None and the caller keeps torch's passes.

:func:`compare` is the dose-response's pass (:func:`.analysis.sweep`): each steered row against the unsteered
one, its KL, entropy, argmax, top probability and largest |Δlogit| in one pass, the sums in double.
"""
from __future__ import annotations

import ctypes
import functools
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from .int8 import _library
from .switches import Setting

_SOURCE = Path(__file__).with_name("vocab_kernel.c")
MAX_K = 64  # vocab_kernel.c's
_SHORTEST = Setting(4096)  # below this a row is cheap for torch too


@dataclass
class Summary:
    lse: torch.Tensor  # (rows,) float32
    top_values: torch.Tensor  # (rows, k) float32, descending
    top_indices: torch.Tensor  # (rows, k) int64


@functools.lru_cache(maxsize=None)
def _kernel(extra_flags: tuple[str, ...] = ()):
    """``vocab_top`` of the built kernel, or None where no C compiler works; ``extra_flags`` as int8's (the tests
    build the AVX2 vectors on an AVX-512 machine with ``("-mno-avx512f",)``)."""
    library = _library(_SOURCE, extra_flags)
    if library is None:
        return None
    fn = library.vocab_top
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                   ctypes.c_void_p, ctypes.c_int]
    return fn


@dataclass
class Comparison:
    """Each row of steered logits against the unsteered row, as the dose-response frame reads it (float64)."""
    kl: torch.Tensor  # (rows,) KL(unsteered ‖ steered), nats
    entropy: torch.Tensor  # (rows,) of the steered distribution, nats
    lse: torch.Tensor  # (rows,) log-sum-exp of the steered logits
    top1: torch.Tensor  # (rows,) int64: the first index of each row's maximum (argmax)
    top1_prob: torch.Tensor  # (rows,)
    max_abs_delta_logit: torch.Tensor  # (rows,)


@functools.lru_cache(maxsize=None)
def _compare_kernel(extra_flags: tuple[str, ...] = ()):
    library = _library(_SOURCE, extra_flags)
    if library is None:
        return None
    fn = library.vocab_compare
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p,
                   ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
    return fn


def compare(logits: torch.Tensor, base: torch.Tensor, kernel=None) -> Comparison | None:
    """(rows, vocab) float32 ``logits`` against the (vocab,) float32 ``base`` row in one C pass a row, or None
    where torch's passes should say it (no C compiler, a GPU, NaN or an infinity in a row, fewer than 8 tokens).
    A row equal to ``base`` gets a KL of exactly 0.  ``kernel``: a build of it (tests)."""
    if logits.device.type != "cpu" or base.device.type != "cpu" or logits.dtype != torch.float32 \
            or base.dtype != torch.float32 or logits.dim() != 2 or base.shape != logits.shape[-1:] \
            or logits.shape[0] == 0:
        return None
    fn = kernel or _compare_kernel()
    if fn is None:
        return None
    x, b = logits.contiguous(), base.contiguous()
    pb = torch.softmax(b.double(), dim=-1)

    def run(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        argmax = torch.empty(rows.shape[0], dtype=torch.int64)
        out = torch.empty(rows.shape[0], 5, dtype=torch.float64)
        status = fn(rows.data_ptr(), rows.shape[0], rows.shape[1], b.data_ptr(), pb.data_ptr(), argmax.data_ptr(),
                    out.data_ptr(), torch.get_num_threads())
        return (argmax, out) if status == 0 else None

    # the base's own log-sum-exp from the same arithmetic (a row equal to it then has a KL of exactly 0), in a call
    # of its own: the rows are not copied beside it
    own, seen = run(b.unsqueeze(0)), run(x)
    if own is None or seen is None:
        return None
    argmax, out = seen
    top, lse, entropy, kl_term, gap = out.unbind(-1)
    # KL(p_b ‖ p_x) = Σ p_b ((b - lse_b) - (x - lse_x)) = Σ p_b (b - x) + lse_x - lse_b
    kl = (kl_term + (lse - own[1][0, 1])).clamp_min(0.0)
    return Comparison(kl=kl, entropy=entropy, lse=lse, top1=argmax, top1_prob=(top - lse).exp(),
                      max_abs_delta_logit=gap)


def summarise(logits: torch.Tensor, k: int, kernel=None) -> Summary | None:
    """Each row's log-sum-exp and ``k`` largest (values, indices) of (rows, vocab) float32 ``logits``, or None where
    torch's passes should say it (see the module docstring).  ``kernel``: a build of it (tests)."""
    if logits.device.type != "cpu" or logits.dtype != torch.float32 or logits.dim() != 2 \
            or logits.shape[-1] < _SHORTEST.value or not 1 <= k <= MAX_K or logits.shape[0] == 0:
        return None
    fn = kernel or _kernel()
    if fn is None:
        return None
    x = logits.contiguous()
    rows = x.shape[0]
    values = torch.empty(rows, k)
    indices = torch.empty(rows, k, dtype=torch.int64)
    lse = torch.empty(rows)
    status = fn(x.data_ptr(), rows, x.shape[1], k, values.data_ptr(), indices.data_ptr(), lse.data_ptr(),
                torch.get_num_threads())
    return Summary(lse, values, indices) if status == 0 else None


@contextmanager
def left_to_torch():
    """Inside, :func:`summarise` declines every row, so the decode takes torch's passes (A/B runs:
    ``python -m steer_ui.tools.kernel_ab --vocab-pass``)."""
    with _SHORTEST.held(1 << 62):
        yield
