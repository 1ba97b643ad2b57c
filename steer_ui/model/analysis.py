"""What steering does to the next-token distribution and to the logits.

Everything returns pandas DataFrames (or small dataclasses of them) so the
plots and the CLI read the same numbers.

The slider's fast path is the frozen-prefix engine (:mod:`.prefix`): steering
at block L leaves blocks 0..L untouched, so a prompt runs once up to block L
(:func:`prefix_state` keeps a few of them) and each new α re-runs only blocks
L+1.. on ``h_L + α·v``, then unembeds the last position alone.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import pandas as pd
import torch

from . import vocab_pass
from .architecture import argmax_last, topk_last
from .generation import encode_prompt
from .hooks import Steer, StepState, steering
from .units import relative_scale
from .prefix import Prefix, for_prompt


# ----------------------------------------------------------------- fast path
_PREFIX_LRU_SIZE = 8
_PREFIX_LRU_LOCK = threading.Lock()  # the LRU dict only: never the long jobs' lock, so the slider never waits on them


def prefix_state(handle, prompt: str, layer: int) -> Prefix:
    """The prompt's frozen prefix at ``layer``, from a shared LRU per (prompt, layer)."""
    lru = handle.__dict__.setdefault("_prefix_lru", OrderedDict())
    key = (prompt, layer)
    with _PREFIX_LRU_LOCK:
        if key in lru:
            lru.move_to_end(key)
            return lru[key]
    # computed outside the lock: one visitor's long new prompt must not hold up everyone's slider (two
    # threads may both compute the same prefix once; the results are equal and the second one is kept)
    st = for_prompt(handle, prompt, layer)
    with _PREFIX_LRU_LOCK:
        lru[key] = st
        while len(lru) > _PREFIX_LRU_SIZE:
            lru.popitem(last=False)
    return st


def naive_logits(handle, prompt: str, steers: Sequence[Steer], rows: int = 1) -> torch.Tensor:
    """The slow reference: full forward with hooks and full logits at every position."""
    ids = encode_prompt(handle, prompt).to(handle.input_device).expand(rows, -1)
    with torch.inference_mode(), steering(handle, steers, StepState(prompt_len=None)):
        out = handle.model(input_ids=ids, use_cache=False)
    return out.logits[:, -1, :].float().cpu()


# ----------------------------------------------------------- distributions
def _decode_ids(handle, ids) -> list[str]:
    """Token strings for display; a byte-fallback token (one that decodes to U+FFFD alone) keeps its own
    name, e.g. ``<0xE5>``, instead of a box."""
    ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
    if not ids:
        return []
    texts = handle.tokenizer.batch_decode([[int(i)] for i in ids])
    broken = [k for k, t in enumerate(texts) if "\ufffd" in t]
    if broken:
        names = handle.tokenizer.convert_ids_to_tokens([int(ids[k]) for k in broken])
        for k, name in zip(broken, names):
            texts[k] = str(name)
    return texts


def _entropy(logp: torch.Tensor, prob: torch.Tensor | None = None) -> torch.Tensor:
    """Entropy in nats along the last axis; ``prob``: ``logp.exp()`` where the caller has it already."""
    terms = logp.exp().mul_(logp) if prob is None else prob * logp
    return -terms.sum(-1)


def _kl(logp: torch.Tensor, logq: torch.Tensor, p: torch.Tensor | None = None) -> torch.Tensor:
    """KL(p ‖ q) in nats along the last axis; ``p``: ``logp.exp()`` where the caller has it already.

    One vocabulary-sized temporary the shape of ``logq`` (which ``logp`` broadcasts to): 21 sweep rows of a
    262k vocabulary are 22 MB a temporary."""
    return logq.neg().add_(logp).mul_(logp.exp() if p is None else p).sum(-1)


