"""The Concepts tab's numbers: lm_head, sampling, the logit explosion and the KV cache, on the loaded model.

Four lessons behind steering, each computed from the model rather than
written down:

* **lm_head** (:func:`lm_head_facts`, :func:`row_norms`): the unembedding's
  shape, its share of the parameters, whether it is tied to the input
  embedding, and how long its rows are.
* **Sampling** (:func:`sampling_filters`, :func:`sample_many`): the real
  next-token logits of a prompt pushed through the app's own sampler
  (``sampler.process_logits`` / ``sampler.choose``), one filter at a
  time, so the tab shows exactly what ``generate`` does.
* **The logit explosion and its fix** (:func:`explode`, then
  :func:`fix_explosion`): a vector along one token's unembedding row
  makes that token's logit jump by hundreds; the lm_head-constrained
  optimisation from :mod:`steer_ui.methods.constraints` rotates it until no
  logit moves more than a bound.
* **KV cache** (:func:`kv_layout`, :func:`kv_cache_bytes`,
  :func:`kv_cache_table`, :func:`cache_nbytes`, :func:`time_cache`): what the
  cache costs for this config, grouped-query vs full multi-head, and what it
  saves in time.

Everything returns pandas frames, dicts or small dataclasses; nothing here
imports gradio.
"""
from __future__ import annotations

import re
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Sequence

import pandas as pd
import torch

from .methods.base import Progress, noop
from .model.budget import KVLayout, kv_layout  # noqa: F401 - the KV lesson's layout, read where costs are
from .model.generation import GenerationError, Sampling, encode_prompt, side_by_side
from .model.sampler import choose, process_logits
from .model.hooks import Steer
from .model.units import to_raw_alpha
from .messages import KeyedError, Said

DEFAULT_PROMPT = "The capital of France is"
# The cache timing needs a context worth caching: with a handful of tokens the lm_head matmul dominates
# both runs and the cache saves nothing visible.
LONG_PROMPT = (
    "The history of the city begins with a small settlement on an island in the river, where fishermen and "
    "traders built wooden houses and a market. Over the centuries the settlement grew into a walled town, then "
    "into the seat of kings, with a cathedral, a university, bridges, hospitals and wide avenues lined with "
    "trees. Each generation added something: a new quarter for craftsmen, a palace for the court, a railway "
    "station for travellers arriving from the provinces, museums for the collections of the state, parks for "
    "the people who worked in the factories on the edge of town. Today visitors walk along the river and read "
    "the story of the city in its streets, from the oldest stones near the water to the glass towers of the "
    "business district. The most famous monument in the city is"
)
# The explosion demo's defaults (see docs/concepts.md for the numbers they give on Gemma 3 270M): the whole lesson
# (explode, then fix) within ~30 s on a 2-core CPU, the explosion plain in the generation (issue #52).
DEFAULT_EXPLOSION_ALPHA = 0.07  # relative units: 7% of the layer's mean residual norm
DEFAULT_FIX_BOUND = 3.0  # on Gemma at the last block the max-hinge reaches 3 in ~40 steps, 2 only in ~150
DEFAULT_FIX_STEPS = 40
DEMO_TOKENS = 8  # greedy tokens generated per side: enough to see t repeat
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8": 1, "int8": 1}


class ConceptsError(KeyedError):
    """A Concepts-panel request that cannot run (bad size, unknown token, bad dtype); the ones a person typing on
    the page can meet name their message by key, said in the page's language."""


def _decode(handle, ids) -> list[str]:
    return [handle.tokenizer.decode([int(i)]) for i in ids]


# ======================================================================= lm_head
def model_parameters(handle) -> int:
    """Unique parameters of the model (a tied lm_head counts once, as in the checkpoint; int8 codes count)."""
    return handle.parameter_count()


