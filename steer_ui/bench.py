"""The benchmark behind ``python -m steer_ui bench [--quick] --json``.

Shared machines are noisy, so every headline figure is a *ratio of two
timings taken in the same run*, each the median of several repetitions, with
the two sides interleaved (A, B, A, B, ...) so a burst of load hits both.
Absolute milliseconds are reported next to every ratio, together with the
load average before and after, so a reader can judge the conditions.

Headline ratios (targets from the performance issue):

* ``side_by_side_speedup``: two sequential ``model.generate()`` calls
  (unsteered, then steered through a forward hook: how steering demos usually
  do it) ÷ one batched side-by-side decode (unsteered + steered +
  counterfactual rows), greedy, the same number of new tokens.
* ``decode_floor_fraction``: (weight bytes ÷ measured read bandwidth) ÷ our
  time per side-by-side decode step (all three rows).
* ``slider_speedup``: one full forward of a 32-token prompt with the hook and
  full logits ÷ the slider's fast path (:class:`~steer_ui.model.prefix.Prefix`).
* ``hook_overhead``: steered ÷ unsteered decode time per step.
* ``sweep_speedup``: 21 separate fast-path calls ÷ one batched 21-α sweep.
* ``extract_speedup``: one-at-a-time ÷ batched activation extraction over the
  bundled statements.

``--quick`` (CI's smoke run) uses fewer tokens and repetitions and skips the
cold GGUF load, the training times and the bfloat16 modes.  Nothing here
asserts a timing: the JSON reports, the reader judges.
"""
from __future__ import annotations

import copy
import gc
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

import torch

ROOT = Path(__file__).resolve().parents[1]
DATASETS = ROOT / "assets" / "datasets"

# name: (comparison, target)
TARGETS = {
    "side_by_side_speedup": (">=", 1.8),
    "decode_floor_fraction": (">=", 0.4),
    "slider_speedup": (">=", 4.0),
    "hook_overhead": ("<=", 1.03),
    "sweep_speedup": (">=", 2.0),
    "extract_speedup": (">=", 3.0),
    "warm_load_s": ("<=", 10.0),
    "peak_rss_gb": ("<=", 3.0),
}

GENERATION_PROMPT = "Once upon a time, in a small village by the sea, there lived an old fisherman who"
SLIDER_TEXT = ("The old lighthouse keeper climbed the spiral stairs every evening at dusk, carrying a lamp and a "
               "thermos of tea, and from the top he watched the ships return to the harbour while the gulls "
               "circled above the grey water and the wind rose over the cliffs")
PROBE_PROMPTS = (
    "The capital of France is",
    "Water boils at one hundred degrees Celsius at sea level, and",
    "She opened the book and began to read",
    "The best way to learn a new language is",
    "In 1969, the first humans walked on",
    "def fibonacci(n):",
)


# ------------------------------------------------------------------ helpers
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timings(fn: Callable[[], object], reps: int, device: torch.device) -> list[float]:
    """Seconds of ``reps`` back-to-back calls of ``fn``, each bracketed by device syncs."""
    out = []
    for _ in range(reps):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        out.append(time.perf_counter() - start)
    return out


def _median(xs) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def _percentile(xs, q: float) -> float:
    if not xs:
        return float("nan")
    ordered = sorted(xs)
    pos = (len(ordered) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return float(ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo))


def _ms(seconds: float) -> float:
    return round(seconds * 1000.0, 3)


def _ratio(num: float, den: float) -> float:
    return float(num / den) if den > 0 else float("nan")


def _rss_bytes() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


def _peak_rss_bytes() -> int:
    """Peak resident set size of this process so far (Linux/macOS), else the current RSS."""
    try:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak if sys.platform == "darwin" else peak * 1024)
    except (ImportError, OSError):
        return _rss_bytes()


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


@contextmanager
def _cache_dir(path: str):
    """Point ``STEER_UI_CACHE`` somewhere else for the block (cold caches), then restore it."""
    old = os.environ.get("STEER_UI_CACHE")
    os.environ["STEER_UI_CACHE"] = path
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("STEER_UI_CACHE", None)
        else:
            os.environ["STEER_UI_CACHE"] = old


def _clean(obj):
    """JSON-safe: NaN/inf become None, tensors and numpy scalars become numbers."""
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, bool) or obj is None or isinstance(obj, str):
        return obj
    if isinstance(obj, torch.Tensor):
        obj = obj.item() if obj.numel() == 1 else obj.tolist()
        return _clean(obj)
    if hasattr(obj, "item") and not isinstance(obj, (int, float)):
        obj = obj.item()
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    return obj


