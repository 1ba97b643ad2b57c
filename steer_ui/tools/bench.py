"""The benchmark behind ``python -m steer_ui bench [--quick] --json``.

Shared machines are noisy, so every headline figure is a *ratio of two
timings taken in the same run*, each the median of several repetitions, with
the two sides interleaved (A, B, A, B, ...) so a burst of load hits both.
Absolute milliseconds are reported next to every ratio, together with the
load average before and after, so a reader can judge the conditions.

Headline ratios (targets from the performance issue):

* ``side_by_side_speedup``: two sequential ``model.generate()`` calls
  (unsteered, then steered by a forward hook, the app's own: how steering
  demos usually do it) ÷ one batched side-by-side decode (unsteered + steered +
  counterfactual rows), greedy, the same number of new tokens.
* ``decode_floor_fraction``: (weight bytes ÷ measured read bandwidth) ÷ our
  time per side-by-side decode step (all three rows).
* ``slider_speedup``: one full forward of a 32-token prompt with the hook and
  full logits ÷ the slider's fast path (:class:`~steer_ui.model.prefix.Prefix`).
* ``slider_two_terms_over_one``: the slider's whole next-token view with a
  second term at another block ÷ the same view with one term (issue #48).
* ``hook_overhead``: steered ÷ unsteered decode time per step.
* ``static_over_dynamic`` (no target): the static decode step (a CUDA graph
  on CUDA, eager elsewhere) ÷ the dynamic one, per step; the side-by-side
  section's ``decode_path`` says which of them the default (``auto``, or
  ``STEER_UI_DECODE``) ran.
* ``fused_over_dynamic`` (no target): the fused CPU step (each Gemma 3 block one C call,
  :mod:`steer_ui.model.fused_decode`) ÷ the dynamic one, per step, where the model takes it.
* ``sweep_speedup``: 21 separate fast-path calls ÷ one batched 21-α sweep.
* ``extract_speedup``: one-at-a-time ÷ batched activation extraction over the
  bundled statements.
* ``many_users_speedup``, ``many_users_exact``, ``slider_p95_load_over_idle_p50``:
  eight sessions' generations through the request batcher, and the slider
  while others generate (:mod:`.many_users`).
* ``many_prompts_speedup``: 16 prompts' side-by-side generations one after
  another ÷ the same 16 in one *Many prompts* comparison, which also
  computes every per-prompt measure (:func:`.many_users.bench_many_prompts`).
* ``openai_concurrency_speedup``, ``openai_speedup_over_locked``: 8 streamed
  ``/v1`` completions with 8 steerings (one unsteered) one after another, and
  served one at a time behind a lock as saklas serves them, each ÷ the same 8
  at once (:mod:`.openai_bench`; issue #49).
* ``vs_llama_cpp``, ``one_sequence_vs_llama_cpp``: our side-by-side step, and our steered-only step (what an
  API client gets), each over llama.cpp's steered token on the same GGUF, prompt and threads; and
  ``batch8_vs_llama_cpp``: eight sequences with eight steerings decoded together in one of our batches over
  llama.cpp decoding the same eight prompts in one batch with one control vector, wall time (issue #50;
  :mod:`.vs_llama_cpp`, where ``llama_cpp`` is installed).
* ``max_abs_delta_prob_vs_float32``: the accuracy cost of the model's dtype,
  max |Δ probability| of the next token against the same model in float32
  on fixed prompts (0 for a float32 model; ``--dtype bfloat16`` measures it on
  a CPU too).

``--model random:llama-8b`` (or ``random:llama-1b``) with ``--device cuda``
runs the same benchmark on a model of that real shape with random weights
built on the GPU (see :mod:`steer_ui.tiny`), so GPU figures need no download.

``--quick`` (CI's smoke run) uses fewer tokens and repetitions and skips the
cold GGUF load, the training times and the bfloat16 modes.  Nothing here
asserts a timing: the JSON reports, the reader judges.

This module holds the run and the report (:func:`run_bench`,
:func:`markdown_table`); the measurements are in :mod:`.measures` and the
timing helpers in :mod:`.timing`.
"""
from __future__ import annotations

import math
import os
import platform
import time
from pathlib import Path
from typing import Callable

import torch