def lm_head_facts(handle) -> dict:
    """Shape, parameter count, share of the model, tied or not, and memory of the unembedding W_U."""
    int8 = handle.arch.int8_unembedding  # int8 weights: the facts from the codes, no dequantised copy
    w = int8.codes if int8 is not None else handle.arch.unembedding
    bias = getattr(handle.arch.lm_head, "bias", None)
    params = int(w.numel()) + (int(bias.numel()) if bias is not None else 0)
    total = model_parameters(handle)
    return {
        "vocab_size": int(w.shape[0]),
        "hidden_size": int(w.shape[1]),
        "shape": [int(w.shape[0]), int(w.shape[1])],
        "parameters": params,
        "model_parameters": total,
        "share": params / total if total else float("nan"),
        "tied": bool(handle.arch.tied_lm_head),
        "has_bias": bias is not None,
        "dtype": "int8 (float32 scales)" if int8 is not None else str(w.dtype).replace("torch.", ""),
        "bytes": int(int8.nbytes() if int8 is not None else w.numel() * w.element_size()),
        "logit_softcap": handle.arch.logit_softcap,
    }


@dataclass
class RowNorms:
    histogram: pd.DataFrame  # bin_start, bin_end, count
    extremes: pd.DataFrame  # which ('largest' | 'smallest'), rank, token, token_id, norm
    stats: dict  # mean, std, min, median, max, rows



def row_norms(handle, bins: int = 60, extremes: int = 10) -> RowNorms:
    """‖W_U[t]‖ for every token t: a histogram and the ``extremes`` longest and shortest rows.

    A token's logit is ``h · W_U[t]``, so a long row is a token that any
    hidden state pointing its way promotes strongly.
    """
    if int(bins) < 1:
        raise ConceptsError(f"the histogram needs at least 1 bin, got {bins}")
    w = handle.arch.unembedding
    with torch.inference_mode():
        norms = w.float().norm(dim=1).cpu()
    counts = torch.histc(norms, bins=int(bins), min=float(norms.min()), max=float(norms.max()))
    edges = torch.linspace(float(norms.min()), float(norms.max()), int(bins) + 1)
    histogram = pd.DataFrame({"bin_start": edges[:-1].tolist(), "bin_end": edges[1:].tolist(),
                              "count": counts.round().long().tolist()})
    k = min(int(extremes), norms.numel())
    top, low = torch.topk(norms, k), torch.topk(-norms, k)
    frame = pd.DataFrame({
        "which": ["largest"] * k + ["smallest"] * k,
        "rank": list(range(1, k + 1)) * 2,
        "token": _decode(handle, top.indices) + _decode(handle, low.indices),
        "token_id": top.indices.tolist() + low.indices.tolist(),
        "norm": top.values.tolist() + (-low.values).tolist(),
    })
    stats = {"rows": int(norms.numel()), "mean": float(norms.mean()), "std": float(norms.std()),
             "min": float(norms.min()), "median": float(norms.median()), "max": float(norms.max())}
    return RowNorms(histogram=histogram, extremes=frame, stats=stats)


# ====================================================================== sampling
_LOGITS_LRU = 8


