"""The benchmark's smoke run on a tiny model, and the fast paths it measures.

No timing assertions: the numbers must exist and be finite, and the fast
paths must give the same answers as the slow ones.
"""
import json
import math

import pytest
import torch

from steer_ui.tools.bench import TARGETS, _verdicts, markdown_table, run_bench, targets_for
from steer_ui.model.architecture import _UNEMBED_KERNEL, kernel_key, unembed
from steer_ui.model.generation import Sampling, side_by_side
from steer_ui.model.hooks import Steer


@pytest.fixture(scope="module")
def quick_result():
    messages = []
    result = run_bench(model="tiny:llama", device="cpu", quick=True, log=messages.append)
    assert messages, "the benchmark reports progress through log"
    return result


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def test_quick_run_reports_every_ratio_as_a_finite_number(quick_result):
    ratios = quick_result["ratios"]
    for name in ("side_by_side_speedup", "decode_floor_fraction", "slider_speedup", "slider_two_terms_over_one",
                 "hook_overhead", "sweep_speedup", "extract_speedup", "warm_load_s", "peak_rss_gb"):
        assert _finite(ratios[name]) and ratios[name] > 0, (name, ratios[name])
    assert set(quick_result["met"]) == set(TARGETS)
    assert all(v in (True, False, None) for v in quick_result["met"].values())
    # one JSON object, no NaN
    json.dumps(quick_result, allow_nan=False)


def test_a_cuda_run_is_judged_against_the_gpu_targets_and_a_cpu_run_against_the_cpu_ones(quick_result):
    ratios = {"decode_floor_fraction": 0.5, "side_by_side_speedup": 2.0}
    assert _verdicts(ratios, targets_for("cpu"))["decode_floor_fraction"] is True
    assert _verdicts(ratios, targets_for("cuda"))["decode_floor_fraction"] is False
    assert _verdicts(ratios, targets_for("cuda"))["side_by_side_speedup"] is False
    assert quick_result["targets"]["decode_floor_fraction"] == ">= 0.45"  # the tiny model ran on the CPU


def test_quick_run_absolute_numbers_and_conditions(quick_result):
    sbs = quick_result["side_by_side"]
    for key in ("hf_two_generate_calls_ms", "ours_side_by_side_ms", "ours_ms_per_step", "floor_ms"):
        assert _finite(sbs[key]) and sbs[key] > 0, key
    assert quick_result["bandwidth"]["read_gb_s"] > 0
    # the strict floor and the bandwidth the table names beside it are the same number
    best = sbs["read_gb_s_best"]
    assert best >= max(quick_result["bandwidth"]["read_gb_s"], sbs["read_gb_s_during_run"]) * (1 - 1e-9)
    assert sbs["floor_ms_best_bandwidth"] == pytest.approx(quick_result["weights"]["bytes"] / (best * 1e9) * 1e3,
                                                           rel=1e-3, abs=6e-4)  # ms are rounded to 0.001
    assert quick_result["weights"]["bytes"] > 0
    slider = quick_result["slider"]
    assert slider["fast_ms_p95"] >= slider["fast_ms_p50"] > 0
    # the decomposition: unembedding + later blocks; blocks re-run on every prompt position
    assert slider["fast_unembed_ms"] > 0 and slider["fast_blocks_ms"] >= 0
    assert slider["fast_unembed_floor_ms"] > 0 and slider["slider_speedup_if_blocks_were_free"] > 0
    assert slider["blocks_rerun"].endswith(f"on {slider['prompt_tokens']} positions")
    # the whole view with two terms (issue #48): both medians measured, the second term at another block
    for key in ("next_token_view_one_term_ms_p50", "next_token_view_two_terms_ms_p50"):
        assert _finite(slider[key]) and slider[key] > 0, key
    assert quick_result["ratios"]["slider_two_terms_over_one"] == slider["slider_two_terms_over_one"]
    first, second = slider["two_terms_layers"]
    assert first == slider["layer"] and second != first
    assert "slider_two_terms_over_one" in quick_result["met"]
    assert quick_result["conditions"]["torch_threads"] >= 1
    assert quick_result["training"]["status"].startswith("skipped")
    assert quick_result["cold_load"]["status"].startswith("skipped")


