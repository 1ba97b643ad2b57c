"""Concepts panels on tiny models, each number checked against an independent computation."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from steer_ui import concepts, plots_concepts
from steer_ui.model.generation import GenerationError
from steer_ui.model.hooks import hook_count
from steer_ui.model.units import relative_scale
from steer_ui.tiny import tiny_model

PROMPT = "the cat sat on the mat"


def _unique_numel(model) -> int:
    """Parameters counted once per storage (a tied lm_head shares the embedding's)."""
    seen, total = set(), 0
    for tensor in model.state_dict().values():
        key = (tensor.data_ptr(), tensor.numel())
        if tensor.is_floating_point() and key not in seen and tensor.data_ptr() != 0:
            seen.add(key)
            total += tensor.numel()
    return total


def _raw_logits(handle, prompt: str) -> tuple[np.ndarray, list[int]]:
    """Next-token logits from the plain HF forward (not the app's unembedding path)."""
    ids = handle.tokenizer(prompt, return_tensors="pt").input_ids
    with torch.inference_mode():
        logits = handle.model(input_ids=ids).logits[0, -1].double().numpy()
    return logits, ids[0].tolist()


# ---------------------------------------------------------------- lm_head
@pytest.mark.parametrize("family, tied", [("llama", False), ("gpt2", True)])
def test_lm_head_share_matches_numel(tiny, family, tied):
    handle = tiny(family)
    facts = concepts.lm_head_facts(handle)
    head = handle.model.get_output_embeddings().weight
    assert facts["shape"] == [260, 64] == list(head.shape)
    assert facts["parameters"] == head.numel() == 260 * 64
    assert facts["tied"] is tied
    assert tied == (head.data_ptr() == handle.model.get_input_embeddings().weight.data_ptr())
    total = _unique_numel(handle.model)
    assert facts["model_parameters"] == total
    assert facts["share"] == pytest.approx(head.numel() / total)
    assert facts["bytes"] == head.numel() * 4


def test_row_norms_histogram_and_extremes(tiny):
    handle = tiny("llama")
    result = concepts.row_norms(handle, bins=12, extremes=5)
    w = handle.model.get_output_embeddings().weight.detach().double().numpy()
    norms = np.sqrt((w ** 2).sum(axis=1))
    assert result.histogram["count"].sum() == len(norms) == result.stats["rows"]
    assert len(result.histogram) == 12
    assert result.histogram["bin_start"].iloc[0] == pytest.approx(norms.min(), rel=1e-5)
    assert result.histogram["bin_end"].iloc[-1] == pytest.approx(norms.max(), rel=1e-5)
    expected_counts, _ = np.histogram(norms, bins=12, range=(norms.min(), norms.max()))
    # float32 vs float64 may move a value sitting on a bin edge; the totals per half must agree
    assert np.abs(result.histogram["count"].to_numpy() - expected_counts).sum() <= 2
    largest = result.extremes[result.extremes.which == "largest"]
    smallest = result.extremes[result.extremes.which == "smallest"]
    assert largest.token_id.tolist() == np.argsort(-norms)[:5].tolist()
    assert smallest.token_id.tolist() == np.argsort(norms)[:5].tolist()
    assert largest.norm.tolist() == pytest.approx(np.sort(norms)[::-1][:5].tolist(), rel=1e-5)
    assert result.stats["mean"] == pytest.approx(norms.mean(), rel=1e-5)


def test_row_norms_needs_a_bin(tiny):
    with pytest.raises(concepts.ConceptsError, match="at least 1 bin"):
        concepts.row_norms(tiny("llama"), bins=0)


# --------------------------------------------------------------- sampling
def _direct_filters(logits: np.ndarray, history: list[int], temperature: float, top_k: int, top_p: float,
                    penalty: float) -> tuple[set[int], set[int], np.ndarray]:
    """The textbook sampler: penalty on seen tokens, temperature, top-k, then the top-p nucleus."""
    z = logits.copy()
    for t in set(history):
        z[t] = z[t] / penalty if z[t] > 0 else z[t] * penalty
    z = z / temperature
    order = np.argsort(-z, kind="stable")
    keep_k = set(order[:top_k].tolist()) if top_k else set(range(len(z)))
    masked = np.where([i in keep_k for i in range(len(z))], z, -np.inf)
    p = np.exp(masked - masked.max())
    p /= p.sum()
    nucleus, mass = set(), 0.0
    for i in np.argsort(-p, kind="stable"):
        if mass >= top_p:
            break
        nucleus.add(int(i))
        mass += p[i]
    final = np.where([i in nucleus for i in range(len(z))], masked, -np.inf)
    q = np.exp(final - final.max())
    return keep_k, nucleus, q / q.sum()


@pytest.mark.parametrize("temperature, top_k, top_p, penalty", [
    (1.0, 0, 0.5, 1.0), (0.7, 40, 0.9, 1.3), (1.5, 10, 1.0, 1.0), (0.3, 0, 0.3, 2.0)])
def test_filters_match_a_direct_implementation(tiny, temperature, top_k, top_p, penalty):
    handle = tiny("llama")
    view = concepts.sampling_filters(handle, PROMPT, temperature, top_k, top_p, penalty, show=260)
    logits, history = _raw_logits(handle, PROMPT)
    keep_k, nucleus, final = _direct_filters(logits, history, temperature, top_k, top_p, penalty)
    frame = view.frame.set_index("token_id")
    assert len(frame) == 260
    assert frame.logit.sort_index().to_numpy() == pytest.approx(logits, abs=1e-4)
    assert set(frame.index[frame.kept_top_k]) == keep_k
    assert set(frame.index[frame.kept_top_p]) == nucleus
    assert view.summary["survivors"] == len(nucleus)
    assert view.summary["survivors_top_k"] == len(keep_k)
    assert frame.final_prob.sort_index().to_numpy() == pytest.approx(final, abs=1e-6)
    raw = np.exp(logits - logits.max())
    assert frame.prob.sort_index().to_numpy() == pytest.approx(raw / raw.sum(), abs=1e-6)


def test_greedy_is_the_penalised_argmax(tiny):
    handle = tiny("llama")
    logits, history = _raw_logits(handle, PROMPT)
    z = logits.copy()
    for t in set(history):
        z[t] = z[t] / 1.5 if z[t] > 0 else z[t] * 1.5
    view = concepts.sampling_filters(handle, PROMPT, temperature=0, repetition_penalty=1.5)
    assert view.summary["greedy"] and view.summary["greedy_token_id"] == int(np.argmax(z))
    assert view.summary["survivors"] == 1
    frame = concepts.sample_many(handle, PROMPT, n=20, temperature=0, repetition_penalty=1.5)
    drawn = frame[frame["count"] > 0]
    assert drawn.token_id.tolist() == [int(np.argmax(z))] and drawn["count"].iloc[0] == 20


def test_sample_frequencies_follow_probabilities(tiny):
    handle = tiny("llama")
    n = 4000
    frame = concepts.sample_many(handle, PROMPT, n=n, seed=3, temperature=0.5, top_k=6)
    again = concepts.sample_many(handle, PROMPT, n=n, seed=3, temperature=0.5, top_k=6)
    assert frame["count"].tolist() == again["count"].tolist()  # a seed fixes the draws
    assert frame["count"].sum() == n
    logits, history = _raw_logits(handle, PROMPT)
    _, nucleus, final = _direct_filters(logits, history, 0.5, 6, 1.0, 1.0)
    assert set(frame.token_id[frame["count"] > 0]) <= nucleus
    by_id = frame.set_index("token_id")
    for t in nucleus:
        assert by_id.probability[t] == pytest.approx(final[t], abs=1e-6)
        # binomial standard deviation is at most 0.008 at n = 4000: 4 sigma
        assert abs(by_id.frequency[t] - final[t]) < 0.032
    assert frame.attrs["total_variation"] < 0.05


def test_sampling_refuses_bad_settings(tiny):
    handle = tiny("llama")
    with pytest.raises(GenerationError, match="top-p"):
        concepts.sampling_filters(handle, PROMPT, top_p=0)
    with pytest.raises(GenerationError, match="empty"):
        concepts.sampling_filters(handle, "   ")
    with pytest.raises(concepts.ConceptsError, match="number of draws"):
        concepts.sample_many(handle, PROMPT, n=0)


# -------------------------------------------------------------- KV cache
def _cache_bytes_from_forward(model, ids) -> int:
    with torch.inference_mode():
        cache = model(input_ids=ids, use_cache=True).past_key_values
    return sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers)