from ..methods.common import clean
from ..model.loading import BUILT_PREFIXES, EMBEDDED, embedded_gguf_path, gguf_cache_dir, load_model
from .measures import (bench_alpha_grid, bench_bf16_lm_head, bench_bf16_model, bench_cold_load, bench_decode_paths,
                       bench_dtype_accuracy, bench_extract, bench_hook_overhead, bench_side_by_side, bench_slider,
                       bench_greedy_vs_float32, bench_sweep, bench_training, bench_vs_float32, float32_reference,
                       measure_bandwidth, seeded_steer)
from .many_users import bench_many_prompts, bench_many_users
from .openai_bench import bench_openai
from .timing import loadavg, parameter_bytes, peak_rss_bytes, rss_bytes
from .vs_llama_cpp import bench_batch8_vs_llama_cpp, bench_vs_llama_cpp

# name: (comparison, target), on a CPU with the embedded model (float32); issue #20's figures
TARGETS = {
    "side_by_side_speedup": (">=", 1.8),
    "decode_floor_fraction": (">=", 0.45),
    "slider_speedup": (">=", 4.0),
    "slider_two_terms_over_one": ("<=", 1.5),  # issue #48: the whole view with a second term at another block
    "hook_overhead": ("<=", 1.03),
    "sweep_speedup": (">=", 2.0),
    "extract_speedup": (">=", 3.0),
    "warm_load_s": ("<=", 10.0),
    "peak_rss_gb": ("<=", 3.0),
    "many_users_speedup": (">=", 3.0),
    "many_users_exact": (">=", 8),
    "slider_p95_load_over_idle_p50": ("<=", 2.0),
    # issue #31 set 4 against the float32 one-at-a-time path; #50 restated it as 3 against the int8 one
    "many_prompts_speedup": (">=", 3.0),
    "openai_concurrency_speedup": (">=", 3.0),  # issue #49: 8 /v1 streams with 8 steerings at once
    # llama.cpp on the same GGUF, where llama_cpp is installed (issue #50; #37 had set vs_llama_cpp <= 2): our
    # side-by-side step, and our steered-only step, over its steered token; eight sequences with eight steerings
    # in one of our batches over its one batch of the same eight with one control vector, wall time
    "vs_llama_cpp": ("<=", 1.0),
    "one_sequence_vs_llama_cpp": ("<=", 0.8),
    "batch8_vs_llama_cpp": ("<=", 1.0),
}
# On a GPU (issue #20, an 8B-shaped model in bfloat16): a captured decode step should come nearer the weights'
# read time than a CPU's, and the batched side-by-side should beat two hooked generate() calls by more.
# Issue #51 adds: 8 of 8 sequences (4 prompts, unsteered and steered, 32 tokens) greedy-equal to a float32 eager
# reference, or parted only where the reference's margin lies inside the dtype's logit error there.
GPU_TARGETS = {**TARGETS, "decode_floor_fraction": (">=", 0.6), "side_by_side_speedup": (">=", 2.5),
               "many_users_speedup": (">=", 6.0), "greedy_equal_or_explained": (">=", 8)}
# Sections a run can leave out (``--skip``): the long ones that time no decode path
SKIPPABLE = ("training", "extract", "bf16_lm_head", "bf16_model", "cold_load", "alpha_grid", "vs_float32",
             "many_prompts", "openai")


def targets_for(device_type: str) -> dict:
    """The targets a run on this kind of device is judged against."""
    return GPU_TARGETS if device_type == "cuda" else TARGETS


# ------------------------------------------------------------------ setup
def _load(model: str | None, device: str, dtype: str, log, weights: str = "auto"):
    """(handle, load facts).  ``tiny:FAMILY`` and ``random:SHAPE`` build random models (tests, CI, GPU runs)."""
    source = model or EMBEDDED
    if source.startswith(BUILT_PREFIXES):
        start = time.perf_counter()
        handle = load_model(source, device=device, dtype=dtype, weights=weights)
        return handle, {"warm_load_s": time.perf_counter() - start, "cache_hit": None, "source": source}
    cache_hit = None
    if source == EMBEDDED or source.endswith(".gguf"):
        gguf = embedded_gguf_path() if source == EMBEDDED else Path(source).expanduser()
        cache_hit = gguf_cache_dir(gguf).is_dir() if gguf.is_file() else None
    log(f"bench: loading {source} ({'warm' if cache_hit else 'cold' if cache_hit is False else 'direct'})")
    start = time.perf_counter()
    handle = load_model(source, device=device, dtype=dtype, weights=weights)
    return handle, {"warm_load_s": time.perf_counter() - start, "cache_hit": cache_hit, "source": source}