# The tokens that matter: those a sampler could pick, before or after steering (the chart's promoted tokens are
# likely after it, its suppressed ones were likely before it).  A vector that separates
# classes moves thousands of tail tokens (p ~ 1e-12 before and after) by more than it moves any likely one,
# so the raw maximum over a 262k vocabulary fires at almost any α and says nothing a reader can see.
LIKELY_PROB = 1e-3
# The explosion flag: the largest centred |Δlogit| among likely tokens above this (one likely token's odds
# against the rest moved by e^10 ≈ 22,000×).  On the embedded model's default view (KL 0.98 nats, fluent) it
# is 7.6; at twice its α (KL 3.5) 14.9; at the extended range's end far above.
EXPLOSION_THRESHOLD = 10.0
# Below this no logit moved beyond float32 rounding (α = 0 leaves ±5e-6 on Gemma): the view then says nothing
# moved, with empty rankings and maxima of 0, rather than rank rounding noise.
NO_CHANGE = 1e-4


@dataclass
class NextTokenView:
    unsteered: pd.DataFrame  # rank, token, token_id, prob, logit
    steered: pd.DataFrame
    promoted: pd.DataFrame  # token, token_id, delta_logit: the whole vocabulary's most promoted
    suppressed: pd.DataFrame
    kl: float
    entropy_unsteered: float
    entropy_steered: float
    max_abs_delta_logit: float  # raw, over the whole vocabulary
    max_delta_token: str
    # among likely tokens (p ≥ LIKELY_PROB before or after): the chart's default, and the explosion flag
    likely_promoted: pd.DataFrame | None = None
    likely_suppressed: pd.DataFrame | None = None
    likely_max_abs_delta_logit: float = 0.0  # centred: Δlogit minus its vocabulary mean
    likely_max_delta_token: str = ""
    likely_tokens: int = 0

    @property
    def exploding(self) -> bool:
        return self.likely_max_abs_delta_logit > EXPLOSION_THRESHOLD

    def as_dict(self) -> dict:
        records = lambda f: [] if f is None else f.to_dict("records")  # noqa: E731
        return {
            # token ids too: the bars pair each token's two probabilities by id (a saved result redraws them)
            "unsteered": self.unsteered[["token", "token_id", "prob"]].to_dict("records"),
            "steered": self.steered[["token", "token_id", "prob"]].to_dict("records"),
            "kl": self.kl, "entropy_unsteered": self.entropy_unsteered, "entropy_steered": self.entropy_steered,
            "max_abs_delta_logit": self.max_abs_delta_logit, "max_delta_token": self.max_delta_token,
            "promoted": records(self.promoted), "suppressed": records(self.suppressed),
            "likely_prob": LIKELY_PROB, "likely_tokens": self.likely_tokens,
            "likely_max_abs_delta_logit": self.likely_max_abs_delta_logit,
            "likely_max_delta_token": self.likely_max_delta_token,
            "likely_promoted": records(self.likely_promoted), "likely_suppressed": records(self.likely_suppressed),
            "exploding": self.exploding, "explosion_threshold": EXPLOSION_THRESHOLD,
        }