@pytest.mark.parametrize("family", ["llama", "gpt2", "qwen3"])
@pytest.mark.parametrize("batch", [1, 3])
def test_kv_bytes_match_the_real_cache(tiny, family, batch):
    handle = tiny(family)
    ids = handle.tokenizer([PROMPT] * batch, return_tensors="pt").input_ids
    actual = _cache_bytes_from_forward(handle.model, ids)
    assert concepts.kv_cache_bytes(handle.model.config, ids.shape[1], batch, "float32") == actual
    lay = concepts.kv_layout(handle.model.config)
    mha = concepts.kv_cache_bytes(handle.model.config, ids.shape[1], batch, "float32", kv_heads=lay.attention_heads)
    assert mha * lay.kv_heads == actual * lay.attention_heads
    measured = concepts.measured_cache(handle, PROMPT, batch=batch)
    assert measured["measured_bytes"] == measured["formula_bytes"] == actual


def test_kv_bytes_in_bfloat16():
    model, tok = tiny_model("llama")
    model = model.to(torch.bfloat16)
    ids = tok(PROMPT, return_tensors="pt").input_ids
    actual = _cache_bytes_from_forward(model, ids)
    assert concepts.kv_cache_bytes(model.config, ids.shape[1], 1, "bfloat16") == actual
    assert concepts.kv_cache_bytes(model.config, ids.shape[1], 1, torch.bfloat16) == actual
    assert concepts.kv_cache_bytes(model.config, ids.shape[1], 1, "float32") == 2 * actual