def prompt_logits(handle, prompt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(next-token logits (vocab,), prompt ids (1, seq)) of the unsteered model; memoised per prompt."""
    lru = handle.__dict__.setdefault("_concepts_logits", OrderedDict())
    with handle.lock:
        if prompt in lru:
            lru.move_to_end(prompt)
            return lru[prompt]
        ids = encode_prompt(handle, prompt)
        with torch.inference_mode():
            out = handle.model.base_model(input_ids=ids.to(handle.input_device), use_cache=False)
            logits = handle.arch.logits(out.last_hidden_state[:, -1, :]).float().cpu()[0]
        lru[prompt] = (logits, ids.cpu())
        while len(lru) > _LOGITS_LRU:
            lru.popitem(last=False)
        return lru[prompt]


def _sampling(temperature: float, top_k: int, top_p: float, repetition_penalty: float, seed: int = 0) -> Sampling:
    try:
        s = Sampling(temperature=float(temperature), top_k=int(top_k), top_p=float(top_p),
                     repetition_penalty=float(repetition_penalty), seed=int(seed))
    except (TypeError, ValueError) as exc:
        raise GenerationError(f"sampling settings must be numbers ({exc})") from None
    s.validate()
    return s


def _probs(processed: torch.Tensor) -> torch.Tensor:
    return processed.softmax(-1)


@dataclass
class SamplingView:
    """The stages of the sampler for one prompt.

    ``frame``: one row per shown token (the ``show`` most likely after
    temperature, plus the greedy choice): ``logit``, ``prob`` (softmax of the
    raw logits), ``prob_penalised`` (after the repetition penalty),
    ``prob_tempered`` (after temperature), ``kept_top_k``, ``kept_top_p``
    (survives top-k *and* top-p, as the sampler applies them in that order)
    and ``final_prob`` (what sampling draws from).
    ``processed``: the final (1, vocab) logits, -inf where filtered.
    """

    frame: pd.DataFrame
    summary: dict
    processed: torch.Tensor
    sampling: Sampling



def sampling_filters(handle, prompt: str, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                     repetition_penalty: float = 1.0, show: int = 20) -> SamplingView:
    """Logits → probabilities → the sampler's filters, stage by stage, with the app's own sampler code.

    Temperature 0 is greedy (as in ``generate``): only the repetition penalty
    applies and the whole mass sits on the argmax.  The repetition penalty
    counts the prompt's tokens as already seen, as generation does.
    """
    s = _sampling(temperature, top_k, top_p, repetition_penalty)
    logits, ids = prompt_logits(handle, prompt)
    row, history = logits.unsqueeze(0), ids
    penalised = process_logits(row, history, Sampling(temperature=0.0, repetition_penalty=s.repetition_penalty))
    greedy_id = int(choose(penalised, Sampling(temperature=0.0), None)[0])
    if s.temperature == 0:
        tempered = penalised
        after_k = penalised
        final = torch.full_like(penalised, float("-inf"))
        final[0, greedy_id] = 0.0
    else:
        tempered = process_logits(row, history, Sampling(temperature=s.temperature,
                                                         repetition_penalty=s.repetition_penalty))
        after_k = process_logits(row, history, Sampling(temperature=s.temperature, top_k=s.top_k,
                                                        repetition_penalty=s.repetition_penalty))
        final = process_logits(row, history, s)
    p_raw, p_pen, p_temp, p_final = (_probs(x)[0] for x in (row, penalised, tempered, final))
    kept_k, kept_p = torch.isfinite(after_k[0]), torch.isfinite(final[0])
    n = min(int(show), logits.numel())
    order = torch.topk(p_temp, n).indices.tolist()
    if greedy_id not in order:
        order.append(greedy_id)
    idx = torch.tensor(order)
    frame = pd.DataFrame({
        "rank": range(1, len(order) + 1),
        "token": _decode(handle, idx),
        "token_id": order,
        "logit": logits[idx].tolist(),
        "prob": p_raw[idx].tolist(),
        "logit_penalised": penalised[0, idx].tolist(),
        "prob_penalised": p_pen[idx].tolist(),
        "prob_tempered": p_temp[idx].tolist(),
        "kept_top_k": kept_k[idx].tolist(),
        "kept_top_p": kept_p[idx].tolist(),
        "final_prob": p_final[idx].tolist(),
    })
    entropy = lambda p: float(-(p[p > 0] * p[p > 0].log()).sum())  # noqa: E731
    summary = {
        "prompt_tokens": int(ids.shape[1]),
        "vocab_size": int(logits.numel()),
        "greedy": s.temperature == 0,
        "greedy_token": handle.tokenizer.decode([greedy_id]),
        "greedy_token_id": greedy_id,
        "greedy_prob": float(p_pen[greedy_id]),
        "survivors_top_k": int(kept_k.sum()),
        "survivors": int(kept_p.sum()),
        "entropy_raw": entropy(p_raw),
        "entropy_final": entropy(p_final),
        "shown_final_mass": float(p_final[idx].sum()),
        "temperature": s.temperature, "top_k": s.top_k, "top_p": s.top_p,
        "repetition_penalty": s.repetition_penalty,
    }
    return SamplingView(frame=frame, summary=summary, processed=final, sampling=s)


def sample_many(handle, prompt: str, n: int = 100, seed: int = 0, temperature: float = 1.0, top_k: int = 0,
                top_p: float = 1.0, repetition_penalty: float = 1.0, show: int = 20) -> pd.DataFrame:
    """Draw the next token ``n`` times with the app's sampler; empirical frequency next to the probability.

    Draws come from the same distribution as ``generate``'s sampler
    (softmax of the processed logits) by inverse CDF, one uniform per draw
    from a generator seeded with ``seed``, so a seed gives the same counts
    every time and 100,000 draws stay cheap (``generate`` itself uses
    Gumbel-max, which needs a noise value per token).  Rows: every token drawn at least once plus the
    ``show`` most likely ones.  ``frame.attrs`` has ``n``, ``seed`` and the
    total variation distance between frequencies and probabilities over all
    tokens.
    """
    if not isinstance(n, int) and not (isinstance(n, float) and n.is_integer()):
        raise ConceptsError(f"the number of draws must be a whole number, got {n!r}")
    n = int(n)
    if not 1 <= n <= 100_000:
        raise ConceptsError(f"the number of draws must be in 1..100000, got {n}")
    view = sampling_filters(handle, prompt, temperature, top_k, top_p, repetition_penalty, show=show)
    s, processed = view.sampling, view.processed
    rng = torch.Generator().manual_seed(int(seed))
    counts = torch.zeros(processed.shape[-1], dtype=torch.long)
    probs = processed.softmax(-1)[0]
    if s.temperature == 0:
        counts[int(choose(processed, s, None)[0])] += n
    else:
        cdf = probs.double().cumsum(-1)
        uniforms = torch.rand(n, generator=rng, dtype=torch.float64) * cdf[-1]
        drawn_ids = torch.searchsorted(cdf, uniforms).clamp_max(probs.numel() - 1)
        counts += torch.bincount(drawn_ids, minlength=probs.numel())
    drawn = torch.nonzero(counts).flatten().tolist()
    likely = torch.topk(probs, min(int(show), probs.numel())).indices.tolist()
    ids = list(dict.fromkeys(likely + drawn))
    idx = torch.tensor(ids)
    frame = pd.DataFrame({
        "token": _decode(handle, idx),
        "token_id": ids,
        "probability": probs[idx].tolist(),
        "count": counts[idx].tolist(),
    })
    frame["frequency"] = frame["count"] / n
    frame = frame.sort_values(["probability", "count"], ascending=False, kind="stable").reset_index(drop=True)
    frame.attrs.update(n=n, seed=int(seed),
                       total_variation=float(0.5 * (counts.float() / n - probs).abs().sum()),
                       distinct=len(drawn))
    return frame


# ======================================================= the logit explosion
_WORDLIKE = re.compile(r"^ ?[A-Za-z]{5,}$")
RARE_GAP = 20.0


def rare_token(handle, prompt: str) -> int:
    """The word-like token (a space and 5+ ASCII letters) the model least expects after ``prompt``,
    among those at most ``RARE_GAP`` logits below the most likely token.

    Falls back to the least likely non-special token when the vocabulary has
    no word-like tokens (byte-level tiny models).
    """
    logits, _ids = prompt_logits(handle, prompt)
    words = handle.__dict__.get("_concepts_wordlike")
    if words is None:
        tok = handle.tokenizer
        special = set(getattr(tok, "all_special_ids", []) or [])
        pieces = tok.convert_ids_to_tokens(list(range(logits.numel())))
        # raw pieces mark a leading space as '▁' (SentencePiece) or 'Ġ' (byte-level BPE)
        words = [i for i, p in enumerate(pieces) if i not in special and isinstance(p, str)
                 and _WORDLIKE.match(p.replace("\u2581", " ").replace("\u0120", " "))]
        words = torch.tensor(words or [i for i in range(logits.numel()) if i not in special], dtype=torch.long)
        handle.__dict__["_concepts_wordlike"] = words
    # "Least expected" among tokens within RARE_GAP logits of the top one: a token 40 logits down (p ~ 1e-19)
    # stays improbable even after a jump of 50, and the demo would show no collapse.
    near = words[logits[words] >= logits.max() - RARE_GAP]
    pool = near if near.numel() else words
    return int(pool[logits[pool].argmin()])


def token_id_of(handle, text: str) -> int:
    """The single token ``text`` is (a clear error when it splits into several)."""
    if not isinstance(text, str) or not text:
        raise ConceptsError.from_key("concepts_token_empty")
    ids = handle.tokenizer(text, add_special_tokens=False).input_ids
    if len(ids) != 1:
        pieces = [handle.tokenizer.decode([i]) for i in ids]
        raise ConceptsError.from_key("concepts_token_pieces", text=repr(text), count=len(ids), pieces=pieces)
    return int(ids[0])


@dataclass
class SteeredRun:
    """One vector's effect on the prompt: Δlogits, next-token distribution and a greedy generation."""

    naive_direct: float  # α·v·W_U[t], no final norm
    direct: float  # Δlogit of t from adding α·v to the final residual (through the final norm)
    delta_logit: float  # actual Δlogit of t (full model)
    max_abs_delta_logit: float  # actual, over the vocabulary
    # actual, of Δlogit minus its vocabulary mean: what the constraint's bound is on (a shift shared by every
    # logit moves no probability, so the raw maximum can be large while nothing changes)
    max_abs_centred_delta_logit: float
    max_delta_token: str
    prob_unsteered: float  # p(t)
    prob_steered: float
    kl: float
    top: pd.DataFrame  # steered top-k (rank, token, token_id, prob, logit)
    unsteered_top: pd.DataFrame
    unsteered_text: str
    steered_text: str
    steered_tokens: list[str]
    repeats: int  # how many generated tokens are t

    def as_dict(self) -> dict:
        return {k: (v.to_dict("records") if isinstance(v, pd.DataFrame) else v) for k, v in vars(self).items()}


@dataclass
class ExplosionDemo:
    prompt: str
    token: str
    token_id: int
    layer: int
    alpha: float  # relative units (fraction of the layer's mean residual norm)
    alpha_raw: float
    vector: torch.Tensor  # unit vector along W_U[t]
    exploded: SteeredRun
    fixed: SteeredRun | None = None
    fixed_vector: torch.Tensor | None = None
    report: dict = field(default_factory=dict)  # constrain_vector's report (curve, before/after)

    def as_dict(self) -> dict:
        out = {"prompt": self.prompt, "token": self.token, "token_id": self.token_id, "layer": self.layer,
               "alpha": self.alpha, "alpha_raw": self.alpha_raw, "exploded": self.exploded.as_dict()}
        if self.fixed is not None:
            rep = self.report
            out["fixed"] = self.fixed.as_dict()
            out["constraint"] = {
                "max_change": rep.get("max_change"),
                "cosine_to_original": rep.get("cosine_to_original"),
                "before_max_abs_delta_logit": rep.get("before", {}).get("max_abs_delta_logit"),
                "after_max_abs_delta_logit": rep.get("after", {}).get("max_abs_delta_logit"),
                "before_max_abs_centred_delta_logit": rep.get("before", {}).get("max_abs_centred_delta_logit"),
                "after_max_abs_centred_delta_logit": rep.get("after", {}).get("max_abs_centred_delta_logit"),
                "prompts": rep.get("settings", {}).get("prompts"),
                "steps": rep.get("settings", {}).get("steps"),
            }
        return out

    def curve(self) -> pd.DataFrame:
        return pd.DataFrame(self.report.get("curve", []))


def default_layer(handle) -> int:
    """The last block: its output goes straight to the final norm and lm_head (the skip-connection path in
    its purest form), and the constrained optimisation then re-runs no block per step."""
    return handle.arch.num_layers - 1


def _run_vector(handle, prompt: str, token_id: int, layer: int, vector: torch.Tensor, alpha_raw: float,
                max_new_tokens: int) -> SteeredRun:
    from .methods.constraints import centred, direct_delta_logits
    from .model.analysis import compare_logits, prefix_state

    w = handle.arch.unembedding
    added = alpha_raw * vector.float()
    with torch.inference_mode():
        naive = float(torch.matmul(w[token_id].float(), added.to(w.device)))
    st = prefix_state(handle, prompt, layer)
    with torch.no_grad():
        direct = float(direct_delta_logits(handle, added, st.final_last)[0, token_id])
    steer = Steer(layer=layer, vector=vector, alpha=alpha_raw)
    steered_logits = st.logits([steer], rows=1)[0]
    base = st.unsteered_logits[0]
    view = compare_logits(handle, base, steered_logits, top_k=10)
    gen = side_by_side(handle, prompt, [steer], Sampling(max_new_tokens=int(max_new_tokens), temperature=0.0))
    ids = [t.token_id for t in gen.steered.tokens]
    return SteeredRun(
        naive_direct=naive, direct=direct,
        delta_logit=float(steered_logits[token_id] - base[token_id]),
        max_abs_delta_logit=view.max_abs_delta_logit, max_delta_token=view.max_delta_token,
        max_abs_centred_delta_logit=float(centred(steered_logits - base).abs().max()),
        prob_unsteered=float(base.softmax(-1)[token_id]), prob_steered=float(steered_logits.softmax(-1)[token_id]),
        kl=view.kl, top=view.steered, unsteered_top=view.unsteered,
        unsteered_text=gen.unsteered.text, steered_text=gen.steered.text,
        steered_tokens=[t.token for t in gen.steered.tokens], repeats=sum(1 for i in ids if i == token_id),
    )


def explode(handle, prompt: str = DEFAULT_PROMPT, layer: int | None = None, alpha: float = DEFAULT_EXPLOSION_ALPHA,
            token: str | int | None = None, max_new_tokens: int = DEMO_TOKENS) -> ExplosionDemo:
    """Steer along one rare token's unembedding row and measure the blow-up.

    The vector is ``v = W_U[t] / ‖W_U[t]‖`` (on tied models W_U is the input
    embedding) added at the output of block ``layer`` with raw strength
    ``alpha · n_L`` (``alpha`` in relative units, ``n_L`` the layer's mean
    residual norm).  ``token``: a single-token string, a token id, or None to
    let :func:`rare_token` pick the word the model least expects here.
    """
    encode_prompt(handle, prompt)  # an empty prompt is refused before any work
    layer = default_layer(handle) if layer is None else int(layer)
    if not 0 <= layer < handle.arch.num_layers:
        raise ConceptsError(f"layer {layer} does not exist: the model has layers 0..{handle.arch.num_layers - 1}")
    try:
        alpha = float(alpha)
    except (TypeError, ValueError):
        raise ConceptsError(f"alpha must be a number, got {alpha!r}") from None
    if not alpha > 0 or alpha != alpha or alpha == float("inf"):
        raise ConceptsError(f"alpha must be a finite number > 0, got {alpha!r}")
    if token is None or (isinstance(token, str) and not token.strip("\n")):
        token_id = rare_token(handle, prompt)
    elif isinstance(token, int):
        if not 0 <= token < handle.arch.vocab_size:
            raise ConceptsError(f"token id {token} is outside the vocabulary 0..{handle.arch.vocab_size - 1}")
        token_id = token
    else:
        token_id = token_id_of(handle, token)
    row = handle.arch.unembedding[token_id].detach().float().cpu()
    vector = row / row.norm().clamp_min(1e-12)
    alpha_raw = to_raw_alpha(handle, alpha, layer, relative=True)
    run = _run_vector(handle, prompt, token_id, layer, vector, alpha_raw, max_new_tokens)
    return ExplosionDemo(prompt=prompt, token=handle.tokenizer.decode([token_id]), token_id=token_id, layer=layer,
                         alpha=alpha, alpha_raw=alpha_raw, vector=vector, exploded=run)


def fix_explosion(handle, demo: ExplosionDemo, max_change: float = DEFAULT_FIX_BOUND, steps: int = DEFAULT_FIX_STEPS,
                  prompts: Sequence[str] | None = None, max_new_tokens: int = DEMO_TOKENS,
                  progress: Progress | None = None, reduction: str = "max", lr: float = 0.01) -> ExplosionDemo:
    """Rotate the demo's vector (same layer, same strength) until no logit moves more than ``max_change``.

    Uses ``constraints.constrain_vector`` (hinge on the real and direct-path
    |Δlogit| plus a KL term) on ``prompts`` (default: the demo's own prompt; each
    more prompt costs a pass through the 262k-row lm_head per step), then
    re-measures everything the explosion showed.  Fills ``demo.fixed``.
    ``reduction="max"`` penalises the worst token only: the bound is on the
    worst token, and on Gemma 3 270M the summed hinge over 262k tokens
    stalled near |Δlogit| ≈ 10 where the max reached the bound (docs/concepts.md).
    """
    from .methods.constraints import constrain_vector

    if not max_change > 0:
        raise ConceptsError(f"the bound on |Δlogit| must be > 0, got {max_change!r}")
    prompts = list(prompts) if prompts else [demo.prompt]
    new_vector, report = constrain_vector(handle, demo.vector, demo.layer, alpha=demo.alpha_raw, prompts=prompts,
                                          max_change=float(max_change), steps=int(steps), reduction=reduction, lr=lr,
                                          progress=progress or noop)
    demo.fixed_vector = new_vector.float()
    demo.report = report
    demo.fixed = _run_vector(handle, demo.prompt, demo.token_id, demo.layer, demo.fixed_vector, demo.alpha_raw,
                             max_new_tokens)
    return demo


# ====================================================================== KV cache
def dtype_bytes(dtype) -> int:
    if isinstance(dtype, torch.dtype):
        return torch.empty((), dtype=dtype).element_size()
    name = str(dtype).replace("torch.", "")
    aliases = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "fp8": "float8", "half": "float16",
               "float": "float32"}
    name = aliases.get(name, name)
    if name not in DTYPE_BYTES:
        raise ConceptsError(f"unknown dtype '{dtype}' (use one of: {', '.join(DTYPE_BYTES)})")
    return DTYPE_BYTES[name]