def _topk(x: torch.Tensor, k: int, largest: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.topk`` of a vocabulary-sized vector (values, indices) through the block-wise kernel."""
    values, indices = topk_last((x if largest else -x).unsqueeze(0), k)
    return (values[0] if largest else -values[0]), indices[0]


def _top_frame(handle, logits: torch.Tensor, k: int, logp: torch.Tensor | None = None) -> pd.DataFrame:
    # top-k of the logits is the top-k of the probabilities; only k exponentials are needed
    values, indices = _topk(logits, k)
    if logp is None:
        logp = logits.log_softmax(-1)
    return pd.DataFrame({
        "rank": range(1, k + 1),
        "token": _decode_ids(handle, indices),
        "token_id": indices.tolist(),
        "prob": logp[indices].exp().tolist(),
        "logit": values.tolist(),
    })


def _delta_frame(handle, values: torch.Tensor, ids: torch.Tensor, lu: torch.Tensor | None = None,
                 ls: torch.Tensor | None = None) -> pd.DataFrame:
    columns = {"token": _decode_ids(handle, ids), "token_id": ids.tolist(), "delta_logit": values.tolist()}
    if lu is not None:
        # in the one constructor: two columns added to a made frame cost pandas ~3x the whole frame (a slider move
        # makes two of these)
        columns["prob_unsteered"] = lu[ids].exp().tolist()
        columns["prob_steered"] = ls[ids].exp().tolist()
    return pd.DataFrame(columns)


def _likely(logp: torch.Tensor, prob: torch.Tensor) -> torch.Tensor:
    """Mask of the tokens given at least LIKELY_PROB (its top token always: a flat distribution has one)."""
    mask = prob >= LIKELY_PROB
    mask[int(argmax_last(logp.unsqueeze(0))[0])] = True
    return mask


@dataclass
class Reference:
    """The unsteered side of next-token views: what :func:`compare_logits` needs of it, computed once.

    Every slider move on one prompt and block compares against the same
    unsteered logits; :func:`unsteered_reference` keeps this beside the
    prompt's frozen prefix so a move pays only for its steered side.
    """

    logits: torch.Tensor  # (vocab,) float32
    logp: torch.Tensor
    prob: torch.Tensor
    entropy: float
    likely: torch.Tensor  # bool (vocab,)
    frames: dict = field(default_factory=dict)  # top_k -> its top-k frame

    @classmethod
    def of(cls, logits: torch.Tensor) -> "Reference":
        logits = logits.float()
        logp = logits.log_softmax(-1)
        prob = logp.exp()
        return cls(logits, logp, prob, float(_entropy(logp, prob)), _likely(logp, prob))

    def frame(self, handle, top_k: int) -> pd.DataFrame:
        if top_k not in self.frames:
            self.frames[top_k] = _top_frame(handle, self.logits, top_k, self.logp)
        return self.frames[top_k].copy()  # a view's frames are its own


def unsteered_reference(st: Prefix) -> Reference:
    """The unsteered side of ``st``'s (first row's) next-token views, kept with the prefix."""
    ref = st.memo.get("reference")
    if ref is None:  # two threads may both build it once; the results are equal
        ref = st.memo["reference"] = Reference.of(st.unsteered_logits[0])
    return ref


def compare_logits(handle, unsteered: torch.Tensor | Reference, steered: torch.Tensor,
                   top_k: int = 10) -> NextTokenView:
    """Top-k of both sides, KL(unsteered ‖ steered), entropies and the Δlogit rankings and extremes.

    ``unsteered``: the logits, or their :class:`Reference` (the slider's case: built once per prompt)."""
    ref = unsteered if isinstance(unsteered, Reference) else Reference.of(unsteered)
    steered = steered.float()
    ls = steered.log_softmax(-1)
    ps = ls.exp()
    delta = steered - ref.logits
    worst = int(argmax_last(delta.abs().unsqueeze(0))[0])
    moved = float(delta[worst].abs()) > NO_CHANGE
    ranked = top_k if moved else 0  # nothing moved: no Δlogit ranking and no maxima (see NO_CHANGE)
    up_values, up_ids = _topk(delta, ranked)
    down_values, down_ids = _topk(delta, ranked, largest=False)
    # promoted: what steering makes likely; suppressed: what was likely and is pushed down
    after, before = _likely(ls, ps), ref.likely
    likely_ids = torch.nonzero(after | before).flatten()  # one pass over the vocabulary; the pools are its parts
    up_pool, down_pool = likely_ids[after[likely_ids]], likely_ids[before[likely_ids]]
    up_order = up_pool[torch.topk(delta[up_pool], min(ranked, up_pool.numel())).indices]
    down_order = down_pool[torch.topk(-delta[down_pool], min(ranked, down_pool.numel())).indices]
    # centred (see architecture.centred), on the likely tokens only: Δlogit minus its vocabulary mean
    likely_centred = (delta[likely_ids] - delta.mean()).abs()
    likely_worst = int(likely_centred.argmax())
    return NextTokenView(
        unsteered=ref.frame(handle, top_k),
        steered=_top_frame(handle, steered, top_k, ls),
        promoted=_delta_frame(handle, up_values, up_ids),
        suppressed=_delta_frame(handle, down_values, down_ids),
        kl=float(_kl(ref.logp, ls, ref.prob)),
        entropy_unsteered=ref.entropy,
        entropy_steered=float(_entropy(ls, ps)),
        max_abs_delta_logit=float(delta[worst].abs()) if moved else 0.0,
        max_delta_token=handle.tokenizer.decode([worst]) if moved else "",
        likely_promoted=_delta_frame(handle, delta[up_order], up_order, ref.logp, ls),
        likely_suppressed=_delta_frame(handle, delta[down_order], down_order, ref.logp, ls),
        likely_max_abs_delta_logit=float(likely_centred[likely_worst]) if moved else 0.0,
        likely_max_delta_token=handle.tokenizer.decode([int(likely_ids[likely_worst])]) if moved else "",
        likely_tokens=int(likely_ids.numel()),
    )


class AlphaGrid:
    """Next-token views precomputed over a grid of α, so dragging the slider is a lookup.

    An optional speed mode: the grid's logits come from batched fast-path
    passes (rows of 21 α), equal to single calls up to float rounding.  A
    lookup at an α that is not on the grid is never answered with a
    neighbour: it is computed (and remembered); :meth:`nearest` is there for
    a slider whose step matches the grid.
    """

    def __init__(self, handle, prompt: str, steer: Steer, alphas: Sequence[float], top_k: int = 10,
                 batch: int = 21):
        if not isinstance(steer, Steer):
            raise ValueError("an α grid needs a Steer (one layer, one direction)")
        self.handle, self.prompt, self.steer, self.top_k = handle, prompt, steer, top_k
        self.alphas = sorted({float(a) for a in alphas})
        if not self.alphas:
            raise ValueError("an α grid needs at least one α")
        self.state = prefix_state(handle, prompt, steer.layer)
        self.views: dict[float, NextTokenView] = {}
        for start in range(0, len(self.alphas), batch):
            chunk = self.alphas[start:start + batch]
            logits = self.state.logits([steer.with_alpha(torch.tensor(chunk))], rows=len(chunk))
            for a, row in zip(chunk, logits):
                self.views[a] = compare_logits(handle, unsteered_reference(self.state), row, top_k)

    def nearest(self, alpha: float) -> tuple[float, NextTokenView]:
        """The grid point closest to ``alpha`` and its view (for a slider that snaps to the grid)."""
        a = min(self.alphas, key=lambda g: abs(g - float(alpha)))
        return a, self.views[a]

    def view(self, alpha: float) -> NextTokenView:
        """The view at exactly ``alpha``: a lookup on the grid, else one fast-path call."""
        alpha = float(alpha)
        span = max(abs(self.alphas[0]), abs(self.alphas[-1]), 1e-12)
        a, found = self.nearest(alpha)
        if abs(a - alpha) <= 1e-9 * span:
            return found
        if alpha not in self.views:
            logits = self.state.logits([self.steer.with_alpha(alpha)], rows=1)[0]
            self.views[alpha] = compare_logits(self.handle, unsteered_reference(self.state), logits, self.top_k)
        return self.views[alpha]


def next_token(handle, prompt: str, steers: Sequence[Steer], top_k: int = 10, fast: bool = True) -> NextTokenView:
    """Top-k next tokens unsteered vs steered, KL, entropies and the Δlogit extremes."""
    if not steers:
        steers = []
    if fast and steers and all(isinstance(s, Steer) for s in steers):
        layer = min(s.layer for s in steers)
        ok = all(s.fn is None or s.context_layer <= layer for s in steers)
    else:
        ok = False
    if ok:
        st = prefix_state(handle, prompt, layer)
        steered = st.logits(steers, rows=1)[0]
        unsteered = unsteered_reference(st)
    else:
        unsteered = naive_logits(handle, prompt, [])[0]
        steered = naive_logits(handle, prompt, steers)[0] if steers else unsteered
    return compare_logits(handle, unsteered, steered, top_k)


def sweep(handle, prompt: str, vector: torch.Tensor, layer: int, alphas: Sequence[float],
          positions: str = "all", target: str | None = None, held: Sequence = ()) -> pd.DataFrame:
    """Dose-response from one batched pass: each α is a batch row.  ``held``: other steers applied unchanged in
    every row (several vectors at once: one term swept, the others held); the prefix is cached below the lowest
    steered block, where only residual steers may act (``Prefix.logits``)."""
    alphas = [float(a) for a in alphas]
    st = prefix_state(handle, prompt, min([layer] + [s.layer for s in held]))
    steer = Steer(layer=layer, vector=vector, alpha=torch.tensor(alphas), positions=positions)
    logits = st.logits([steer, *held], rows=len(alphas))
    base = st.unsteered_logits[:1]
    tid = first_token_id(handle, target) if target else None
    # every row against the unsteered one in one C pass a row where the kernel takes them (vocab_pass.compare:
    # five torch passes over 21 x 262,144 logits were ~20 ms of the sweep), else torch's passes
    seen = vocab_pass.compare(logits, base[0])
    if seen is not None:
        top1, kl, entropy, top1_prob, gap = (seen.top1, seen.kl, seen.entropy, seen.top1_prob,
                                             seen.max_abs_delta_logit)
        target_logprob = None if tid is None else logits[:, tid].double() - seen.lse
    else:
        lu, ls = base.log_softmax(-1), logits.log_softmax(-1)
        top1 = argmax_last(ls)
        kl, entropy = _kl(lu, ls), _entropy(ls)
        top1_prob = ls.gather(1, top1.unsqueeze(1)).squeeze(1).exp()
        gap = (logits - base).abs_().amax(-1)  # one temporary, not two
        target_logprob = None if tid is None else ls[:, tid]
    frame = pd.DataFrame({
        "alpha": alphas,
        "kl": kl.tolist(),
        "entropy": entropy.tolist(),
        "top1_token": _decode_ids(handle, top1),
        "top1_token_id": top1.tolist(),
        "top1_prob": top1_prob.tolist(),
        "max_abs_delta_logit": gap.tolist(),
    })
    if tid is not None:
        frame["target_token"] = handle.tokenizer.decode([tid])
        frame["target_prob"] = target_logprob.exp().tolist()
    return frame


def mean_kl_curve(handle, direction: torch.Tensor, layer: int, relative_alphas: Sequence[float],
                  prompts: Sequence[str]) -> np.ndarray:
    """Mean next-token KL(unsteered ‖ steered) over ``prompts`` for the unit ``direction`` at ``layer``, at each
    α in relative units (one batched :func:`sweep` per prompt).  What the recommended α range and the
    calibrated slider are read from."""
    unit = direction / direction.norm().clamp_min(1e-12)
    scale = relative_scale(handle, layer)
    total = np.zeros(len(relative_alphas))
    for p in prompts:
        total += sweep(handle, p, unit, layer, [a * scale for a in relative_alphas])["kl"].to_numpy()
    return total / len(prompts)


def first_token_id(handle, text: str) -> int:
    ids = handle.tokenizer(text, add_special_tokens=False).input_ids
    if not ids:
        raise ValueError(f"target '{text}' tokenises to nothing")
    return int(ids[0])


def vocab_projection(handle, vector: torch.Tensor, top_k: int = 15) -> pd.DataFrame:
    """v·W_Uᵀ: the tokens a vector pushes up (+) and down (−) through the unembedding alone."""
    int8 = handle.arch.int8_unembedding
    if int8 is not None:  # the kernel on the codes, not a dequantised 262k-row copy per call
        proj = int8.matmul(vector.to(int8.device, torch.float32)[None])[0].cpu()
    else:
        w = handle.arch.unembedding
        proj = torch.matmul(w, vector.to(w.device, w.dtype)).float().cpu()
    up, down = torch.topk(proj, top_k), torch.topk(-proj, top_k)
    return pd.DataFrame({
        "direction": ["+"] * top_k + ["-"] * top_k,
        "token": _decode_ids(handle, up.indices) + _decode_ids(handle, down.indices),
        "token_id": up.indices.tolist() + down.indices.tolist(),
        "projection": up.values.tolist() + (-down.values).tolist(),
    })


@dataclass
class TeacherForced:
    """An answer read after a prompt: its token ids, their (rows, n) log-probabilities, and (when asked) the
    (rows, n, width) residual at one block's output over the answer's positions."""
    token_ids: torch.Tensor
    logprobs: torch.Tensor
    residual: torch.Tensor | None = None


def teacher_forced(handle, prompt: str, answer: str, steers: Sequence[Steer] = (), rows: int = 1,
                   record: int | None = None) -> TeacherForced:
    """Teacher-forced log-probability of each token of ``answer`` after ``prompt`` in ``rows`` batch rows, row r
    steered with each steer's r-th α (answer tokens count as generated positions); ``record``: also keep the
    residual at that block's output over the answer (what the model reads the answer as)."""
    from .capture import recording

    p_ids = encode_prompt(handle, prompt)
    a_ids = handle.tokenizer(answer, add_special_tokens=False, return_tensors="pt").input_ids
    if a_ids.shape[1] == 0:
        raise ValueError("the answer is empty")
    n = a_ids.shape[1]
    ids = torch.cat([p_ids, a_ids], dim=1).to(handle.input_device).expand(rows, -1)
    with torch.inference_mode(), steering(handle, list(steers), StepState(prompt_len=p_ids.shape[1])), \
            recording(handle, [] if record is None else [record]) as store:
        out = handle.model.base_model(input_ids=ids, use_cache=False)
        hidden = out.last_hidden_state[:, -n - 1:-1, :]
        logits = torch.stack([handle.arch.logits(hidden[r]) for r in range(rows)])
    lp = logits.log_softmax(-1)[:, torch.arange(n), a_ids[0].to(logits.device)].float().cpu()
    residual = store[record][:, -n:, :].float().cpu() if record is not None else None
    return TeacherForced(token_ids=a_ids[0], logprobs=lp, residual=residual)


def residual_reads(handle, items: Sequence[tuple[str, str]], layer: int, batch_size: int = 16,
                   token_budget: int = 4096) -> list[torch.Tensor | None]:
    """Per (prompt, text): the residual at block ``layer``'s output over the text's tokens (n, width), as the
    *unsteered* model reads the text after the prompt; None for an empty text.

    Texts of similar length go through together, left-padded (position ids count real tokens, so each row
    sees what it would see alone), and each batch stops after block ``layer``: no later block and no
    unembedding run, which is most of a teacher-forced read's cost."""
    from .capture import capture_through, left_pad, length_batches

    rows, lengths = [], []
    for prompt, text in items:
        answer = handle.tokenizer(text, add_special_tokens=False).input_ids if text else []
        rows.append((encode_prompt(handle, prompt)[0].tolist() + list(answer), len(answer)))
        lengths.append(len(rows[-1][0]))
    out: list[torch.Tensor | None] = [None] * len(items)
    pad = handle.tokenizer.pad_token_id if handle.tokenizer.pad_token_id is not None else 0
    for batch in length_batches(lengths, batch_size, token_budget):
        batch = [i for i in batch if rows[i][1] > 0]
        if not batch:
            continue
        ids, attn, positions = left_pad([rows[i][0] for i in batch], pad)
        with torch.inference_mode():
            residual = capture_through(handle, ids, layer, attn, positions).float().cpu()
        for k, i in enumerate(batch):
            out[i] = residual[k, -rows[i][1]:]
    return out


def score_answer(handle, prompt: str, answer: str, steers: Sequence[Steer]) -> pd.DataFrame:
    """Teacher-forced log-probability of each answer token after ``prompt``, unsteered vs steered.

    Answer tokens count as generated positions.  ``frame.attrs['nats_shifted']``
    is the total change in answer log-probability.
    """
    rows = [s.with_alpha(torch.stack([torch.zeros(()), s.scalar_alpha])) for s in steers]
    read = teacher_forced(handle, prompt, answer, rows, rows=2)
    lp = read.logprobs
    frame = pd.DataFrame({
        "position": range(lp.shape[1]),
        "token": _decode_ids(handle, read.token_ids),
        "logprob_unsteered": lp[0].tolist(),
        "logprob_steered": lp[1].tolist(),
    })
    frame["delta"] = frame.logprob_steered - frame.logprob_unsteered
    frame.attrs["nats_shifted"] = float(frame.delta.sum())
    return frame
