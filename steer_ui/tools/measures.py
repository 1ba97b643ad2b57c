"""The benchmark's measurements: each ``bench_*`` function times one path against its baseline.

Every function returns a JSON-ready dict of absolute milliseconds and the
ratio :func:`steer_ui.tools.bench.run_bench` reports; the two sides of each
ratio are timed in the same run, interleaved, so a burst of load hits both.
Steering goes through :func:`steer_ui.model.hooks.steering` everywhere, the
baseline ``model.generate()`` included, so both sides pay the same hook.
"""
from __future__ import annotations

import copy
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import torch
from transformers import GenerationConfig

from .. import methods
from ..data import load_dataset
from ..data.activations import extract
from ..model.analysis import AlphaGrid, compare_logits, naive_logits, next_token, prefix_state, sweep
from ..model.prefix import for_prompt
from ..model.generation import DecodeBatch, Sampling, encode_prompt, every_row_decoded, stream_side_by_side
from ..model.hooks import Steer, steering
from ..model.loading import from_model
# PROBE_PROMPTS, final_hidden and next_token_probs: the bench and tools read them here
from ..model.precision import PROBE_PROMPTS, final_hidden, next_token_probs, path_in_use  # noqa: F401
from ..model.units import relative_scale, to_raw_alpha
from ..vector import random_vector
from .greedy_reference import greedy_vs_reference
from .timing import cache_dir, median, ms, parameter_bytes, percentile, ratio, sync, timings

ROOT = Path(__file__).resolve().parents[2]
DATASETS = ROOT / "assets" / "datasets"

GENERATION_PROMPT = "Once upon a time, in a small village by the sea, there lived an old fisherman who"
SLIDER_TEXT = ("The old lighthouse keeper climbed the spiral stairs every evening at dusk, carrying a lamp and a "
               "thermos of tea, and from the top he watched the ships return to the harbour while the gulls "
               "circled above the grey water and the wind rose over the cliffs")