def test_quick_run_fast_paths_agree_with_reference(quick_result):
    # the slider's fast path gives the naive full forward's logits
    assert quick_result["slider"]["max_abs_logit_diff_vs_naive"] < 1e-3
    # ... and with two terms the fast whole view is the slow one's (two full forwards)
    assert quick_result["slider"]["two_terms_view_same_top_k_as_slow"] is True
    assert quick_result["slider"]["two_terms_view_max_abs_delta_prob"] < 1e-5
    # the batched sweep picks the same top-1 tokens as 21 single calls
    assert quick_result["sweep"]["top1_agree"] is True
    # our rows decode what HF generate decodes, unsteered and steered by the same hook
    assert quick_result["side_by_side"]["unsteered_tokens_match_hf"] is True
    assert quick_result["side_by_side"]["steered_tokens_match_hf"] is True
    extract = quick_result["extract"]
    if extract.get("status") == "measured":
        assert extract["max_rel_diff"] < 1e-3
    grid = quick_result["alpha_grid"]
    if grid.get("status") == "measured":
        assert grid["max_abs_delta_prob_vs_direct"] < 1e-4


@pytest.mark.parametrize("rows", [1, 2, 3, 5])
def test_unembed_picks_a_kernel_and_matches_linear(rows):
    torch.manual_seed(0)
    w = torch.randn(20000, 32)
    flat = torch.randn(rows, 32)
    ref = flat @ w.T
    with torch.inference_mode():
        first = unembed(w, flat)
        again = unembed(w, flat)
    torch.testing.assert_close(first, ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(again, first, atol=0, rtol=0)  # the remembered kernel is reused
    assert kernel_key(w, rows) in _UNEMBED_KERNEL


@pytest.mark.parametrize("family", ["llama", "gemma2", "gpt2"])
def test_logits_at_equals_full_logits(tiny, family):
    handle = tiny(family)
    arch = handle.arch
    torch.manual_seed(1)
    normed = torch.randn(3, arch.hidden_size)
    ids = torch.tensor([5, 100, 259])
    full = arch.logits(normed)
    picked = arch.logits_at(normed, ids)
    torch.testing.assert_close(picked, full[torch.arange(3), ids], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("positions", ["prompt", "generated"])
def test_shared_prefill_matches_full_forward(tiny, positions):
    """The prompt pass computes only distinct rows; the first tokens still match a full forward."""
    from steer_ui.model.analysis import naive_logits

    handle = tiny("qwen2")
    torch.manual_seed(2)
    v = torch.randn(64)
    steer = Steer(layer=1, vector=v, alpha=8.0, positions=positions)
    result = side_by_side(handle, "shared prefill", [steer], Sampling(max_new_tokens=4, stop_at_eos=False))
    first = result.steered.tokens[0]
    plain = naive_logits(handle, "shared prefill", [])[0].log_softmax(-1)
    if positions == "prompt":
        # naive_logits treats every position as a prompt position
        ref = naive_logits(handle, "shared prefill", [steer])[0].log_softmax(-1)
    else:
        ref = plain  # generated-only steering leaves the first token's distribution untouched
    assert first.token_id == int(ref.argmax())
    assert first.logprob == pytest.approx(float(ref[first.token_id]), abs=1e-4)
    assert result.unsteered.tokens[0].token_id == int(plain.argmax())
    if positions == "generated":
        assert first.delta_logit == pytest.approx(0.0, abs=1e-4)


def test_markdown_table_lists_every_headline(quick_result):
    from steer_ui.tools.bench import markdown_table

    table = markdown_table(quick_result)
    for name in ("side_by_side_speedup", "decode_floor_fraction", "slider_speedup", "slider_two_terms_over_one",
                 "hook_overhead", "sweep_speedup", "extract_speedup", "warm_load_s", "peak_rss_gb"):
        assert f"`{name}`" in table
    assert "nan" not in table.lower()


def test_hf_baseline_steers_through_the_app_hook_and_leaves_none(tiny):
    """The HF ``generate`` baseline is steered by ``hooks.steering``: same tokens as our steered row, no hook left."""
    from steer_ui.model.generation import encode_prompt
    from steer_ui.model.hooks import hook_count
    from steer_ui.tools.measures import GENERATION_PROMPT, _hf_generate, _ours, seeded_steer

    handle = tiny("llama")
    steer, _ = seeded_steer(handle, 1)
    ids = encode_prompt(handle, GENERATION_PROMPT)
    _, unsteered = _hf_generate(handle, ids, 6)
    _, steered = _hf_generate(handle, ids, 6, steer)
    assert hook_count(handle) == 0
    assert steered != unsteered
    _, _, ours = _ours(handle, GENERATION_PROMPT, [steer], 6)
    assert [t.token_id for t in ours.steered.tokens] == steered


def test_bench_does_not_import_the_cli():
    """tools -> cli -> tools would be a cycle: the benchmark builds its training calls through steer_ui.methods."""
    import subprocess
    import sys

    code = "import sys, steer_ui.tools.bench; assert 'steer_ui.cli' not in sys.modules, 'cli imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_quick_run_many_users_share_batches_and_match_solo(quick_result):
    users = quick_result["many_users"]
    assert users["many_users_exact"] == 8  # every concurrent result equals its solo result
    # ... with the kinds of request mixed: unsteered, one term, several terms, chat (issue #48)
    assert {"unsteered", "one term", "several terms", "chat", "chat, prompt steered"} == set(users["kinds"])
    assert users["engine"]["peak_requests"] > 1  # the eight really decoded together
    assert users["slider_p50_under_load_ms"] > 0 and users["slider_p95_idle_ms"] >= users["slider_p50_idle_ms"]
    # a move under load is its wait for the decode's turn and its own pass
    assert 0 <= users["slider_wait_p50_under_load_ms"] <= users["slider_p95_under_load_ms"]
    assert 0 < users["slider_run_p50_under_load_ms"] <= users["slider_p95_under_load_ms"]
    assert 0 < users["slider_run_p50_idle_ms"] <= users["slider_p95_idle_ms"]


def test_quick_run_measures_many_prompts_against_one_after_another(quick_result):
    prompts = quick_result["many_prompts"]
    assert prompts["prompts"] == 16 and prompts["in_flight"] >= 1
    assert prompts["sequential_ms"] > 0 and prompts["comparison_ms"] >= prompts["comparison_generation_ms"] > 0
    assert quick_result["ratios"]["many_prompts_speedup"] == prompts["many_prompts_speedup"]
    assert "many_prompts_speedup" in quick_result["met"]


def test_an_int8_run_compares_itself_with_float32_in_the_same_run():
    """Issue #37: a precision other than float32 is timed beside a float32 copy, and says so."""
    partials = []
    result = run_bench(model="tiny:llama", device="cpu", quick=True, weights="int8", log=lambda _m: None,
                       skip=("many_prompts", "alpha_grid", "extract"), partial=partials.append)
    assert result["conditions"]["weights"] == "int8" and result["model"]["weights"] == "int8"
    # --skip leaves sections out and says so; the result so far is handed over after every section (--out)
    assert all(result[name] == {"status": "skipped (--skip)"} for name in ("many_prompts", "alpha_grid", "extract"))
    assert result["ratios"]["many_prompts_speedup"] is None and "incomplete" not in result
    assert len(partials) == len(result["section_seconds"]) and all(p["incomplete"] for p in partials)
    assert "side_by_side" in partials[0] and "many_users" not in partials[0]
    assert "skipped (--skip)" in markdown_table(result)
    assert result["greedy_vs_float32"]["status"].startswith("skipped")  # int8's cost is measured at load
    versus = result["vs_float32"]
    assert versus["status"] == "measured" and versus["weights"] == "int8"
    assert _finite(versus["ms_per_step"]) and _finite(versus["float32_ms_per_step"])
    assert _finite(result["ratios"]["step_speedup_vs_float32"])
    assert result["dtype_accuracy"]["max_abs_delta_prob"] > 0  # rounded per row: a measured, non-zero cost
    assert result["llama_cpp"]["status"].startswith("skipped")  # tiny models are built, not GGUF
    assert result["met"]["vs_llama_cpp"] is None
    json.dumps(result, allow_nan=False)


def test_bench_refuses_an_unknown_section_to_skip_in_one_json_line(capsys):
    from steer_ui.cli import main

    code = main(["bench", "--model", "tiny:llama", "--skip", "training,decode", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 2 and "decode" in out["error"] and "\n" not in out["error"]


def test_quick_run_serves_eight_api_streams_at_once_each_its_own_answer(quick_result):
    """Issue #49's line: 8 /v1 streams with 8 steerings, one after another, at once and behind a lock; the
    concurrent answers are the one-after-another ones, and each steered-only stream was one row of the batch."""
    api = quick_result["openai"]
    assert api["openai_exact"] == 8
    for name in ("openai_concurrency_speedup", "openai_speedup_over_locked"):
        assert _finite(quick_result["ratios"][name]) and quick_result["ratios"][name] > 0
    assert api["engine"]["peak_requests"] == 8 and api["engine"]["mean_rows_per_step"] <= 3
    assert "openai_concurrency_speedup" in markdown_table(quick_result)


def test_markdown_table_shows_the_llama_cpp_rows_with_their_milliseconds_once_measured(quick_result):
    """Issue #50: beside vs_llama_cpp, our steered-only step and a batch of eight against llama.cpp's, each with
    its absolute times; where llama.cpp did not run (a tiny model is no GGUF) the sections say why, no row."""
    import copy

    for section in ("llama_cpp", "llama_cpp_batch8"):
        assert quick_result[section]["status"].startswith("skipped: "), quick_result[section]
    assert "_vs_llama_cpp`" not in markdown_table(quick_result)
    assert quick_result["targets"]["vs_llama_cpp"] == "<= 1.0"
    assert quick_result["targets"]["one_sequence_vs_llama_cpp"] == "<= 0.8"
    assert quick_result["targets"]["batch8_vs_llama_cpp"] == "<= 1.0"
    measured = copy.deepcopy(quick_result)
    measured["llama_cpp"] = {"status": "measured", "llama_cpp_version": "0.3.36", "threads": 2, "new_tokens": 64,
                             "llama_cpp_steered_ms_per_token": 11.0, "ours_ms_per_step": 14.5,
                             "ours_steered_only_ms_per_step": 8.5}
    measured["llama_cpp_batch8"] = {"status": "measured", "sequences": 8, "new_tokens": 32, "ours_ms": 900.0,
                                    "llama_cpp_ms": 1000.0}
    measured["ratios"].update(vs_llama_cpp=1.32, one_sequence_vs_llama_cpp=0.77, batch8_vs_llama_cpp=0.9)
    table = markdown_table(measured)
    assert "| `vs_llama_cpp` | 1.32 | <= 1.0 |" in table and "14.5 ms" in table
    assert "| `one_sequence_vs_llama_cpp` | 0.77 | <= 0.8 |" in table and "8.5 ms vs llama.cpp" in table
    assert "| `batch8_vs_llama_cpp` | 0.90 | <= 1.0 |" in table and "900 ms vs llama.cpp" in table