# ------------------------------------------------------------------ setup
def _load(model: str | None, device: str, dtype: str, log):
    """(handle, load facts).  ``tiny:FAMILY`` builds a random tiny model (tests, CI)."""
    from .model.loading import EMBEDDED, embedded_gguf_path, from_model, gguf_cache_dir, load_model, resolve_device

    if model and model.startswith("tiny:"):
        from .tiny import tiny_model

        start = time.perf_counter()
        m, tok = tiny_model(model.split(":", 1)[1])
        m.to(resolve_device(device))
        handle = from_model(m, tok, model_id=model)
        return handle, {"warm_load_s": time.perf_counter() - start, "cache_hit": None, "source": model}
    source = model or EMBEDDED
    cache_hit = None
    if source == EMBEDDED or source.endswith(".gguf"):
        gguf = embedded_gguf_path() if source == EMBEDDED else Path(source).expanduser()
        cache_hit = gguf_cache_dir(gguf).is_dir() if gguf.is_file() else None
    log(f"bench: loading {source} ({'warm' if cache_hit else 'cold' if cache_hit is False else 'direct'})")
    start = time.perf_counter()
    handle = load_model(source, device=device, dtype=dtype)
    return handle, {"warm_load_s": time.perf_counter() - start, "cache_hit": cache_hit, "source": source}


def _weight_bytes(module: torch.nn.Module, dtype: torch.dtype | None = None) -> int:
    """Bytes of distinct parameter storage (a tied unembedding counts once)."""
    seen, total = set(), 0
    for p in module.parameters():
        key = (p.data_ptr(), p.numel())
        if key in seen:
            continue
        seen.add(key)
        size = torch.empty((), dtype=dtype).element_size() if dtype is not None else p.element_size()
        total += p.numel() * size
    return total