def measure_bandwidth(handle, reps: int = 5) -> dict:
    """Memory read bandwidth, measured by summing the model's own largest weight matrix.

    The unembedding is what the decode streams every step, so the rate at
    which the machine reads *it* is the honest denominator for the floor.  A
    copy of the same bytes (read + write) is reported alongside.
    """
    device = handle.input_device
    w = stored_unembedding(handle)
    nbytes = w.numel() * w.element_size()
    with torch.inference_mode():
        float(w.sum())  # touch every page once
        sums = timings(w.sum, reps, device)
        out = torch.empty_like(w)
        copies = timings(lambda: out.copy_(w), max(2, reps // 2), device)
        del out
    read = nbytes / min(sums)
    return {
        "bytes": nbytes,
        "read_gb_s": read / 1e9,
        "read_gb_s_median": nbytes / median(sums) / 1e9,
        "copy_gb_s": 2 * nbytes / min(copies) / 1e9,
        "method": "best of repeated sums of the unembedding matrix (copy = read + write of the same bytes)",
    }


def stored_unembedding(handle) -> torch.Tensor:
    """The unembedding's bytes as the model holds them, as a tensor whose sum reads them all: the float matrix,
    or with int8 weights its codes viewed as int64 (the value means nothing; torch sums int64 at the memory's
    speed here, int32 at a twentieth of it, and floats would meet denormals)."""
    int8 = handle.arch.int8_unembedding
    if int8 is None:
        return handle.arch.unembedding.detach()
    codes = int8.codes.reshape(-1)
    return codes[: codes.numel() // 8 * 8].view(torch.int64)


def seeded_steer(handle, layer: int, seed: int = 0, relative_alpha: float = 0.5) -> tuple[Steer, float]:
    """(steer, n_L): a seeded unit random direction at ``layer`` with relative α ``relative_alpha``."""
    vec = random_vector(handle.arch.hidden_size, layer, seed=seed).directions[layer]
    alpha = to_raw_alpha(handle, relative_alpha, layer, relative=True)
    return Steer(layer=layer, vector=vec, alpha=alpha), relative_scale(handle, layer)


def _prompt_of_tokens(handle, text: str, n_tokens: int) -> tuple[str, int]:
    """The longest word prefix of ``text`` that encodes to at most ``n_tokens`` tokens."""
    words = text.split()
    best = words[0]
    for i in range(1, len(words) + 1):
        candidate = " ".join(words[:i])
        if encode_prompt(handle, candidate).shape[1] > n_tokens:
            break
        best = candidate
    return best, int(encode_prompt(handle, best).shape[1])


# ------------------------------------------------------------------ decode
def _hf_generate(handle, ids: torch.Tensor, n: int, steer=None) -> tuple[float, list[int]]:
    """One ``model.generate()`` call (greedy, exactly ``n`` new tokens), steered by ``steer`` if given.

    The steer is installed by :func:`~steer_ui.model.hooks.steering`, the
    app's own hook, so the baseline and our decode pay the same per-step hook
    and the ratio measures the batching, not a different hook.
    """
    device = handle.input_device
    config = GenerationConfig(max_new_tokens=n, min_new_tokens=n, do_sample=False, num_beams=1,
                              pad_token_id=handle.tokenizer.pad_token_id,
                              eos_token_id=handle.tokenizer.eos_token_id, use_cache=True)
    with steering(handle, [steer] if steer is not None else []), torch.inference_mode():
        ids = ids.to(device)
        sync(device)
        start = time.perf_counter()
        out = handle.model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)
        sync(device)
        seconds = time.perf_counter() - start
    return seconds, out[0, ids.shape[1]:].tolist()


def _ours(handle, prompt: str, steers, n: int, batch: DecodeBatch | None = None,
          steered_only: bool = False) -> tuple[float, list[float], object]:
    """(total seconds, per-step seconds for steps 1.., result) of one side-by-side decode.

    ``batch``: an empty :class:`DecodeBatch` to decode in, kept across runs as
    the engine keeps its own (a static one then captures its step once, not
    per run); default a new one.  ``steered_only``: decode the steered row
    alone, as the API does for a client that asks for no comparison and no
    log-probabilities (:func:`~steer_ui.model.generation.row_kinds`).
    """
    sampling = Sampling(max_new_tokens=n, temperature=0.0, stop_at_eos=False, unsteered=not steered_only,
                        counterfactual=not steered_only)
    device = handle.input_device
    stamps = []
    result = None
    sync(device)
    start = time.perf_counter()
    for event in stream_side_by_side(handle, prompt, steers, sampling, batch=batch):
        sync(device)
        stamps.append(time.perf_counter())
        result = event.result
    if batch is not None:
        batch.advance()  # drops the finished request (the stream returns before that step), so the batch is empty
    steps = [b - a for a, b in zip(stamps, stamps[1:])]
    return stamps[-1] - start, steps, result


def _read_seconds(handle) -> float:
    """One timed read (sum) of the unembedding: a bandwidth sample taken between decode runs."""
    device = handle.input_device
    w = stored_unembedding(handle)
    with torch.inference_mode():
        sync(device)
        start = time.perf_counter()
        w.sum()
        sync(device)
    return time.perf_counter() - start


def bench_side_by_side(handle, steer, n_tokens: int, reps: int, weight_bytes: int, best_read_gb_s: float,
                       log) -> dict:
    """HF generate twice vs our side-by-side decode, and our decode step against the bandwidth floor.

    The floor uses bandwidth samples taken between the decode runs (median),
    so on a loaded machine both sides of the fraction see the same
    conditions; the floor from the best bandwidth seen in the run is
    reported too (the stricter number on a noisy machine).
    """
    stored = stored_unembedding(handle)
    unembed_bytes = stored.numel() * stored.element_size()

    ids = encode_prompt(handle, GENERATION_PROMPT)
    batch = DecodeBatch(handle)  # the default decode path (STEER_UI_DECODE, else auto), reported below
    # warm-up: first calls pay one-off allocation and kernel selection (and a static step's capture)
    _hf_generate(handle, ids, 2)
    _ours(handle, GENERATION_PROMPT, [steer], 2, batch)
    hf_pairs, ours_total, ours_steps, reads = [], [], [], []
    hf_tokens = ours_result = None
    for rep in range(reps):
        log(f"bench: side-by-side rep {rep + 1}/{reps} ({n_tokens} tokens)")
        t_unsteered, unsteered_tokens = _hf_generate(handle, ids, n_tokens)
        t_steered, steered_tokens = _hf_generate(handle, ids, n_tokens, steer)
        hf_pairs.append((t_unsteered, t_steered))
        hf_tokens = (unsteered_tokens, steered_tokens)
        reads.append(_read_seconds(handle))
        total, steps, ours_result = _ours(handle, GENERATION_PROMPT, [steer], n_tokens, batch)
        reads.append(_read_seconds(handle))
        ours_total.append(total)
        ours_steps.extend(steps)
    hf_two = median([a + b for a, b in hf_pairs])
    ours = median(ours_total)
    step = median(ours_steps)
    run_read_gb_s = unembed_bytes / median(reads) / 1e9
    floor_s = weight_bytes / (run_read_gb_s * 1e9)
    best_gb_s = max(best_read_gb_s, unembed_bytes / min(reads) / 1e9)  # the bandwidth section's or this run's
    strict_floor_s = weight_bytes / (best_gb_s * 1e9)
    # HF is told to make exactly n tokens (EOS masked); compare up to our first EOS
    eos = handle.tokenizer.eos_token_id

    def until_eos(tokens):
        ids = [t.token_id for t in tokens]
        return ids[: ids.index(eos)] if eos in ids else ids

    ours_unsteered = until_eos(ours_result.unsteered.tokens)
    ours_steered = until_eos(ours_result.steered.tokens)
    return {
        "new_tokens": n_tokens,
        "reps": reps,
        "decode_path": batch.decode_path,  # which decode step ran ours (static_decode.choose) and why
        "hf_two_generate_calls_ms": ms(hf_two),
        "hf_unsteered_ms": ms(median([a for a, _ in hf_pairs])),
        "hf_steered_ms": ms(median([b for _, b in hf_pairs])),
        "hf_ms_per_token": ms(hf_two / (2 * n_tokens)),
        "ours_side_by_side_ms": ms(ours),
        "ours_ms_per_step": ms(step),
        "ours_ms_per_step_p95": ms(percentile(ours_steps, 0.95)),
        "side_by_side_speedup": ratio(hf_two, ours),
        "read_gb_s_during_run": run_read_gb_s,
        "floor_ms": ms(floor_s),
        "decode_floor_fraction": ratio(floor_s, step),
        "read_gb_s_best": best_gb_s,
        "floor_ms_best_bandwidth": ms(strict_floor_s),
        "decode_floor_fraction_best_bandwidth": ratio(strict_floor_s, step),
        "hf_hook_overhead": ratio(median([b for _, b in hf_pairs]), median([a for a, _ in hf_pairs])),
        # greedy decodes of the same model: the unsteered rows should agree token for token
        "unsteered_tokens_match_hf": ours_unsteered == hf_tokens[0][:len(ours_unsteered)],
        "steered_tokens_match_hf": ours_steered == hf_tokens[1][:len(ours_steered)],
    }


def bench_hook_overhead(handle, steer, n_tokens: int, reps: int, log) -> dict:
    """Per-step decode time with the steering hook installed vs without, runs interleaved A B B A; both decode the
    page's three rows (an unsteered request is otherwise mirrored, one row: :func:`.generation.every_row_decoded`)."""
    log(f"bench: hook overhead ({reps} x 2 runs of {n_tokens} tokens)")
    plain, steered = [], []
    for rep in range(reps):
        order = ((False, True) if rep % 2 == 0 else (True, False))
        for with_hook in order:
            with every_row_decoded():
                _, steps, _ = _ours(handle, GENERATION_PROMPT, [steer] if with_hook else [], n_tokens)
            (steered if with_hook else plain).extend(steps)
    return {
        "new_tokens": n_tokens,
        "reps": reps,
        "unsteered_ms_per_step": ms(median(plain)),
        "steered_ms_per_step": ms(median(steered)),
        "hook_overhead": ratio(median(steered), median(plain)),
    }


def bench_decode_paths(handle, steer, n_tokens: int, reps: int, log) -> dict:
    """The static decode step (static_decode) and, where the model takes it, the fused one (fused_decode) against
    the dynamic one: per-step ms, runs interleaved in an order turned every repetition.

    ``static`` is what ``decode="static"`` runs here: captured as a CUDA graph
    on a CUDA model, eager elsewhere.  ``static_over_dynamic`` and
    ``fused_over_dynamic`` < 1 mean that step is faster; the per-repetition
    ratios' spread is reported beside the median, and whether the paths'
    tokens agreed with the dynamic path's.
    """
    from ..model import fused_decode

    paths = ["static", "dynamic"] + (["fused"] if fused_decode.unsupported(handle) is None else [])
    log(f"bench: {' vs '.join(paths)} decode step ({reps} x {len(paths)} runs of {n_tokens} tokens)")
    batches = {decode: DecodeBatch(handle, decode=decode) for decode in paths}
    for batch in batches.values():  # warm-up (and the static step's capture, on CUDA)
        _ours(handle, GENERATION_PROMPT, [steer], 2, batch)
    per = {decode: [] for decode in paths}
    pairs = {decode: [] for decode in paths if decode != "dynamic"}
    tokens = {}
    for rep in range(reps):
        medians = {}
        turn = rep % len(paths)
        for decode in paths[turn:] + paths[:turn]:
            _, steps, result = _ours(handle, GENERATION_PROMPT, [steer], n_tokens, batches[decode])
            per[decode].extend(steps)
            medians[decode] = median(steps)
            tokens[decode] = [t.token_id for side in (result.unsteered, result.steered) for t in side.tokens]
        for decode in pairs:
            pairs[decode].append(ratio(medians[decode], medians["dynamic"]))
    out = {"new_tokens": n_tokens, "reps": reps}
    for decode in paths:
        out[f"{decode}_path"] = batches[decode].decode_path
        out[f"{decode}_ms_per_step"] = ms(median(per[decode]))
    for decode in pairs:
        out[f"{decode}_over_dynamic"] = ratio(median(per[decode]), median(per["dynamic"]))
        out[f"{decode}_over_dynamic_per_pair"] = [round(x, 3) for x in pairs[decode]]
        out[f"{decode}_tokens_equal"] = tokens[decode] == tokens["dynamic"]
    return out


# ------------------------------------------------------------------ slider
def bench_slider(handle, steer, layer: int, samples: int, log, bandwidth: float | None = None) -> dict:
    """Naive full forward (hook, full logits) vs the prefix fast path, for the same α values, interleaved."""
    prompt, n_tok = _prompt_of_tokens(handle, SLIDER_TEXT, 32)
    device = handle.input_device
    log(f"bench: slider ({samples} α values, {n_tok}-token prompt, layer {layer})")
    sync(device)
    start = time.perf_counter()
    state = for_prompt(handle, prompt, layer)
    sync(device)
    build = time.perf_counter() - start
    base = float(steer.scalar_alpha)
    alphas = [base * (-1.0 + 2.0 * i / max(samples - 1, 1)) for i in range(samples)]
    naive_logits(handle, prompt, [steer])  # warm-up
    state.logits([steer], rows=1)
    naive_t, fast_t, max_diff = [], [], 0.0
    for a in alphas:
        s = steer.with_alpha(a)
        sync(device)
        t0 = time.perf_counter()
        ref = naive_logits(handle, prompt, [s])
        sync(device)
        t1 = time.perf_counter()
        fast = state.logits([s], rows=1)
        sync(device)
        t2 = time.perf_counter()
        naive_t.append(t1 - t0)
        fast_t.append(t2 - t1)
        max_diff = max(max_diff, float((ref - fast).abs().max()))
    # what a slider event costs end to end (distributions, top-k frames, Δlogit extremes)
    # and the whole next-token view (both distributions, KL, top-k frames): the slow path runs the
    # unsteered and the steered forward, as an app without the prefix cache would
    view_t, slow_view_t = [], []
    for a in alphas[: max(3, samples // 2)]:
        s = steer.with_alpha(a)
        sync(device)
        t0 = time.perf_counter()
        next_token(handle, prompt, [s], fast=False)
        sync(device)
        t1 = time.perf_counter()
        next_token(handle, prompt, [s], fast=True)
        sync(device)
        t2 = time.perf_counter()
        slow_view_t.append(t1 - t0)
        view_t.append(t2 - t1)
    two_terms = _bench_two_terms(handle, prompt, steer, layer, alphas[: max(3, samples // 2)])
    t0 = time.perf_counter()
    compare_logits(handle, state.unsteered_logits[0], state.unsteered_logits[0])
    view_only = time.perf_counter() - t0
    # Where the fast path's time goes: the one-row unembedding (a full read of W_U, so it has a
    # memory floor) and the later blocks, which must re-run on every position because the steer
    # changes every position's state.
    arch = handle.arch
    with torch.inference_mode():
        row = state.normed_last  # the last position after the final norm, what the fast path unembeds
        unembed_t = timings(lambda: arch.logits(row), max(3, samples // 2), device)
    w = stored_unembedding(handle)
    unembed_floor = (w.numel() * w.element_size() / bandwidth) if bandwidth else None
    fast_unembed = median(unembed_t)
    fast_blocks = max(median(fast_t) - fast_unembed, 0.0)
    return {
        "prompt_tokens": n_tok,
        "layer": layer,
        "samples": samples,
        "prefix_build_ms": ms(build),
        "naive_ms": ms(median(naive_t)),
        "fast_ms_p50": ms(median(fast_t)),
        "fast_ms_p95": ms(percentile(fast_t, 0.95)),
        "slider_speedup": ratio(median(naive_t), median(fast_t)),
        "next_token_view_ms_p50": ms(median(view_t)),
        "next_token_view_slow_ms_p50": ms(median(slow_view_t)),
        "next_token_view_speedup": ratio(median(slow_view_t), median(view_t)),
        "compare_only_ms": ms(view_only),
        "fast_unembed_ms": ms(fast_unembed),
        "fast_unembed_floor_ms": ms(unembed_floor) if unembed_floor else None,
        "fast_blocks_ms": ms(fast_blocks),
        "blocks_rerun": f"{layer + 1}..{arch.num_layers - 1} on {n_tok} positions",
        "slider_speedup_if_blocks_were_free": ratio(median(naive_t), unembed_floor or fast_unembed),
        "max_abs_logit_diff_vs_naive": max_diff,
        **two_terms,
        "prompt": prompt,
    }


def _bench_two_terms(handle, prompt: str, steer: Steer, layer: int, alphas: list[float]) -> dict:
    """``slider_two_terms_over_one`` (issue #48): the slider's whole next-token view (both distributions, KL,
    top-k, Δlogit extremes: :func:`next_token`, its fast path) with a second term, a seeded direction at relative
    α 0.25 on the block below (above, for block 0), over the same view with the one term; the first term's α
    moves as the slider's does, the two interleaved, medians.  The fast path caches the prompt below the lowest
    steered block, so two terms re-run one block more than one term.  ``two_terms_view_max_abs_delta_prob``:
    the two-term fast view against the slow one (both full forwards), over the top-k probabilities and KL
    (``two_terms_view_same_top_k_as_slow``: the same top-k tokens in the same order)."""
    device = handle.input_device
    other = layer - 1 if layer > 0 else min(layer + 1, handle.arch.num_layers - 1)
    second, _ = seeded_steer(handle, other, seed=1, relative_alpha=0.25)
    next_token(handle, prompt, [steer])  # warm-up: each prefix (the one block and the lowest block) built once
    next_token(handle, prompt, [steer, second])
    one_t, two_t = [], []
    for a in alphas:
        terms = [steer.with_alpha(a)]
        sync(device)
        t0 = time.perf_counter()
        next_token(handle, prompt, terms)
        sync(device)
        t1 = time.perf_counter()
        next_token(handle, prompt, terms + [second])
        sync(device)
        t2 = time.perf_counter()
        one_t.append(t1 - t0)
        two_t.append(t2 - t1)
    fast = next_token(handle, prompt, [steer, second])
    slow = next_token(handle, prompt, [steer, second], fast=False)
    gaps, same = [abs(fast.kl - slow.kl)], True
    for side in ("unsteered", "steered"):
        f, s = getattr(fast, side), getattr(slow, side)
        same = same and list(f["token_id"]) == list(s["token_id"])
        gaps += [abs(p - q) for p, q in zip(f["prob"], s["prob"])]
    lowest = min(layer, other)
    return {
        "two_terms_layers": [layer, other],
        "next_token_view_one_term_ms_p50": ms(median(one_t)),
        "next_token_view_two_terms_ms_p50": ms(median(two_t)),
        "slider_two_terms_over_one": ratio(median(two_t), median(one_t)),
        "two_terms_blocks_rerun": f"{lowest + 1}..{handle.arch.num_layers - 1}",
        "two_terms_view_same_top_k_as_slow": same,
        "two_terms_view_max_abs_delta_prob": max(gaps),
    }


def bench_sweep(handle, steer, vec: torch.Tensor, layer: int, reps: int, log, n_alphas: int = 21) -> dict:
    """21 separate fast-path calls vs one batched 21-α :func:`~steer_ui.model.analysis.sweep`."""
    prompt, n_tok = _prompt_of_tokens(handle, SLIDER_TEXT, 32)
    device = handle.input_device
    state = prefix_state(handle, prompt, layer)  # the same LRU entry the sweep will use
    scale = float(steer.scalar_alpha)
    alphas = [scale * (-1.0 + 2.0 * i / (n_alphas - 1)) for i in range(n_alphas)]
    raw = vec.to(torch.float32)
    log(f"bench: sweep ({n_alphas} α, {reps} reps)")
    sweep(handle, prompt, raw, layer, alphas)  # warm-up: the first 21-row unembedding picks its kernel
    separate, batched = [], []
    for _ in range(reps):
        sync(device)
        t0 = time.perf_counter()
        singles = [state.logits([steer.with_alpha(a)], rows=1) for a in alphas]
        sync(device)
        t1 = time.perf_counter()
        frame = sweep(handle, prompt, raw, layer, alphas)
        sync(device)
        t2 = time.perf_counter()
        separate.append(t1 - t0)
        batched.append(t2 - t1)
    top1 = [int(s[0].argmax()) for s in singles]
    return {
        "alphas": n_alphas,
        "prompt_tokens": n_tok,
        "reps": reps,
        "separate_ms": ms(median(separate)),
        "batched_ms": ms(median(batched)),
        "sweep_speedup": ratio(median(separate), median(batched)),
        "top1_agree": top1 == list(frame["top1_token_id"]),  # ids: two tokens can display alike
    }


# ------------------------------------------------------------------ extraction
def bench_extract(handle, rows: int | None, reps: int, log) -> dict:

    dataset = load_dataset(str(DATASETS / "capitals_statements.csv"))
    if rows is not None and rows < len(dataset):
        dataset = dataset.subset(range(rows), suffix=f"[:{rows}]")
    log(f"bench: activation extraction ({len(dataset)} statements, one at a time vs batched)")
    device = handle.input_device
    one, batched = [], []
    for _ in range(reps):
        sync(device)
        t0 = time.perf_counter()
        a = extract(handle, dataset, batch_size=1, cache=False)
        sync(device)
        t1 = time.perf_counter()
        b = extract(handle, dataset, batch_size=32, cache=False)
        sync(device)
        t2 = time.perf_counter()
        one.append(t1 - t0)
        batched.append(t2 - t1)
    scale = float(a.values.abs().max()) or 1.0
    return {
        "status": "measured",
        "rows": len(dataset),
        "reps": reps,
        "one_at_a_time_ms": ms(median(one)),
        "batched_ms": ms(median(batched)),
        "extract_speedup": ratio(median(one), median(batched)),
        "max_rel_diff": float((a.values - b.values).abs().max()) / scale,
    }


# ------------------------------------------------------------------ loads, memory
def bench_cold_load(model: str | None, device: str, dtype: str, log, weights: str = "auto") -> dict:
    """GGUF → safetensors conversion + load in a fresh process with an empty STEER_UI_CACHE."""
    if model and not (model == "embedded" or model.endswith(".gguf")):
        return {"status": "skipped: only GGUF sources have a cold (dequantising) load"}
    log("bench: cold load from GGUF into an empty cache (about a minute)")
    code = ("import json, sys, time\n"
            "t = time.perf_counter()\n"
            "from steer_ui.model.loading import load_model\n"
            "t_import = time.perf_counter() - t\n"
            "t = time.perf_counter()\n"
            f"load_model({model!r}, device={device!r}, dtype={dtype!r}, weights={weights!r})\n"
            "print(json.dumps({'cold_load_s': time.perf_counter() - t, 'import_s': t_import}))\n")
    with tempfile.TemporaryDirectory(prefix="steer-ui-cold-") as tmp:
        env = dict(os.environ, STEER_UI_CACHE=tmp)
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        tail = (proc.stderr or "").strip().splitlines()[-1:] or ["no output"]
        return {"status": f"failed: {tail[0]}"}
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"status": "measured", **out}


# ------------------------------------------------------------------ training
def bench_training(handle, log) -> dict:
    """Wall time of each training method on the bundled data, default settings, with a cold activation cache."""
    jobs = [
        ("probe_sweep_all_layers", "capitals_statements.csv",
         lambda ds: methods.probe_layers(handle, ds, position="last", seed=0)),
        ("mean_diff", "capitals_statements.csv", lambda ds: methods.train(handle, ds, "mean-diff")),
        ("tsv", "qa_answers.csv", lambda ds: methods.train(handle, ds, "tsv")),
        ("l2s", "capitals_pairs.csv", lambda ds: methods.train(handle, ds, "l2s")),
    ]
    out: dict = {}
    with tempfile.TemporaryDirectory(prefix="steer-ui-bench-") as tmp, cache_dir(tmp):
        for name, data_file, job in jobs:
            dataset = load_dataset(str(DATASETS / data_file))
            log(f"bench: training {name} on {data_file} ({len(dataset)} rows)")
            start = time.perf_counter()
            try:
                job(dataset)
            except Exception as exc:  # one failing method must not sink the rest of the benchmark
                message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                out[name] = {"status": f"failed: {message}"[:300]}
                continue
            out[name] = {"status": "measured", "seconds": time.perf_counter() - start, "data": data_file,
                         "rows": len(dataset)}
    return out


# ------------------------------------------------------------------ optional speed modes
def bench_bf16_lm_head(handle, reps: int, log) -> dict:
    """The unembedding in bfloat16 (weights and activations, float32 accumulate) vs float32."""
    arch = handle.arch
    device = handle.input_device
    if handle.weights != "float32":
        return {"status": f"skipped: the model's weights are {handle.weights}, not float32"}
    log("bench: bfloat16 lm_head mode")
    w16 = arch.unembedding.detach().to(torch.bfloat16)
    hs = final_hidden(handle, PROBE_PROMPTS)
    max_dp = 0.0
    agree = 0
    with torch.inference_mode():
        for h in hs:
            p32 = arch.logits(h).softmax(-1)
            l16 = torch.matmul(h.to(torch.bfloat16), w16.T).float()
            if arch.logit_softcap:
                l16 = torch.tanh(l16 / arch.logit_softcap) * arch.logit_softcap
            p16 = l16.softmax(-1)
            max_dp = max(max_dp, float((p32 - p16).abs().max()))
            agree += int(p32.argmax() == p16.argmax())
        by_rows = {}
        for n_rows in (1, 2, 3):
            rows = torch.cat(hs[:n_rows], 0)
            arch.logits(rows)  # the first call of a row count picks the float32 kernel
            t32, t16 = [], []
            for _ in range(reps):
                sync(device)
                t0 = time.perf_counter()
                arch.logits(rows)
                sync(device)
                t1 = time.perf_counter()
                torch.matmul(rows.to(torch.bfloat16), w16.T).float()
                sync(device)
                t2 = time.perf_counter()
                t32.append(t1 - t0)
                t16.append(t2 - t1)
            by_rows[n_rows] = (median(t32), median(t16))
    del w16
    return {
        "status": "measured",
        "float32_ms_by_rows": {n: ms(a) for n, (a, _) in by_rows.items()},
        "bfloat16_ms_by_rows": {n: ms(b) for n, (_, b) in by_rows.items()},
        "speedup_2_rows": ratio(*by_rows[2]),
        "max_abs_delta_prob": max_dp,
        "top1_agree": f"{agree}/{len(hs)}",
        "prompts": len(hs),
    }


def bench_bf16_model(handle, steer, n_tokens: int, bandwidth: float, log) -> dict:
    """The whole model in bfloat16: decode step time against its own (halved) floor, and the accuracy cost."""
    if handle.weights != "float32":
        return {"status": f"skipped: the model's weights are {handle.weights}, not float32"}
    log("bench: bfloat16 model mode (a temporary copy)")
    model16 = copy.deepcopy(handle.model).to(torch.bfloat16)
    h16 = from_model(model16, handle.tokenizer, model_id=handle.model_id + " (bfloat16 copy)")
    h16._layer_norms = handle.layer_norms()
    try:
        max_dp, agree = 0.0, 0
        hs32 = final_hidden(handle, PROBE_PROMPTS)
        hs16 = final_hidden(h16, PROBE_PROMPTS)
        with torch.inference_mode():
            for a, b in zip(hs32, hs16):
                p32 = handle.arch.logits(a).softmax(-1)
                p16 = h16.arch.logits(b).softmax(-1)
                max_dp = max(max_dp, float((p32 - p16).abs().max()))
                agree += int(p32.argmax() == p16.argmax())
        _ours(h16, GENERATION_PROMPT, [steer], 2)
        _, steps16, _ = _ours(h16, GENERATION_PROMPT, [steer], n_tokens)
        _, steps32, _ = _ours(handle, GENERATION_PROMPT, [steer], n_tokens)
        floor16 = parameter_bytes(model16) / bandwidth
        return {
            "status": "measured",
            "float32_ms_per_step": ms(median(steps32)),
            "bfloat16_ms_per_step": ms(median(steps16)),
            "speedup": ratio(median(steps32), median(steps16)),
            "bfloat16_floor_ms": ms(floor16),
            "bfloat16_floor_fraction": ratio(floor16, median(steps16)),
            "max_abs_delta_prob": max_dp,
            "top1_agree": f"{agree}/{len(hs32)}",
            "prompts": len(hs32),
        }
    finally:
        del h16, model16
        gc.collect()


def bench_alpha_grid(handle, steer, layer: int, log, points: int = 41) -> dict:
    """Precompute the slider's next-token views over a grid of α; a drag is then a dictionary lookup."""
    prompt, _ = _prompt_of_tokens(handle, SLIDER_TEXT, 32)
    scale = float(steer.scalar_alpha)
    alphas = [scale * (-1.0 + 2.0 * i / (points - 1)) for i in range(points)]
    log(f"bench: precomputed α grid ({points} points)")
    t0 = time.perf_counter()
    grid = AlphaGrid(handle, prompt, steer, alphas)
    build = time.perf_counter() - t0
    lookups, max_dp = [], 0.0
    for a in alphas[:: max(1, points // 8)]:
        t0 = time.perf_counter()
        view = grid.view(a)
        lookups.append(time.perf_counter() - t0)
        direct = next_token(handle, prompt, [steer.with_alpha(a)], fast=True)
        max_dp = max(max_dp, float((view.steered.prob - direct.steered.prob).abs().max()))
    return {
        "status": "measured",
        "points": points,
        "build_ms": ms(build),
        "lookup_ms_p50": ms(median(lookups)),
        "max_abs_delta_prob_vs_direct": max_dp,
    }




# ------------------------------------------------------------------ precision
@contextmanager
def float32_reference(handle, log):
    """The model in float32 for the accuracy sections: ``handle`` itself when it is float32, else
    ``handle.source`` loaded again in float32 on the same device (for ``random:``/``tiny:`` models the same
    seeded weights before rounding), freed on exit; None for int8 weights (their cost is measured at load).
    """
    if handle.weights == "int8":
        yield None
        return
    if handle.dtype == torch.float32:
        yield handle
        return
    from ..model.loading import load_model

    log(f"bench: loading {handle.source} in float32 as the accuracy reference")
    reference = load_model(handle.source, device=str(handle.device), weights="float32")
    try:
        yield reference
    finally:
        del reference
        gc.collect()
        if handle.device.type == "cuda":
            torch.cuda.empty_cache()


def bench_dtype_accuracy(handle, reference, log) -> dict:
    """What the model's dtype costs: max |Δ probability| of the next token vs the float32 model, on fixed prompts.

    ``reference``: :func:`float32_reference`'s model, so the figure includes
    the weights' rounding as well as the arithmetic's.  A float32 model is its
    own reference: 0.
    """
    dtype = str(handle.dtype).replace("torch.", "")
    if handle.weights == "int8":  # measured at load against the float32 model just before quantising
        cost = handle.precision_cost or {}
        # the arithmetic in use: an integer-product path the loader switched on has its own measured cost
        path = path_in_use(cost)
        arithmetic = {None: "float32 arithmetic", "w8a8": "every product on int8 activations",
                      "w8a16": "every product on int16 activations (packed weights)",
                      "w8a16_unembedding": "the unembedding's products on int16 activations"}[path]
        cost = cost if path is None else cost[path]
        return {"status": "measured", "dtype": f"int8 weights, {arithmetic}",
                "max_abs_delta_prob": cost.get("max_abs_dp"), "top1_agree": f"{cost.get('top1_agree')}/"
                f"{cost.get('prompts')}", "max_abs_delta_delta_logit": cost.get("max_abs_ddlogit"),
                "reference": "the float32 model before quantising (measured at the first load, cached)",
                "prompts": cost.get("prompts")}
    if reference is handle:
        return {"status": "measured", "dtype": dtype, "max_abs_delta_prob": 0.0, "top1_agree": "all",
                "reference": "the model itself (float32)", "prompts": len(PROBE_PROMPTS)}
    log(f"bench: {dtype} vs float32 next-token distributions ({len(PROBE_PROMPTS)} prompts)")
    probs = next_token_probs(handle)
    ref_probs = next_token_probs(reference)
    agree = int((probs.argmax(-1) == ref_probs.argmax(-1)).sum())
    return {"status": "measured", "dtype": dtype, "max_abs_delta_prob": float((probs - ref_probs).abs().max()),
            "top1_agree": f"{agree}/{len(PROBE_PROMPTS)}", "reference": f"{handle.source} loaded in float32",
            "prompts": len(PROBE_PROMPTS)}


def bench_greedy_vs_float32(handle, reference, steer, n_tokens: int, log, prompts: int = 4) -> dict:
    """The app's default decode against a float32 eager reference, greedy, unsteered and steered
    (:mod:`.greedy_reference`); skipped for int8 weights, whose cost is measured at load."""
    if reference is None:
        return {"status": f"skipped: the model's weights are {handle.weights} (their cost is measured at load)"}
    log(f"bench: greedy tokens against a float32 eager reference ({prompts} prompts, {n_tokens} tokens)")
    batch = DecodeBatch(handle)  # the default path, as the app decodes (captured once on CUDA)

    def decode(prompt, steers, n):
        return _ours(handle, prompt, steers, n, batch)[2]

    result = greedy_vs_reference(handle, reference, steer, PROBE_PROMPTS[:prompts], n_tokens, decode)
    return {**result, "decode_path": batch.decode_path}


# ------------------------------------------------------------------ the precision against float32, same run
def bench_vs_float32(handle, steer, n_tokens: int, reps: int, log) -> dict:
    """The model's precision against the same model in float32, in this run: the side-by-side decode step and
    the one-row unembedding of the slider's view (runs alternated), and the greedy texts compared.  Skipped
    for a float32 model (it is its own reference); loads a float32 copy for the comparison."""
    if handle.weights == "float32":
        return {"status": "skipped: the model is float32"}
    from ..model.loading import load_model

    log(f"bench: {handle.weights} vs float32 ({reps} x 2 runs of {n_tokens} tokens, a float32 copy)")
    reference = load_model(handle.source, device=str(handle.device), weights="float32")
    reference._layer_norms = handle.layer_norms()
    try:
        steps: dict[str, list[float]] = {"model": [], "float32": []}
        unembed: dict[str, list[float]] = {"model": [], "float32": []}
        texts = {}
        pairs = (("model", handle), ("float32", reference))
        for name, h in pairs:  # warm-up: kernels chosen, pages touched
            _ours(h, GENERATION_PROMPT, [steer], 2)
        row = final_hidden(handle, [GENERATION_PROMPT])[0]
        for rep in range(reps):
            for name, h in (pairs if rep % 2 == 0 else pairs[::-1]):
                _, s, result = _ours(h, GENERATION_PROMPT, [steer], n_tokens)
                steps[name].extend(s)
                texts[name] = (result.unsteered.text, result.steered.text)
                with torch.inference_mode():
                    unembed[name].extend(timings(lambda: h.arch.logits(h.arch.final_hidden(row)), 5,
                                                 handle.device))
        return {"status": "measured", "weights": handle.weights, "new_tokens": n_tokens, "reps": reps,
                "ms_per_step": ms(median(steps["model"])), "float32_ms_per_step": ms(median(steps["float32"])),
                "step_speedup": ratio(median(steps["float32"]), median(steps["model"])),
                "one_row_unembedding_ms": ms(median(unembed["model"])),
                "float32_one_row_unembedding_ms": ms(median(unembed["float32"])),
                "texts_equal": texts["model"] == texts["float32"]}
    finally:
        del reference
        gc.collect()
