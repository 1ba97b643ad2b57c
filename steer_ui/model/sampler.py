"""The sampler: the filters (repetition penalty, temperature, top-k, top-p) and the Gumbel-max draw.

Every sampled token of the app comes from here (the decode batch, one row or many).  Over a 262,144-token
vocabulary the straightforward forms were the costliest part of a sampled decode step on a CPU, more than the
model itself: top-p sorted the whole vocabulary (24 ms a row), and the draw turned every one of the vocabulary's
uniforms into Gumbel noise (2.7 ms) and added it to every logit in float64 (2 ms), for each row and step
(docs/bench.md, "Sampling without sorting the vocabulary").  The same filters and the same draw now look only at the
tokens that can matter:

* **top-p** keeps the smallest prefix of the tokens in descending order whose probability mass reaches ``top_p``
  (the token crossing it stays).  That prefix is found among the k largest logits, k = 64, 256, … (a blocked top-k
  over the vocabulary), with the probabilities normalised over the whole vocabulary; only when it would take more
  than :data:`_TOP_P_MOST` tokens is the vocabulary sorted.
* **Gumbel-max**: the token is ``argmax(processed + g(u))`` over the vocabulary, ``u`` the step's uniforms from the
  request's stream and ``g(u) = -log(-log u)``, which grows with ``u``.  No token can reach the best score of the
  few largest logits unless its logit is at least that score minus ``g(max u)``, so the noise is computed, and
  added, for those tokens only.  The token is the one the whole-vocabulary formula picks (the first index on a
  tie), up to the last bit of float64 noise.

Both keep the stream: each step still draws one uniform per vocabulary token, so a seed gives the same tokens as
before.  Rows are computed alone, so a request samples the same tokens alone and in a batch.
"""
from __future__ import annotations

import math

import torch

from . import mt_stream
from .architecture import argmax_last, topk_last

_TOP_P_FIRST = 64  # candidates first tried for top-p's prefix; multiplied by 4 while the prefix needs more
_TOP_P_MOST = 16384  # past this many candidates the whole vocabulary is sorted (a flat distribution)
_GUMBEL_PROBES = 64  # the largest logits, whose noisy scores set the bar the other tokens must reach
_SHORT = 4096  # vocabularies up to this size take the plain forms (nothing to save)
_SMALLEST_UNIFORM = 1e-300  # a uniform of 0 is raised to this (its Gumbel noise would be -inf)


def process_logits(logits: torch.Tensor, history: torch.Tensor | None, s) -> torch.Tensor:
    """Apply repetition penalty, temperature, top-k and top-p to (rows, vocab) logits.

    Filtered-out tokens get -inf.  Greedy (temperature 0) only applies the
    repetition penalty.  ``logits`` is never modified; when there is nothing
    to apply it is returned as is (no copy of a vocabulary-sized tensor).
    """
    penalise = s.repetition_penalty != 1.0 and history is not None and history.numel()
    if not penalise and s.temperature == 0:
        return logits
    logits = logits.clone()
    if penalise:
        history = history.to(logits.device)
        seen = torch.gather(logits, 1, history)
        seen = torch.where(seen < 0, seen * s.repetition_penalty, seen / s.repetition_penalty)
        logits.scatter_(1, history, seen)
    if s.temperature == 0:
        return logits
    logits = logits / s.temperature
    top_k = s.top_k if s.top_k and s.top_k < logits.shape[-1] else 0
    if s.top_p < 1.0:
        return top_p_filter(logits, s.top_p, top_k)
    return top_k_filter(logits, top_k) if top_k else logits