def measure_bandwidth(handle, reps: int = 5) -> dict:
    """Memory read bandwidth, measured by summing the model's own largest weight matrix.

    The unembedding is what the decode streams every step, so the rate at
    which the machine reads *it* is the honest denominator for the floor.  A
    copy of the same bytes (read + write) is reported alongside.
    """
    device = handle.input_device
    w = handle.arch.unembedding.detach()
    nbytes = w.numel() * w.element_size()
    with torch.inference_mode():
        float(w.sum())  # touch every page once
        sums = _timings(w.sum, reps, device)
        out = torch.empty_like(w)
        copies = _timings(lambda: out.copy_(w), max(2, reps // 2), device)
        del out
    read = nbytes / min(sums)
    return {
        "bytes": nbytes,
        "read_gb_s": read / 1e9,
        "read_gb_s_median": nbytes / _median(sums) / 1e9,
        "copy_gb_s": 2 * nbytes / min(copies) / 1e9,
        "method": "best of repeated sums of the unembedding matrix (copy = read + write of the same bytes)",
    }


def _steer(handle, layer: int, seed: int = 0, relative_alpha: float = 0.5):
    """A seeded unit random direction at ``layer``, α in units of the layer's mean residual norm."""
    from .model.hooks import Steer

    gen = torch.Generator().manual_seed(seed)
    vec = torch.randn(handle.arch.hidden_size, generator=gen)
    vec = vec / vec.norm()
    scale = handle.relative_scale(layer)
    return Steer(layer=layer, vector=vec, alpha=relative_alpha * scale), vec, scale


def _prompt_of_tokens(handle, text: str, n_tokens: int) -> tuple[str, int]:
    """The longest word prefix of ``text`` that encodes to at most ``n_tokens`` tokens."""
    from .model.generation import encode_prompt

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
    """One ``model.generate()`` call (greedy, exactly ``n`` new tokens), steered through a plain forward hook."""
    from transformers import GenerationConfig

    model = handle.model
    device = handle.input_device
    config = GenerationConfig(max_new_tokens=n, min_new_tokens=n, do_sample=False, num_beams=1,
                              pad_token_id=handle.tokenizer.pad_token_id,
                              eos_token_id=handle.tokenizer.eos_token_id, use_cache=True)
    remover = None
    if steer is not None:
        add = (steer.scalar_alpha * steer.vector).to(device=device, dtype=handle.arch.unembedding.dtype)

        def hook(_module, _inputs, output):
            if isinstance(output, tuple):
                return (output[0] + add,) + tuple(output[1:])
            return output + add

        remover = handle.arch.layers[steer.layer].register_forward_hook(hook)
    try:
        with handle.lock, torch.inference_mode():
            ids = ids.to(device)
            _sync(device)
            start = time.perf_counter()
            out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)
            _sync(device)
            seconds = time.perf_counter() - start
    finally:
        if remover is not None:
            remover.remove()
    return seconds, out[0, ids.shape[1]:].tolist()


def _ours(handle, prompt: str, steers, n: int) -> tuple[float, list[float], object]:
    """(total seconds, per-step seconds for steps 1.., result) of one side-by-side decode."""
    from .model.generation import Sampling, stream_side_by_side

    sampling = Sampling(max_new_tokens=n, temperature=0.0, stop_at_eos=False)
    device = handle.input_device
    stamps = []
    result = None
    _sync(device)
    start = time.perf_counter()
    for event in stream_side_by_side(handle, prompt, steers, sampling):
        _sync(device)
        stamps.append(time.perf_counter())
        result = event.result
    steps = [b - a for a, b in zip(stamps, stamps[1:])]
    return stamps[-1] - start, steps, result


def _read_seconds(handle) -> float:
    """One timed read (sum) of the unembedding: a bandwidth sample taken between decode runs."""
    device = handle.input_device
    w = handle.arch.unembedding
    with torch.inference_mode():
        _sync(device)
        start = time.perf_counter()
        w.sum()
        _sync(device)
    return time.perf_counter() - start


def bench_side_by_side(handle, steer, n_tokens: int, reps: int, weight_bytes: int, best_read_gb_s: float,
                       log) -> dict:
    """HF generate twice vs our side-by-side decode, and our decode step against the bandwidth floor.

    The floor uses bandwidth samples taken between the decode runs (median),
    so on a loaded machine both sides of the fraction see the same
    conditions; the floor from the best bandwidth seen in the run is
    reported too (the stricter number on a noisy machine).
    """
    from .model.generation import encode_prompt

    unembed_bytes = handle.arch.unembedding.numel() * handle.arch.unembedding.element_size()

    ids = encode_prompt(handle, GENERATION_PROMPT)
    # warm-up: first calls pay one-off allocation and kernel selection
    _hf_generate(handle, ids, 2)
    _ours(handle, GENERATION_PROMPT, [steer], 2)
    hf_pairs, ours_total, ours_steps, reads = [], [], [], []
    hf_tokens = ours_result = None
    for rep in range(reps):
        log(f"bench: side-by-side rep {rep + 1}/{reps} ({n_tokens} tokens)")
        t_unsteered, unsteered_tokens = _hf_generate(handle, ids, n_tokens)
        t_steered, steered_tokens = _hf_generate(handle, ids, n_tokens, steer)
        hf_pairs.append((t_unsteered, t_steered))
        hf_tokens = (unsteered_tokens, steered_tokens)
        reads.append(_read_seconds(handle))
        total, steps, ours_result = _ours(handle, GENERATION_PROMPT, [steer], n_tokens)
        reads.append(_read_seconds(handle))
        ours_total.append(total)
        ours_steps.extend(steps)
    hf_two = _median([a + b for a, b in hf_pairs])
    ours = _median(ours_total)
    step = _median(ours_steps)
    run_read_gb_s = unembed_bytes / _median(reads) / 1e9
    floor_s = weight_bytes / (run_read_gb_s * 1e9)
    strict_floor_s = weight_bytes / (max(best_read_gb_s, unembed_bytes / min(reads) / 1e9) * 1e9)
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
        "hf_two_generate_calls_ms": _ms(hf_two),
        "hf_unsteered_ms": _ms(_median([a for a, _ in hf_pairs])),
        "hf_steered_ms": _ms(_median([b for _, b in hf_pairs])),
        "hf_ms_per_token": _ms(hf_two / (2 * n_tokens)),
        "ours_side_by_side_ms": _ms(ours),
        "ours_ms_per_step": _ms(step),
        "ours_ms_per_step_p95": _ms(_percentile(ours_steps, 0.95)),
        "side_by_side_speedup": _ratio(hf_two, ours),
        "read_gb_s_during_run": run_read_gb_s,
        "floor_ms": _ms(floor_s),
        "decode_floor_fraction": _ratio(floor_s, step),
        "floor_ms_best_bandwidth": _ms(strict_floor_s),
        "decode_floor_fraction_best_bandwidth": _ratio(strict_floor_s, step),
        "hf_hook_overhead": _ratio(_median([b for _, b in hf_pairs]), _median([a for a, _ in hf_pairs])),
        # greedy decodes of the same model: the unsteered rows should agree token for token
        "unsteered_tokens_match_hf": ours_unsteered == hf_tokens[0][:len(ours_unsteered)],
        "steered_tokens_match_hf": ours_steered == hf_tokens[1][:len(ours_steered)],
    }