def test_sliding_window_layers_keep_a_window(tiny):
    handle = tiny("gemma3")  # every tiny layer slides over 16 positions
    lay = concepts.kv_layout(handle.model.config)
    assert lay.sliding_window == 16
    for text in ("short", "a much longer prompt than the sixteen position window"):
        ids = handle.tokenizer(text, return_tensors="pt").input_ids
        actual = _cache_bytes_from_forward(handle.model, ids)
        assert concepts.kv_cache_bytes(handle.model.config, ids.shape[1], sliding=True) == actual
        full = concepts.kv_cache_bytes(handle.model.config, ids.shape[1])
        assert (full == actual) == (ids.shape[1] < 16)


def test_kv_table_columns(tiny):
    handle = tiny("llama")
    table = concepts.kv_cache_table(handle.model.config, [8, 1024], batch=2, dtype="float16")
    lay = concepts.kv_layout(handle.model.config)
    # 2 × layers × batch × kv_heads × seq × head_dim × bytes, written out
    assert table.bytes.tolist() == [2 * 4 * 2 * 2 * n * 16 * 2 for n in (8, 1024)]
    assert table.bytes_mha.tolist() == [b * lay.attention_heads // lay.kv_heads for b in table.bytes]
    assert "bytes_sliding" not in table
    assert table.attrs["kv_heads"] == 2 and table.attrs["attention_heads"] == 4


def test_kv_refuses_bad_sizes(tiny):
    config = tiny("llama").model.config
    with pytest.raises(concepts.ConceptsError, match="sequence length"):
        concepts.kv_cache_bytes(config, 0)
    with pytest.raises(concepts.ConceptsError, match="batch"):
        concepts.kv_cache_bytes(config, 8, batch=1.5)
    with pytest.raises(concepts.ConceptsError, match="unknown dtype 'int3'"):
        concepts.kv_cache_bytes(config, 8, dtype="int3")


def test_time_cache_same_tokens_and_cache_size(tiny):
    handle = tiny("llama")
    summary, steps = concepts.time_cache(handle, n_tokens=6, prompt=PROMPT)
    assert summary["same_tokens"] is True
    assert len(steps) == 6 and (steps[["with_cache_s", "without_cache_s"]] > 0).all().all()
    assert summary["seconds_with_cache"] == pytest.approx(steps.with_cache_s.sum())
    # the cache holds the prompt and every generated token except the last (never fed back)
    seq = summary["prompt_tokens"] + 6 - 1
    assert summary["cache_bytes"] == concepts.kv_cache_bytes(handle.model.config, seq)
    # and the greedy text is what the app's generator produces
    from steer_ui.model.generation import Sampling, side_by_side

    gen = side_by_side(handle, PROMPT, [], Sampling(max_new_tokens=6, temperature=0.0, stop_at_eos=False))
    assert summary["text"] == gen.unsteered.text
    with pytest.raises(concepts.ConceptsError, match="1..1024"):
        concepts.time_cache(handle, n_tokens=0)


# ------------------------------------------------------- logit explosion
def test_explosion_aligns_with_the_token_row(tiny):
    handle = tiny("llama")
    token_id = 77
    demo = concepts.explode(handle, PROMPT, layer=3, alpha=30.0, token=token_id, max_new_tokens=5)
    row = handle.model.get_output_embeddings().weight[token_id].detach().double()
    assert torch.allclose(demo.vector.double(), row / row.norm(), atol=1e-6)
    assert demo.alpha_raw == pytest.approx(30.0 * relative_scale(handle, 3))
    assert hook_count(handle) == 0  # the steered runs went through hooks.steering, which removes its hooks
    assert demo.exploded.naive_direct == pytest.approx(demo.alpha_raw * float(row.norm()), rel=1e-4)
    run = demo.exploded
    assert run.top.token_id.iloc[0] == token_id and run.max_delta_token == handle.tokenizer.decode([token_id])
    # a random tiny model's final norm caps logits near ±2, so 'collapse' here is top-1 and a 3x jump
    assert run.prob_steered > 3 * run.prob_unsteered
    assert run.repeats == 5 and run.steered_tokens == [demo.token] * 5
    # the actual Δlogit is the steered minus unsteered logit from plain HF forwards with a hook
    logits, _ = _raw_logits(handle, PROMPT)
    layer = handle.model.model.layers[3]
    hook = layer.register_forward_hook(lambda _m, _i, out: (out[0] + demo.alpha_raw * demo.vector,) + tuple(out[1:])
                                       if isinstance(out, tuple) else out + demo.alpha_raw * demo.vector)
    try:
        steered, _ = _raw_logits(handle, PROMPT)
    finally:
        hook.remove()
    assert run.delta_logit == pytest.approx(steered[token_id] - logits[token_id], abs=1e-3)
    assert run.max_abs_delta_logit == pytest.approx(np.abs(steered - logits).max(), abs=1e-3)
    # the lesson shows the centred change, the one the constraint's bound is on
    delta = steered - logits
    assert run.max_abs_centred_delta_logit == pytest.approx(np.abs(delta - delta.mean()).max(), abs=1e-3)


def test_fix_rotates_the_vector_and_shrinks_the_logits(tiny):
    handle = tiny("llama")
    demo = concepts.explode(handle, PROMPT, layer=3, alpha=30.0, token=77, max_new_tokens=4)
    concepts.fix_explosion(handle, demo, max_change=0.3, steps=40, prompts=[PROMPT])  # tiny logits are small
    assert demo.fixed_vector.norm() == pytest.approx(1.0, abs=1e-5)  # same strength, new direction
    rep = demo.as_dict()["constraint"]
    assert rep["after_max_abs_delta_logit"] < rep["before_max_abs_delta_logit"]
    assert rep["after_max_abs_centred_delta_logit"] < rep["before_max_abs_centred_delta_logit"]
    assert demo.fixed.max_abs_centred_delta_logit < demo.exploded.max_abs_centred_delta_logit / 2
    assert demo.fixed.max_abs_delta_logit < demo.exploded.max_abs_delta_logit / 2
    assert demo.fixed.repeats < demo.exploded.repeats
    assert len(demo.curve()) == 40


def test_rare_token_and_token_errors(tiny):
    handle = tiny("llama")
    logits, _ = _raw_logits(handle, PROMPT)
    special = set(handle.tokenizer.all_special_ids)
    allowed = [i for i in range(len(logits)) if i not in special]
    # byte vocabulary: no word-like tokens, so the least likely non-special token
    assert concepts.rare_token(handle, PROMPT) == allowed[int(np.argmin(logits[allowed]))]
    with pytest.raises(concepts.ConceptsError, match="not one"):
        concepts.explode(handle, PROMPT, token="ab")
    with pytest.raises(concepts.ConceptsError, match="layer 9 does not exist"):
        concepts.explode(handle, PROMPT, layer=9)
    with pytest.raises(concepts.ConceptsError, match="> 0"):
        concepts.explode(handle, PROMPT, alpha=-1)


# ----------------------------------------------------------------- plots
def test_plots_show_the_frames_numbers(tiny):
    handle = tiny("llama")
    norms = concepts.row_norms(handle, bins=8)
    fig = plots_concepts.row_norm_histogram(norms.histogram, norms.stats, labels={"title": "T"})
    assert list(fig.data[0].y) == norms.histogram["count"].tolist() and fig.layout.title.text == "T"
    view = concepts.sampling_filters(handle, PROMPT, 1.0, 5, 1.0, 1.0, show=8)
    fig = plots_concepts.sampling_bars(view.frame)
    assert list(fig.data[2].y) == view.frame.final_prob.tolist()
    assert sum(x.startswith("✗") for x in fig.data[0].x) == int((~view.frame.kept_top_p).sum()) == 3
    sampled = concepts.sample_many(handle, PROMPT, n=50, top_k=5)
    fig = plots_concepts.sample_bars(sampled, labels={"title": "n = {n}"})
    assert fig.layout.title.text == "n = 50" and list(fig.data[1].y) == sampled.frequency.tolist()
    table = concepts.kv_cache_table(tiny("gemma3").model.config, [8, 64])
    fig = plots_concepts.kv_cache_chart(table, current=8)
    assert len(fig.data) == 3 and list(fig.data[2].y) == table.bytes_sliding.tolist()
    _, steps = concepts.time_cache(handle, 2, PROMPT)
    assert len(plots_concepts.cache_timing_chart(steps).data) == 2
    run = {"naive_direct": 500.0, "direct": 300.0, "delta_logit": 250.0, "max_abs_centred_delta_logit": 250.0}
    fixed = {"naive_direct": 20.0, "direct": 1.0, "delta_logit": 0.0, "max_abs_centred_delta_logit": 1.5}
    fig = plots_concepts.explosion_bars(run, fixed, bound=2.0)
    assert list(fig.data[0].y) == [500.0, 300.0, 250.0, 250.0] and min(fig.data[1].y) > 0  # log axis floor
    # names on lines under their bars, values upright over them (side by side they ran into one another)
    assert fig.data[0].x[1] == "direct path<br>Δlogit(t)" and {t.textangle for t in fig.data} == {-90}
    curve = pd.DataFrame({"step": [0, 1], "max_abs_delta_logit": [9.0, 1.0], "cosine": [1.0, 0.9]})
    assert len(plots_concepts.constraint_curve(curve, 2.0).data) == 2


def test_concepts_tab_is_mounted_with_named_endpoints(tiny, tmp_path):
    from steer_ui.service import Service
    from steer_ui.ui.app import build_demo

    demo = build_demo(Service(handle=tiny("llama"), workdir=tmp_path))
    names = {fn.api_name for fn in demo.fns.values()}
    assert {"concepts_lm_head", "concepts_sampling", "concepts_sample", "concepts_explode", "concepts_fix",
            "concepts_kv", "concepts_kv_time"} <= names