def top_k_filter(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """``logits`` with -inf below each row's ``top_k``-th largest value (tokens tied with it stay)."""
    kth = topk_last(logits, top_k)[0][:, -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: torch.Tensor, top_p: float, top_k: int = 0) -> torch.Tensor:
    """``logits`` (rows, vocab), first cut to the ``top_k`` largest (where given, as :func:`top_k_filter`), with
    -inf outside each row's smallest descending prefix whose mass reaches ``top_p`` (the token crossing it kept),
    the mass normalised over what top-k kept.  The masses are float64: over thousands of kept tokens float32's
    sums moved the cut by a few tokens between two summation orders."""
    if logits.device.type == "cpu" and logits.shape[-1] > _SHORT:
        found = _top_p_from_candidates(logits, top_p, top_k)
        if found is not None:
            return found
    return top_p_by_sorting(logits, top_p, top_k)


def top_p_by_sorting(logits: torch.Tensor, top_p: float, top_k: int = 0) -> torch.Tensor:
    """:func:`top_p_filter` by sorting each whole row (a GPU's way, a short vocabulary's, a flat row's)."""
    if top_k:
        logits = top_k_filter(logits, top_k)
    sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
    probs = (sorted_logits.double() - _log_mass(logits)).exp()
    drop_sorted = (probs.cumsum(-1) - probs) >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def _top_p_from_candidates(logits: torch.Tensor, top_p: float, top_k: int) -> torch.Tensor | None:
    """:func:`top_p_filter` from the k largest logits of each row, or None where a row needs more than
    :data:`_TOP_P_MOST` of them, ties with the top-k's last, or is not finite where it matters (the caller
    sorts)."""
    vocab = logits.shape[-1]
    if top_k:
        values, index = topk_last(logits, min(top_k + 1, vocab))
        if top_k < vocab and bool((values[:, top_k - 1] == values[:, top_k]).any()):
            return None  # the top-k mask keeps every token tied with its last: more than k
        values, index = values[:, :top_k], index[:, :top_k]
        lse = _log_mass(values)
    else:
        lse = _log_mass(logits)
    if not torch.isfinite(lse).all():
        return None
    k = _TOP_P_FIRST
    while True:
        if not top_k:  # top-k's candidates are taken above; otherwise the 64, 256, ... largest
            values, index = topk_last(logits, min(k, vocab))
        probs = (values.double() - lse).exp()
        dropped = (probs.cumsum(-1) - probs) >= top_p  # the same rule as over the sorted vocabulary
        if top_k or k >= vocab or bool(dropped.any(-1).all()):
            break
        if k >= _TOP_P_MOST:
            return None
        k *= 4
    out = torch.full_like(logits, float("-inf"))
    for row in range(logits.shape[0]):
        kept = int((~dropped[row]).sum())  # a prefix: once the mass before a token reaches top_p it stays so
        out[row, index[row, :kept]] = values[row, :kept]
    return out


def _log_mass(logits: torch.Tensor) -> torch.Tensor:
    """(rows, 1) float64 log Σ exp of each row (-inf entries add nothing): the normaliser both top-p paths share,
    so that they cut at the same token."""
    top = logits.amax(dim=-1, keepdim=True).double()
    return top + (logits.double() - top).exp_().sum(-1, keepdim=True).log_()


def noise_generator(seed: int, device) -> torch.Generator:
    """A request's random stream, seeded, on the ``device`` that samples.

    Drawing the noise where the logits are saves a vocabulary-sized float64
    copy from host to device per sampled request and step (1 MB at a 128k
    vocabulary).  CUDA and CPU draw float64; other accelerators (MPS has no
    float64) draw on the CPU.  A seed gives the same tokens on every run on
    one device type, not the same tokens on CPU and CUDA (their generators
    differ), as with any PyTorch sampler.
    """
    device = torch.device(device)
    if device.type not in ("cpu", "cuda"):
        device = torch.device("cpu")
    return torch.Generator(device=device).manual_seed(int(seed))


def uniforms(rng: torch.Generator, vocab: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """(vocab,) float64 uniforms from ``rng``, on its device: one step's draw for one request (its rows share it).
    Clamped away from 0, where the Gumbel transform would give -inf.  Written into ``out`` where given (the
    caller's buffer from the step before: a (vocab,) float64 tensor on ``rng``'s device).  On the CPU the numbers
    come from :func:`.mt_stream.rand64` (torch's, bit for bit, several times faster)."""
    drawn = mt_stream.rand64(rng, vocab, _SMALLEST_UNIFORM, out=out)
    if drawn is not None:
        return drawn
    if out is None:
        out = torch.empty(vocab, dtype=torch.float64, device=rng.device)
    return torch.rand(vocab, generator=rng, dtype=torch.float64, device=rng.device, out=out).clamp_(
        min=_SMALLEST_UNIFORM)


def gumbel(u: torch.Tensor) -> torch.Tensor:
    """Gumbel noise ``-log(-log u)`` of uniforms ``u``."""
    return u.log().neg_().log_().neg_()


def choose(processed: torch.Tensor, s, u: torch.Tensor | None) -> torch.Tensor:
    """Greedy argmax, or a sample: the argmax of the processed logits plus the Gumbel noise of the uniforms ``u``
    (one step's draw, shared by the rows).

    Gumbel-max draws from softmax(processed) exactly.  Unlike inverse-CDF
    sampling it is all but immune to float noise: a token changes only if
    the two best perturbed scores lie within the noise of each other, while
    an inverse CDF over a 262k vocabulary moves a boundary past the uniform
    whenever the draw lands in the tail, where boundaries are ~1e-6 apart.
    So a request gets the same sampled tokens alone and in a batch.  Rows
    given the same noise and equal logits pick the same token (α = 0).
    """
    if s.temperature == 0:
        return argmax_last(processed)
    return gumbel_max(processed, u)


def gumbel_max(processed: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """(rows,) ``argmax(processed.double() + gumbel(u))`` per row (the first index on a tie), where only the tokens
    that can win get their noise (see the module's docstring)."""
    if processed.device.type != "cpu" or processed.shape[-1] <= _SHORT:
        return whole_vocabulary_draw(processed, u)
    top_noise = float(gumbel(u.max().reshape(1)))  # the most noise any token gets: g grows with u
    picked = []
    for row in processed:
        token = _row_gumbel_max(row, u, top_noise)
        if token is None:  # NaN or infinite scores: the whole-vocabulary formula says what they mean
            return whole_vocabulary_draw(processed, u)
        picked.append(token)
    return torch.tensor(picked, device=processed.device)


def whole_vocabulary_draw(processed: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """(rows,) ``argmax(processed.double() + gumbel(u))``, every token's noise added: what :func:`gumbel_max`
    equals, and its way where the shortcut does not apply."""
    return argmax_last(processed.double() + gumbel(u).to(processed.device))


def _row_gumbel_max(row: torch.Tensor, u: torch.Tensor, top_noise: float) -> int | None:
    probe_values, probe_index = (t[0] for t in topk_last(row.unsqueeze(0), min(_GUMBEL_PROBES, row.numel())))
    probe_scores = probe_values.double() + gumbel(u[probe_index])
    best_score = probe_scores.max()
    bar = float(best_score)
    if not math.isfinite(bar):
        return None
    # a token whose logit plus the most noise stays below the bar cannot win (less a margin for the float64
    # sums' own rounding); the float32 cut sits at or below that, so no token that could win is left out
    lowest = bar - top_noise - 1e-9 * (abs(bar) + abs(top_noise) + 1.0)
    cut = torch.tensor(lowest, dtype=torch.float64).float()
    if float(cut) > lowest:
        cut = torch.nextafter(cut, torch.tensor(float("-inf")))
    if probe_values[-1] < cut:  # every token that can win is a probe: the best score, the first index on a tie
        return int(probe_index[probe_scores == best_score].min())
    candidates = (row >= cut).nonzero().squeeze(1)  # ascending: argmax's first maximum is the first index
    scores = row[candidates].double() + gumbel(u[candidates])
    return int(candidates[int(scores.argmax())])