def _check_sizes(seq_len, batch) -> tuple[int, int]:
    for name, value in (("sequence length", seq_len), ("batch", batch)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value < 1:
            raise ConceptsError(f"the {name} must be a whole number >= 1, got {value!r}")
    return int(seq_len), int(batch)


def kv_cache_bytes(config, seq_len: int, batch: int = 1, dtype="float32", kv_heads: int | None = None,
                   sliding: bool = False) -> int:
    """2 (K and V) × layers × batch × kv_heads × seq_len × head_dim × bytes per value.

    ``kv_heads``: override (``attention_heads`` gives full multi-head
    attention for comparison).  ``sliding``: count only the last
    ``sliding_window − 1`` positions on sliding-window layers, which is what
    transformers' dynamic cache keeps for them.
    """
    seq_len, batch = _check_sizes(seq_len, batch)
    lay = config if isinstance(config, KVLayout) else kv_layout(config)
    heads = lay.kv_heads if kv_heads is None else int(kv_heads)
    per_position = 2 * batch * heads * lay.head_dim * dtype_bytes(dtype)
    if not sliding or lay.sliding_window is None:
        return per_position * lay.layers * seq_len
    kept = sum(min(seq_len, lay.sliding_window - 1) if t == "sliding_attention" else seq_len
               for t in lay.layer_types)
    return per_position * kept


def kv_cache_table(config, seq_lens: Sequence[int] | None = None, batch: int = 1, dtype="float32") -> pd.DataFrame:
    """Cache bytes vs sequence length: this config (GQA/MQA), full multi-head, and with sliding windows."""
    lay = kv_layout(config) if not isinstance(config, KVLayout) else config
    if seq_lens is None:
        seq_lens = [2 ** i for i in range(4, 18)]  # 16 .. 131072
    rows = []
    for n in seq_lens:
        row = {"seq_len": int(n),
               "bytes": kv_cache_bytes(lay, n, batch, dtype),
               "bytes_mha": kv_cache_bytes(lay, n, batch, dtype, kv_heads=lay.attention_heads)}
        if lay.sliding_window is not None:
            row["bytes_sliding"] = kv_cache_bytes(lay, n, batch, dtype, sliding=True)
        rows.append(row)
    frame = pd.DataFrame(rows)
    frame.attrs.update(lay.as_dict(), batch=int(batch), dtype=str(dtype))
    return frame


def cache_nbytes(cache) -> int:
    """Bytes actually held by a transformers cache object (sum of its key and value tensors)."""
    total = 0
    layers = getattr(cache, "layers", None)
    if layers is not None:
        for layer in layers:
            for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
                if isinstance(t, torch.Tensor):
                    total += t.nbytes
        return total
    for pair in cache:  # legacy tuple of (k, v) per layer
        total += sum(t.nbytes for t in pair if isinstance(t, torch.Tensor))
    return total


def measured_cache(handle, prompt: str, batch: int = 1) -> dict:
    """Prefill ``prompt`` (× ``batch`` rows) with the cache on; formula vs the cache tensors' bytes."""
    ids = encode_prompt(handle, prompt).to(handle.input_device).expand(int(batch), -1)
    with handle.lock, torch.inference_mode():
        out = handle.model.base_model(input_ids=ids, use_cache=True)
    actual = cache_nbytes(out.past_key_values)
    lay = kv_layout(handle.model.config)
    n = int(ids.shape[1])
    return {"seq_len": n, "batch": int(batch), "dtype": str(handle.dtype).replace("torch.", ""),
            "measured_bytes": int(actual),
            "formula_bytes": kv_cache_bytes(lay, n, batch, handle.dtype),
            "formula_sliding_bytes": kv_cache_bytes(lay, n, batch, handle.dtype, sliding=True)}


def time_cache(handle, n_tokens: int = 32, prompt: str = LONG_PROMPT,
               progress: Progress | None = None) -> tuple[dict, pd.DataFrame]:
    """Greedy-generate ``n_tokens`` twice: with the KV cache, and re-running the whole sequence each step.

    Returns (summary, per-step frame ``step, with_cache_s, without_cache_s``).
    Both runs must pick the same tokens (``same_tokens``): the cache is an
    optimisation, not an approximation.  ``progress`` is told after every step (and may stop the run).
    """
    progress = progress or noop
    if isinstance(n_tokens, bool) or not isinstance(n_tokens, (int, float)) or n_tokens != int(n_tokens) \
            or not 1 <= n_tokens <= 1024:
        raise ConceptsError(f"the number of tokens to time must be a whole number in 1..1024, got {n_tokens!r}")
    n_tokens = int(n_tokens)
    ids = encode_prompt(handle, prompt).to(handle.input_device)
    cfg = handle.model.config.get_text_config() if hasattr(handle.model.config, "get_text_config") \
        else handle.model.config
    max_positions = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)
    if max_positions and ids.shape[1] + n_tokens > max_positions:  # small models: keep the prompt's end
        ids = ids[:, -max(1, int(max_positions) - n_tokens):]
    model, arch = handle.model.base_model, handle.arch

    def last_logits(hidden):
        return arch.logits(hidden[:, -1, :])

    with handle.lock, torch.inference_mode():
        model(input_ids=ids, use_cache=False)  # warm-up: first-call allocations are not the cache's fault

        with_steps, with_ids = [], []
        cache, step_input = None, ids
        for _ in range(n_tokens):
            t0 = time.perf_counter()
            out = model(input_ids=step_input, past_key_values=cache, use_cache=True)
            nxt = last_logits(out.last_hidden_state).argmax(-1)
            with_steps.append(time.perf_counter() - t0)
            cache = out.past_key_values
            with_ids.append(int(nxt[0]))
            step_input = nxt.reshape(1, 1)
            progress(len(with_steps) / (2 * n_tokens), Said("progress_with_cache"))

        without_steps, without_ids = [], []
        seq = ids
        for _ in range(n_tokens):
            t0 = time.perf_counter()
            out = model(input_ids=seq, use_cache=False)
            nxt = last_logits(out.last_hidden_state).argmax(-1)
            without_steps.append(time.perf_counter() - t0)
            without_ids.append(int(nxt[0]))
            seq = torch.cat([seq, nxt.reshape(1, 1)], dim=1)
            progress(0.5 + len(without_steps) / (2 * n_tokens), Said("progress_without_cache"))
    steps = pd.DataFrame({"step": range(n_tokens), "with_cache_s": with_steps, "without_cache_s": without_steps})
    with_s, without_s = sum(with_steps), sum(without_steps)
    summary = {
        "n_tokens": n_tokens, "prompt_tokens": int(ids.shape[1]),
        "seconds_with_cache": with_s, "seconds_without_cache": without_s,
        "speedup": without_s / with_s if with_s > 0 else float("nan"),
        "same_tokens": with_ids == without_ids,
        "text": handle.tokenizer.decode(with_ids, skip_special_tokens=True),
        "cache_bytes": cache_nbytes(cache) if cache is not None else 0,
    }
    return summary, steps