# ------------------------------------------------------------------ the run
def _verdicts(ratios: dict, targets: dict) -> dict:
    out = {}
    for name, (op, target) in targets.items():
        value = ratios.get(name)
        if value is None or (isinstance(value, float) and not math.isfinite(value)):
            out[name] = None
        else:
            out[name] = bool(value >= target) if op == ">=" else bool(value <= target)
    return out


def run_bench(model: str | None = None, device: str = "auto", dtype: str = "auto", quick: bool = False,
              log: Callable[[str], None] = print, weights: str = "auto", skip: tuple[str, ...] = (),
              partial: Callable[[dict], None] | None = None) -> dict:
    """Run the benchmark; return one JSON-ready dict (ratios, absolute ms, targets, conditions).

    ``model``: None/'embedded' (Gemma 3 270M), any ``load_model`` source, or
    ``tiny:FAMILY``.  ``quick``: the CI smoke run (fewer tokens and
    repetitions; no cold load, training or bfloat16 modes).  ``skip``:
    sections of :data:`SKIPPABLE` to leave out (a GPU lease is short).
    ``partial``: called with the result so far after every section, so a run
    cut off by a time limit still leaves what it measured.
    """
    unknown = sorted(set(skip) - set(SKIPPABLE))
    if unknown:
        raise ValueError(f"cannot skip {', '.join(unknown)}: the sections that can be left out are "
                         f"{', '.join(SKIPPABLE)}")
    started = time.perf_counter()
    load_before = loadavg()
    handle, load = _load(model, device, dtype, log, weights)
    dev = handle.input_device
    arch = handle.arch
    layer = arch.num_layers // 2
    n_tokens = 8 if quick else 64
    reps = 1 if quick else 3
    # decode timings swing by a third between identical runs on a shared VM; five pairs steady the median
    decode_reps = 1 if quick else 5

    handle.layer_norms()  # measured once (cached on disk for real models); relative α needs it
    steer, scale = seeded_steer(handle, layer)
    weight_bytes = parameter_bytes(handle.model)
    bw = measure_bandwidth(handle, reps=3 if quick else 7)

    result: dict = {
        "model": handle.facts(),
        "quick": quick,
        "conditions": {
            "device": str(dev), "dtype": str(handle.dtype).replace("torch.", ""), "weights": handle.weights,
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
        if name in skip:
            result[name] = {"status": "skipped (--skip)"}
            return
        start = time.perf_counter()
        result[name] = fn()
        sections[name] = round(time.perf_counter() - start, 2)
        if partial is not None:
            partial(clean({**result, "section_seconds": sections, "incomplete": True}))

    timed("side_by_side", lambda: bench_side_by_side(handle, steer, n_tokens, decode_reps, weight_bytes,
                                                      bw["read_gb_s"], log))
    timed("llama_cpp", lambda: bench_vs_llama_cpp(handle, steer, n_tokens, decode_reps, log))
    timed("llama_cpp_batch8", lambda: bench_batch8_vs_llama_cpp(handle, layer, 8 if quick else 32, reps, log))
    timed("hook", lambda: bench_hook_overhead(handle, steer, 8 if quick else 16, 1 if quick else 8, log))
    timed("decode_paths", lambda: bench_decode_paths(handle, steer, 8 if quick else 32, 1 if quick else 4, log))
    timed("slider", lambda: bench_slider(handle, steer, layer, 5 if quick else 25, log, bw["read_gb_s"] * 1e9))
    timed("sweep", lambda: bench_sweep(handle, steer, steer.vector, layer, reps, log))
    timed("alpha_grid", lambda: bench_alpha_grid(handle, steer, layer, log, points=5 if quick else 41))
    timed("many_users", lambda: bench_many_users(handle, layer, 8 if quick else 32, 1 if quick else 3, log,
                                                 moves=5 if quick else 20))
    timed("many_prompts", lambda: bench_many_prompts(handle, layer, 8 if quick else 32, 1 if quick else 3, log))
    timed("openai", lambda: bench_openai(handle, layer, 8 if quick else 32, 1 if quick else 3, log))
    # the app's footprint: model loaded, decoded, analysed (before the extra copies the modes below make)
    result["memory"] = {"rss_gb": rss_bytes() / 1e9, "peak_rss_gb": peak_rss_bytes() / 1e9,
                        "note": "peak RSS of this process after load, decode, slider and sweep"}
    timed("vs_float32", lambda: bench_vs_float32(handle, steer, 8 if quick else 32, 1 if quick else 3, log))
    timed("extract", lambda: bench_extract(handle, 16 if quick else None, 1, log))
    with float32_reference(handle, log) as reference:
        timed("dtype_accuracy", lambda: bench_dtype_accuracy(handle, reference, log))
        timed("greedy_vs_float32", lambda: bench_greedy_vs_float32(handle, reference, steer, 8 if quick else 32,
                                                                   log))
    if quick:
        for name in ("cold_load", "training", "bf16_lm_head", "bf16_model"):
            result[name] = {"status": "skipped (--quick)"}
    else:
        timed("training", lambda: bench_training(handle, log))
        timed("bf16_lm_head", lambda: bench_bf16_lm_head(handle, 5, log))
        timed("bf16_model", lambda: bench_bf16_model(handle, steer, 32, bw["read_gb_s"] * 1e9, log))
        if (model or "").startswith(BUILT_PREFIXES) and "cold_load" not in skip:
            result["cold_load"] = {"status": "skipped: random models are built, not loaded"}
        else:
            timed("cold_load", lambda: bench_cold_load(model, device, dtype, log, weights))
    result["memory"]["peak_rss_gb_end"] = peak_rss_bytes() / 1e9
    result["section_seconds"] = sections

    ratios = {
        "side_by_side_speedup": result["side_by_side"]["side_by_side_speedup"],
        # over llama.cpp's steered token: our side-by-side step, our steered-only step; eight sequences in one
        # batch each side, wall over wall (issue #50); None without llama_cpp
        "vs_llama_cpp": result["llama_cpp"].get("vs_llama_cpp"),
        "one_sequence_vs_llama_cpp": result["llama_cpp"].get("one_sequence_vs_llama_cpp"),
        "batch8_vs_llama_cpp": result["llama_cpp_batch8"].get("batch8_vs_llama_cpp"),
        "decode_floor_fraction": result["side_by_side"]["decode_floor_fraction"],
        "slider_speedup": result["slider"]["slider_speedup"],
        "slider_two_terms_over_one": result["slider"]["slider_two_terms_over_one"],
        "hook_overhead": result["hook"]["hook_overhead"],
        "static_over_dynamic": result["decode_paths"]["static_over_dynamic"],
        "fused_over_dynamic": result["decode_paths"].get("fused_over_dynamic"),
        "sweep_speedup": result["sweep"]["sweep_speedup"],
        "extract_speedup": result["extract"].get("extract_speedup"),
        "warm_load_s": load["warm_load_s"] if load["cache_hit"] is not False else None,
        "cold_load_s": result["cold_load"].get("cold_load_s")
        if load["cache_hit"] is not False else load["warm_load_s"],
        "peak_rss_gb": result["memory"]["peak_rss_gb"],
        "many_users_speedup": result["many_users"]["many_users_speedup"],
        "many_users_exact": result["many_users"]["many_users_exact"],
        "slider_p95_load_over_idle_p50": result["many_users"]["slider_p95_load_over_idle_p50"],
        "many_prompts_speedup": result["many_prompts"].get("many_prompts_speedup"),
        # issue #49: 8 /v1 streams one after another over the same 8 at once; and the 8 served one at a time
        # behind a lock (saklas's way) over the same 8 at once
        "openai_concurrency_speedup": result["openai"].get("openai_concurrency_speedup"),
        "openai_speedup_over_locked": result["openai"].get("openai_speedup_over_locked"),
        # the accuracy cost of the model's dtype (0 in float32); no target, the reader weighs it against speed
        "max_abs_delta_prob_vs_float32": result["dtype_accuracy"]["max_abs_delta_prob"],
        # issue #51: of the sequences decoded greedily, those equal to the float32 eager reference or parted
        # only at a near tie (None for int8 weights)
        "greedy_equal_or_explained": result["greedy_vs_float32"].get("equal_or_explained"),
        # the precision's decode step against float32's, same run (#37); None for a float32 model
        "step_speedup_vs_float32": result["vs_float32"].get("step_speedup"),
    }
    result["load"] = load
    result["ratios"] = ratios
    targets = targets_for(handle.device.type)
    result["targets"] = {k: f"{op} {v}" for k, (op, v) in targets.items()}
    result["met"] = _verdicts(ratios, targets)
    result["conditions"]["loadavg_end"] = loadavg()
    result["seconds"] = time.perf_counter() - started
    return clean(result)


def markdown_table(result: dict) -> str:
    """The headline ratios of a :func:`run_bench` result as a Markdown table (for docs/bench.md)."""
    sbs, slider, sweep_, hook = result["side_by_side"], result["slider"], result["sweep"], result["hook"]
    extract = result.get("extract", {})
    users = result["many_users"]
    prompts = result["many_prompts"]
    api = result.get("openai", {})
    paths = result["decode_paths"]
    rows = [  # (measure, what it was measured from); its value is result['ratios'][measure]
        ("side_by_side_speedup",
         f"HF generate ×2: {sbs['hf_two_generate_calls_ms']:.0f} ms vs ours {sbs['ours_side_by_side_ms']:.0f} ms "
         f"({sbs['new_tokens']} tokens)"),
        ("decode_floor_fraction",
         f"floor {sbs['floor_ms']:.1f} ms ({sbs['read_gb_s_during_run']:.1f} GB/s) vs step "
         f"{sbs['ours_ms_per_step']:.1f} ms; with the best bandwidth seen "
         f"({sbs['read_gb_s_best']:.1f} GB/s): {sbs['decode_floor_fraction_best_bandwidth']:.2f}"),
        ("slider_speedup",
         f"naive {slider['naive_ms']:.1f} ms vs fast p50 {slider['fast_ms_p50']:.1f} / p95 "
         f"{slider['fast_ms_p95']:.1f} ms (one-row unembedding {slider['fast_unembed_ms']:.1f} ms, "
         f"blocks {slider['blocks_rerun']} {slider['fast_blocks_ms']:.1f} ms); whole view "
         f"{slider['next_token_view_slow_ms_p50']:.0f} → {slider['next_token_view_ms_p50']:.0f} ms "
         f"({slider['next_token_view_speedup']:.1f}×)"),
        ("slider_two_terms_over_one",
         f"whole view, terms at blocks {slider['two_terms_layers'][0]} and {slider['two_terms_layers'][1]}: "
         f"{slider['next_token_view_two_terms_ms_p50']:.1f} ms vs one term "
         f"{slider['next_token_view_one_term_ms_p50']:.1f} ms (p50, interleaved)"),
        ("hook_overhead",
         f"{hook['steered_ms_per_step']:.1f} vs {hook['unsteered_ms_per_step']:.1f} ms per step"),
        ("static_over_dynamic",
         f"static step ({result['decode_paths']['static_path']['path']}) "
         f"{result['decode_paths']['static_ms_per_step']:.1f} ms vs dynamic "
         f"{result['decode_paths']['dynamic_ms_per_step']:.1f} ms; per pair "
         f"{', '.join(f'{x:.2f}' for x in result['decode_paths']['static_over_dynamic_per_pair'])}"),
        ("fused_over_dynamic",
         f"fused step {paths['fused_ms_per_step']:.1f} ms vs dynamic {paths['dynamic_ms_per_step']:.1f} ms; per "
         f"repetition {', '.join(f'{x:.2f}' for x in paths['fused_over_dynamic_per_pair'])}; the two paths' tokens "
         f"{'equal' if paths['fused_tokens_equal'] else 'differ'}" if "fused_ms_per_step" in paths
         else "the model does not take the fused step"),
        ("sweep_speedup",
         f"21 calls {sweep_['separate_ms']:.0f} ms vs one sweep {sweep_['batched_ms']:.0f} ms"),
        ("extract_speedup",
         f"{extract.get('rows', '?')} statements: {extract.get('one_at_a_time_ms', float('nan')):.0f} ms vs "
         f"{extract.get('batched_ms', float('nan')):.0f} ms" if extract.get("status") == "measured"
         else extract.get("status", "")),
        ("warm_load_s", "load_model() from the safetensors cache"),
        ("cold_load_s", "GGUF → safetensors, fresh process, empty cache"),
        ("peak_rss_gb", "after load, decode, slider, sweep"),
        ("many_users_speedup",
         f"8 generations of {users['new_tokens']} tokens: one after another {users['sequential_ms']:.0f} ms vs "
         f"at once {users['concurrent_ms']:.0f} ms"),
        ("many_users_exact",
         "of 8 concurrent results equal to their solo results (tokens; probabilities within 1e-5)"),
        ("slider_p95_load_over_idle_p50",
         f"slider p95 {users['slider_p95_under_load_ms']:.0f} ms while 4 sessions generate vs idle p50 "
         f"{users['slider_p50_idle_ms']:.0f} ms"),
        ("many_prompts_speedup",
         f"{prompts['prompts']} prompts × {prompts['new_tokens']} tokens: one after another "
         f"{prompts['sequential_ms']:.0f} ms vs one comparison {prompts['comparison_ms']:.0f} ms "
         f"(its generations alone {prompts['comparison_generation_ms']:.0f} ms, {prompts['in_flight']} in flight)"
         if "comparison_ms" in prompts else prompts.get("status", "")),
        ("openai_concurrency_speedup",
         f"{api['clients']} /v1 streams of {api['new_tokens']} tokens, {api['clients']} steerings (one unsteered): "
         f"one after another {api['sequential_ms']:.0f} ms vs at once {api['concurrent_ms']:.0f} ms; "
         f"{api['openai_exact']} of {api['clients']} equal" if "concurrent_ms" in api else api.get("status", "")),
        ("openai_speedup_over_locked",
         f"the same {api['clients']} at once, served one at a time behind a lock (as saklas serves them): "
         f"{api['locked_ms']:.0f} ms" if "locked_ms" in api else api.get("status", "")),
        ("max_abs_delta_prob_vs_float32",
         f"{result['dtype_accuracy']['dtype']} vs float32 next-token probabilities, "
         f"{result['dtype_accuracy']['prompts']} prompts, top-1 agree {result['dtype_accuracy']['top1_agree']}"),
    ]
    greedy = result.get("greedy_vs_float32", {})
    if greedy.get("status") == "measured":
        rows.append(("greedy_equal_or_explained",
                     f"of {greedy['sequences']} greedy sequences ({greedy['prompts']} prompts × unsteered, steered; "
                     f"{greedy['new_tokens']} tokens, {greedy['decode_path']['path']}) against float32 eager: "
                     f"{greedy['equal']} equal, the rest parted at a margin inside the dtype's logit error"))
    llama, versus = result.get("llama_cpp", {}), result.get("vs_float32", {})
    llama8 = result.get("llama_cpp_batch8", {})
    against = []  # the llama.cpp rows, under side_by_side_speedup
    if llama.get("status") == "measured":
        theirs = (f"llama.cpp {llama['llama_cpp_version']}'s steered token "
                  f"{llama['llama_cpp_steered_ms_per_token']:.1f} ms ({llama['threads']} threads, same GGUF, prompt "
                  f"and {llama['new_tokens']} tokens)")
        against += [("vs_llama_cpp", f"our side-by-side step {llama['ours_ms_per_step']:.1f} ms vs {theirs}"),
                    ("one_sequence_vs_llama_cpp",
                     f"our steered-only step {llama['ours_steered_only_ms_per_step']:.1f} ms vs {theirs}")]
    if llama8.get("status") == "measured":
        against.append(("batch8_vs_llama_cpp",
                        f"{llama8['sequences']} sequences × {llama8['new_tokens']} tokens in one batch: ours "
                        f"({llama8['sequences']} steerings) {llama8['ours_ms']:.0f} ms vs llama.cpp (one control "
                        f"vector) {llama8['llama_cpp_ms']:.0f} ms, prompt passes included"))
    rows[1:1] = against
    if versus.get("status") == "measured":
        rows.append(("step_speedup_vs_float32",
                     f"{versus['weights']} step {versus['ms_per_step']:.1f} ms vs float32 "
                     f"{versus['float32_ms_per_step']:.1f} ms ({versus['new_tokens']} tokens, runs alternated); "
                     f"one-row unembedding {versus['one_row_unembedding_ms']:.1f} vs "
                     f"{versus['float32_one_row_unembedding_ms']:.1f} ms; same texts: "
                     f"{'yes' if versus['texts_equal'] else 'no'}"))
    lines = ["| measure | value | target | met | absolute |", "|---|---|---|---|---|"]
    for name, note in rows:
        value = result["ratios"].get(name)
        target = result["targets"].get(name, "")
        met = result["met"].get(name)
        shown = "n/a" if value is None else f"{value:.2g}" if 0 < abs(value) < 0.01 else f"{value:.2f}"
        lines.append(f"| `{name}` | {shown} | {target} | {'' if met is None else ('yes' if met else 'no')} "
                     f"| {note} |")
    return "\n".join(lines)