def bench_hook_overhead(handle, steer, n_tokens: int, reps: int, log) -> dict:
    """Per-step decode time with the steering hook installed vs without, runs interleaved A B B A."""
    log(f"bench: hook overhead ({reps} x 2 runs of {n_tokens} tokens)")
    plain, steered = [], []
    for rep in range(reps):
        order = ((False, True) if rep % 2 == 0 else (True, False))
        for with_hook in order:
            _, steps, _ = _ours(handle, GENERATION_PROMPT, [steer] if with_hook else [], n_tokens)
            (steered if with_hook else plain).extend(steps)
    return {
        "new_tokens": n_tokens,
        "reps": reps,
        "unsteered_ms_per_step": _ms(_median(plain)),
        "steered_ms_per_step": _ms(_median(steered)),
        "hook_overhead": _ratio(_median(steered), _median(plain)),
    }


# ------------------------------------------------------------------ slider
def bench_slider(handle, steer, layer: int, samples: int, log, bandwidth: float | None = None) -> dict:
    """Naive full forward (hook, full logits) vs the prefix fast path, for the same α values, interleaved."""
    from .model.analysis import compare_logits, naive_logits, next_token
    from .model.prefix import for_prompt

    prompt, n_tok = _prompt_of_tokens(handle, SLIDER_TEXT, 32)
    device = handle.input_device
    log(f"bench: slider ({samples} α values, {n_tok}-token prompt, layer {layer})")
    _sync(device)
    start = time.perf_counter()
    state = for_prompt(handle, prompt, layer)
    unsteered = state.unsteered_logits[0]  # part of what a new prompt costs
    _sync(device)
    build = time.perf_counter() - start
    base = float(steer.scalar_alpha)
    alphas = [base * (-1.0 + 2.0 * i / max(samples - 1, 1)) for i in range(samples)]
    naive_logits(handle, prompt, [steer])  # warm-up
    state.logits([steer], rows=1)
    naive_t, fast_t, max_diff = [], [], 0.0
    for a in alphas:
        s = steer.with_alpha(a)
        _sync(device)
        t0 = time.perf_counter()
        ref = naive_logits(handle, prompt, [s])
        _sync(device)
        t1 = time.perf_counter()
        fast = state.logits([s], rows=1)
        _sync(device)
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
        _sync(device)
        t0 = time.perf_counter()
        next_token(handle, prompt, [s], fast=False)
        _sync(device)
        t1 = time.perf_counter()
        next_token(handle, prompt, [s], fast=True)
        _sync(device)
        t2 = time.perf_counter()
        slow_view_t.append(t1 - t0)
        view_t.append(t2 - t1)
    t0 = time.perf_counter()
    compare_logits(handle, unsteered, unsteered)
    view_only = time.perf_counter() - t0
    # Where the fast path's time goes: the one-row unembedding (a full read of W_U, so it has a
    # memory floor) and the later blocks, which must re-run on every position because the steer
    # changes every position's state.
    arch = handle.arch
    with torch.inference_mode():
        row = arch.final_hidden(state.hidden[:, -1:, :])[:, -1, :]
        unembed_t = _timings(lambda: arch.logits(row), max(3, samples // 2), device)
    w = arch.unembedding
    unembed_floor = (w.numel() * w.element_size() / bandwidth) if bandwidth else None
    fast_unembed = _median(unembed_t)
    fast_blocks = max(_median(fast_t) - fast_unembed, 0.0)
    return {
        "prompt_tokens": n_tok,
        "layer": layer,
        "samples": samples,
        "prefix_build_ms": _ms(build),
        "naive_ms": _ms(_median(naive_t)),
        "fast_ms_p50": _ms(_median(fast_t)),
        "fast_ms_p95": _ms(_percentile(fast_t, 0.95)),
        "slider_speedup": _ratio(_median(naive_t), _median(fast_t)),
        "next_token_view_ms_p50": _ms(_median(view_t)),
        "next_token_view_slow_ms_p50": _ms(_median(slow_view_t)),
        "next_token_view_speedup": _ratio(_median(slow_view_t), _median(view_t)),
        "compare_only_ms": _ms(view_only),
        "fast_unembed_ms": _ms(fast_unembed),
        "fast_unembed_floor_ms": _ms(unembed_floor) if unembed_floor else None,
        "fast_blocks_ms": _ms(fast_blocks),
        "blocks_rerun": f"{layer + 1}..{arch.num_layers - 1} on {n_tok} positions",
        "slider_speedup_if_blocks_were_free": _ratio(_median(naive_t), unembed_floor or fast_unembed),
        "max_abs_logit_diff_vs_naive": max_diff,
        "prompt": prompt,
    }


def bench_sweep(handle, steer, vec: torch.Tensor, layer: int, reps: int, log, n_alphas: int = 21) -> dict:
    """21 separate fast-path calls vs one batched 21-α :func:`~steer_ui.model.analysis.sweep`."""
    from .model.analysis import prefix_state, sweep

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
        _sync(device)
        t0 = time.perf_counter()
        singles = [state.logits([steer.with_alpha(a)], rows=1) for a in alphas]
        _sync(device)
        t1 = time.perf_counter()
        frame = sweep(handle, prompt, raw, layer, alphas)
        _sync(device)
        t2 = time.perf_counter()
        separate.append(t1 - t0)
        batched.append(t2 - t1)
    top1 = [int(s[0].argmax()) for s in singles]
    sweep_top1 = [handle.tokenizer.decode([t]) for t in top1]
    return {
        "alphas": n_alphas,
        "prompt_tokens": n_tok,
        "reps": reps,
        "separate_ms": _ms(_median(separate)),
        "batched_ms": _ms(_median(batched)),
        "sweep_speedup": _ratio(_median(separate), _median(batched)),
        "top1_agree": sweep_top1 == list(frame["top1_token"]),
    }


# ------------------------------------------------------------------ extraction
def bench_extract(handle, rows: int | None, reps: int, log) -> dict:
    from .data import load_dataset
    from .data.activations import extract

    dataset = load_dataset(str(DATASETS / "capitals_statements.csv"))
    if rows is not None and rows < len(dataset):
        dataset = dataset.subset(range(rows), suffix=f"[:{rows}]")
    log(f"bench: activation extraction ({len(dataset)} statements, one at a time vs batched)")
    device = handle.input_device
    one, batched = [], []
    for _ in range(reps):
        _sync(device)
        t0 = time.perf_counter()
        a = extract(handle, dataset, batch_size=1, cache=False)
        _sync(device)
        t1 = time.perf_counter()
        b = extract(handle, dataset, batch_size=32, cache=False)
        _sync(device)
        t2 = time.perf_counter()
        one.append(t1 - t0)
        batched.append(t2 - t1)
    scale = float(a.values.abs().max()) or 1.0
    return {
        "status": "measured",
        "rows": len(dataset),
        "reps": reps,
        "one_at_a_time_ms": _ms(_median(one)),
        "batched_ms": _ms(_median(batched)),
        "extract_speedup": _ratio(_median(one), _median(batched)),
        "max_rel_diff": float((a.values - b.values).abs().max()) / scale,
    }


# ------------------------------------------------------------------ loads, memory
def bench_cold_load(model: str | None, device: str, dtype: str, log) -> dict:
    """GGUF → safetensors conversion + load in a fresh process with an empty STEER_UI_CACHE."""
    if model and not (model == "embedded" or model.endswith(".gguf")):
        return {"status": "skipped: only GGUF sources have a cold (dequantising) load"}
    log("bench: cold load from GGUF into an empty cache (about a minute)")
    code = ("import json, sys, time\n"
            "t = time.perf_counter()\n"
            "from steer_ui.model.loading import load_model\n"
            "t_import = time.perf_counter() - t\n"
            "t = time.perf_counter()\n"
            f"load_model({model!r}, device={device!r}, dtype={dtype!r})\n"
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
def _train_args(method: str, data: Path):
    from .cli import build_parser

    return build_parser().parse_args(["train", "--method", method, "--data", str(data), "--out", os.devnull])


def bench_training(handle, log) -> dict:
    """Wall time of each training method on the bundled data, with a cold activation cache."""
    from . import methods
    from .data import load_dataset

    jobs = [
        ("probe_sweep_all_layers", "capitals_statements.csv",
         lambda ds: methods.probe_layers(handle, ds, position="last", seed=0)),
        ("mean_diff", "capitals_statements.csv",
         lambda ds: methods.train_from_args(handle, ds, _train_args("mean-diff", DATASETS / "capitals_statements.csv"))),
        ("tsv", "qa_answers.csv",
         lambda ds: methods.train_from_args(handle, ds, _train_args("tsv", DATASETS / "qa_answers.csv"))),
        ("l2s", "capitals_pairs.csv",
         lambda ds: methods.train_from_args(handle, ds, _train_args("l2s", DATASETS / "capitals_pairs.csv"))),
    ]
    out: dict = {}
    with tempfile.TemporaryDirectory(prefix="steer-ui-bench-") as tmp, _cache_dir(tmp):
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
def _final_hidden(handle, prompts) -> list[torch.Tensor]:
    from .model.generation import encode_prompt

    hs = []
    with handle.lock, torch.inference_mode():
        for p in prompts:
            ids = encode_prompt(handle, p).to(handle.input_device)
            out = handle.model.base_model(input_ids=ids, use_cache=False)
            hs.append(out.last_hidden_state[:, -1, :])
    return hs


def bench_bf16_lm_head(handle, reps: int, log) -> dict:
    """The unembedding in bfloat16 (weights and activations, float32 accumulate) vs float32."""
    arch = handle.arch
    device = handle.input_device
    if arch.unembedding.dtype != torch.float32:
        return {"status": "skipped: the model is not float32"}
    log("bench: bfloat16 lm_head mode")
    w16 = arch.unembedding.detach().to(torch.bfloat16)
    hs = _final_hidden(handle, PROBE_PROMPTS)
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
        timings = {}
        for n_rows in (1, 2, 3):
            rows = torch.cat(hs[:n_rows], 0)
            arch.logits(rows)  # the first call of a row count picks the float32 kernel
            t32, t16 = [], []
            for _ in range(reps):
                _sync(device)
                t0 = time.perf_counter()
                arch.logits(rows)
                _sync(device)
                t1 = time.perf_counter()
                torch.matmul(rows.to(torch.bfloat16), w16.T).float()
                _sync(device)
                t2 = time.perf_counter()
                t32.append(t1 - t0)
                t16.append(t2 - t1)
            timings[n_rows] = (_median(t32), _median(t16))
    del w16
    return {
        "status": "measured",
        "float32_ms_by_rows": {n: _ms(a) for n, (a, _) in timings.items()},
        "bfloat16_ms_by_rows": {n: _ms(b) for n, (_, b) in timings.items()},
        "speedup_2_rows": _ratio(*timings[2]),
        "max_abs_delta_prob": max_dp,
        "top1_agree": f"{agree}/{len(hs)}",
        "prompts": len(hs),
    }


def bench_bf16_model(handle, steer, n_tokens: int, bandwidth: float, log) -> dict:
    """The whole model in bfloat16: decode step time against its own (halved) floor, and the accuracy cost."""
    from .model.loading import from_model

    if handle.arch.unembedding.dtype != torch.float32:
        return {"status": "skipped: the model is not float32"}
    log("bench: bfloat16 model mode (a temporary copy)")
    model16 = copy.deepcopy(handle.model).to(torch.bfloat16)
    h16 = from_model(model16, handle.tokenizer, model_id=handle.model_id + " (bfloat16 copy)")
    h16._layer_norms = handle.layer_norms()
    try:
        max_dp, agree = 0.0, 0
        hs32 = _final_hidden(handle, PROBE_PROMPTS)
        hs16 = _final_hidden(h16, PROBE_PROMPTS)
        with torch.inference_mode():
            for a, b in zip(hs32, hs16):
                p32 = handle.arch.logits(a).softmax(-1)
                p16 = h16.arch.logits(b).softmax(-1)
                max_dp = max(max_dp, float((p32 - p16).abs().max()))
                agree += int(p32.argmax() == p16.argmax())
        _ours(h16, GENERATION_PROMPT, [steer], 2)
        _, steps16, _ = _ours(h16, GENERATION_PROMPT, [steer], n_tokens)
        _, steps32, _ = _ours(handle, GENERATION_PROMPT, [steer], n_tokens)
        floor16 = _weight_bytes(model16) / bandwidth
        return {
            "status": "measured",
            "float32_ms_per_step": _ms(_median(steps32)),
            "bfloat16_ms_per_step": _ms(_median(steps16)),
            "speedup": _ratio(_median(steps32), _median(steps16)),
            "bfloat16_floor_ms": _ms(floor16),
            "bfloat16_floor_fraction": _ratio(floor16, _median(steps16)),
            "max_abs_delta_prob": max_dp,
            "top1_agree": f"{agree}/{len(hs32)}",
            "prompts": len(hs32),
        }
    finally:
        del h16, model16
        gc.collect()


def bench_alpha_grid(handle, steer, layer: int, log, points: int = 41) -> dict:
    """Precompute the slider's next-token views over a grid of α; a drag is then a dictionary lookup."""
    from .model.analysis import AlphaGrid, next_token

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
        "build_ms": _ms(build),
        "lookup_ms_p50": _ms(_median(lookups)),
        "max_abs_delta_prob_vs_direct": max_dp,
    }


# ------------------------------------------------------------------ the run
def _verdicts(ratios: dict) -> dict:
    out = {}
    for name, (op, target) in TARGETS.items():
        value = ratios.get(name)
        if value is None or (isinstance(value, float) and not math.isfinite(value)):
            out[name] = None
        else:
            out[name] = bool(value >= target) if op == ">=" else bool(value <= target)
    return out


def run_bench(model: str | None = None, device: str = "auto", dtype: str = "auto", quick: bool = False,
              log: Callable[[str], None] = print) -> dict:
    """Run the benchmark; return one JSON-ready dict (ratios, absolute ms, targets, conditions).

    ``model``: None/'embedded' (Gemma 3 270M), any ``load_model`` source, or
    ``tiny:FAMILY``.  ``quick``: the CI smoke run (fewer tokens and
    repetitions; no cold load, training or bfloat16 modes).
    """
    started = time.perf_counter()
    load_before = _loadavg()
    handle, load = _load(model, device, dtype, log)
    dev = handle.input_device
    arch = handle.arch
    layer = arch.num_layers // 2
    n_tokens = 8 if quick else 64
    reps = 1 if quick else 3
    # decode timings swing by a third between identical runs on a shared VM; five pairs steady the median
    decode_reps = 1 if quick else 5

    handle.layer_norms()  # measured once (cached on disk for real models); relative α needs it
    steer, vec, scale = _steer(handle, layer)
    weight_bytes = _weight_bytes(handle.model)
    bw = measure_bandwidth(handle, reps=3 if quick else 7)

    result: dict = {
        "model": handle.facts(),
        "quick": quick,
        "conditions": {
            "device": str(dev), "dtype": str(arch.unembedding.dtype).replace("torch.", ""),
            "torch_threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
            "torch": torch.__version__, "python": platform.python_version(), "machine": platform.machine(),
            "loadavg_start": load_before,
        },
        "weights": {"bytes": weight_bytes, "gb": weight_bytes / 1e9},
        "bandwidth": bw,
        "steering": {"layer": layer, "alpha_relative": 0.5, "alpha_raw": float(steer.scalar_alpha),
                     "layer_norm": scale, "vector": "seeded unit random direction (seed 0)"},
    }
    sections: dict[str, float] = {}

    def timed(name: str, fn):
        start = time.perf_counter()
        result[name] = fn()
        sections[name] = round(time.perf_counter() - start, 2)

    timed("side_by_side", lambda: bench_side_by_side(handle, steer, n_tokens, decode_reps, weight_bytes,
                                                      bw["read_gb_s"], log))
    timed("hook", lambda: bench_hook_overhead(handle, steer, 8 if quick else 16, 1 if quick else 8, log))
    timed("slider", lambda: bench_slider(handle, steer, layer, 5 if quick else 25, log, bw["read_gb_s"] * 1e9))
    timed("sweep", lambda: bench_sweep(handle, steer, steer.vector, layer, reps, log))
    timed("alpha_grid", lambda: bench_alpha_grid(handle, steer, layer, log, points=5 if quick else 41))
    # the app's footprint: model loaded, decoded, analysed (before the extra copies the modes below make)
    result["memory"] = {"rss_gb": _rss_bytes() / 1e9, "peak_rss_gb": _peak_rss_bytes() / 1e9,
                        "note": "peak RSS of this process after load, decode, slider and sweep"}
    timed("extract", lambda: bench_extract(handle, 16 if quick else None, 1, log))
    if quick:
        for name in ("cold_load", "training", "bf16_lm_head", "bf16_model"):
            result[name] = {"status": "skipped (--quick)"}
    else:
        timed("training", lambda: bench_training(handle, log))
        timed("bf16_lm_head", lambda: bench_bf16_lm_head(handle, 5, log))
        timed("bf16_model", lambda: bench_bf16_model(handle, steer, 32, bw["read_gb_s"] * 1e9, log))
        if (model or "").startswith("tiny:"):
            result["cold_load"] = {"status": "skipped: tiny models are built, not loaded"}
        else:
            timed("cold_load", lambda: bench_cold_load(model, device, dtype, log))
    result["memory"]["peak_rss_gb_end"] = _peak_rss_bytes() / 1e9
    result["section_seconds"] = sections

    ratios = {
        "side_by_side_speedup": result["side_by_side"]["side_by_side_speedup"],
        "decode_floor_fraction": result["side_by_side"]["decode_floor_fraction"],
        "slider_speedup": result["slider"]["slider_speedup"],
        "hook_overhead": result["hook"]["hook_overhead"],
        "sweep_speedup": result["sweep"]["sweep_speedup"],
        "extract_speedup": result["extract"].get("extract_speedup"),
        "warm_load_s": load["warm_load_s"] if load["cache_hit"] is not False else None,
        "cold_load_s": result["cold_load"].get("cold_load_s")
        if load["cache_hit"] is not False else load["warm_load_s"],
        "peak_rss_gb": result["memory"]["peak_rss_gb"],
    }
    result["load"] = load
    result["ratios"] = ratios
    result["targets"] = {k: f"{op} {v}" for k, (op, v) in TARGETS.items()}
    result["met"] = _verdicts(ratios)
    result["conditions"]["loadavg_end"] = _loadavg()
    result["seconds"] = time.perf_counter() - started
    return _clean(result)


def markdown_table(result: dict) -> str:
    """The headline ratios of a :func:`run_bench` result as a Markdown table (for the README)."""
    sbs, slider, sweep_, hook = result["side_by_side"], result["slider"], result["sweep"], result["hook"]
    extract = result.get("extract", {})
    rows = [
        ("side_by_side_speedup", result["ratios"]["side_by_side_speedup"],
         f"HF generate ×2: {sbs['hf_two_generate_calls_ms']:.0f} ms vs ours {sbs['ours_side_by_side_ms']:.0f} ms "
         f"({sbs['new_tokens']} tokens)"),
        ("decode_floor_fraction", result["ratios"]["decode_floor_fraction"],
         f"floor {sbs['floor_ms']:.1f} ms ({sbs['read_gb_s_during_run']:.1f} GB/s) vs step "
         f"{sbs['ours_ms_per_step']:.1f} ms; with the best bandwidth seen "
         f"({result['bandwidth']['read_gb_s']:.1f} GB/s): {sbs['decode_floor_fraction_best_bandwidth']:.2f}"),
        ("slider_speedup", result["ratios"]["slider_speedup"],
         f"naive {slider['naive_ms']:.1f} ms vs fast p50 {slider['fast_ms_p50']:.1f} / p95 "
         f"{slider['fast_ms_p95']:.1f} ms (one-row unembedding {slider['fast_unembed_ms']:.1f} ms, "
         f"blocks {slider['blocks_rerun']} {slider['fast_blocks_ms']:.1f} ms); whole view "
         f"{slider['next_token_view_slow_ms_p50']:.0f} → {slider['next_token_view_ms_p50']:.0f} ms "
         f"({slider['next_token_view_speedup']:.1f}×)"),
        ("hook_overhead", result["ratios"]["hook_overhead"],
         f"{hook['steered_ms_per_step']:.1f} vs {hook['unsteered_ms_per_step']:.1f} ms per step"),
        ("sweep_speedup", result["ratios"]["sweep_speedup"],
         f"21 calls {sweep_['separate_ms']:.0f} ms vs one sweep {sweep_['batched_ms']:.0f} ms"),
        ("extract_speedup", result["ratios"].get("extract_speedup"),
         f"{extract.get('rows', '?')} statements: {extract.get('one_at_a_time_ms', float('nan')):.0f} ms vs "
         f"{extract.get('batched_ms', float('nan')):.0f} ms" if extract.get("status") == "measured"
         else extract.get("status", "")),
        ("warm_load_s", result["ratios"]["warm_load_s"], "load_model() from the safetensors cache"),
        ("cold_load_s", result["ratios"].get("cold_load_s"), "GGUF → safetensors, fresh process, empty cache"),
        ("peak_rss_gb", result["ratios"]["peak_rss_gb"], "after load, decode, slider, sweep"),
    ]
    lines = ["| measure | value | target | met | absolute |", "|---|---|---|---|---|"]
    for name, value, note in rows:
        target = result["targets"].get(name, "")
        met = result["met"].get(name)
        shown = "n/a" if value is None else f"{value:.2f}"
        lines.append(f"| `{name}` | {shown} | {target} | {'' if met is None else ('yes' if met else 'no')} "
                     f"| {note} |")
    return "\n".join(lines)
