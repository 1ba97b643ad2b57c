"""Batched activation extraction on tiny models: padding, positions, sites, cache, progress."""
from __future__ import annotations

import pandas as pd
import pytest
import torch

from steer_ui.data import Dataset, DatasetError
from steer_ui.data.activations import extract, extract_texts, render
from steer_ui.model.capture import head_geometry

PROMPTS = ["", "Hello there", "Q: what is it?", ""]
COMPLETIONS = ["The cat sat on the mat.", "friend, how are you doing today?", "A: a fish", "x"]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("STEER_UI_CACHE", str(tmp_path / "cache"))


def small_dataset(n: int = 6) -> Dataset:
    rows = [{"prompt": "", "completion": f"Statement number {i} is {'right' if i % 2 else 'wrong'}.",
             "label": i % 2, "group": f"g{i // 2}"} for i in range(n)]
    return Dataset(frame=pd.DataFrame(rows), kind="statements", schema="statements", source="small")


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma3"])
@pytest.mark.parametrize("site", ["resid", "heads"])
def test_batched_equals_one_at_a_time(tiny, family, site):
    handle = tiny(family)
    for position in ("last", "mean", 1, -2):
        batched = extract_texts(handle, PROMPTS, COMPLETIONS, position=position, site=site, batch_size=8)
        single = extract_texts(handle, PROMPTS, COMPLETIONS, position=position, site=site, batch_size=1)
        assert torch.allclose(batched, single, atol=1e-4), (family, site, position)
    width = handle.arch.hidden_size if site == "resid" else head_geometry(handle)[0] * head_geometry(handle)[1]
    assert batched.shape == (4, handle.arch.num_layers, width)


def test_positions_match_hidden_states(tiny):
    """last = the final token, mean = mean over completion tokens only, index = that token (HF hidden_states[L+1])."""
    handle = tiny("llama")
    prompt, completion = "Question: why", "because it is"
    text, start, _end = render(prompt, completion, None)
    assert text == "Question: why because it is"
    enc = handle.tokenizer(text, return_offsets_mapping=True, return_tensors="pt")
    is_completion = torch.tensor([e > start and e > s for s, e in enc.offset_mapping[0].tolist()])
    with torch.no_grad():
        hidden = handle.model(input_ids=enc.input_ids, output_hidden_states=True).hidden_states
    last = extract_texts(handle, [prompt], [completion], position="last")
    mean = extract_texts(handle, [prompt], [completion], position="mean")
    third = extract_texts(handle, [prompt], [completion], position=2)
    for layer in range(handle.arch.num_layers - 1):  # HF's final entry is after the final norm
        h = hidden[layer + 1][0]
        assert torch.allclose(last[0, layer], h[-1], atol=1e-5)
        assert torch.allclose(mean[0, layer], h[is_completion].mean(0), atol=1e-5)
        assert torch.allclose(third[0, layer], h[2], atol=1e-5)
    assert int(is_completion.sum()) == len("because it is")  # byte tokenizer: one token per byte; the space joins the prompt


def test_render_template():
    assert render("Why?", "Because.", "Q: {prompt}\nA: {completion}") == ("Q: Why?\nA: Because.", 11, 19)
    assert render("", "Paris is in France.", None) == ("Paris is in France.", 0, 19)


def test_bad_template_rejected_before_model_work(tiny):
    with pytest.raises(DatasetError, match=r"\{completion\}"):
        extract_texts(tiny("llama"), ["a"], ["b"], template="{prompt} only")


def test_bad_position_rejected(tiny):
    with pytest.raises(DatasetError, match="position must be"):
        extract_texts(tiny("llama"), ["a"], ["b"], position="middle")


def test_cache_hit_does_not_run_the_model(tiny):
    handle = tiny("llama")
    ds = small_dataset()
    calls = []
    remover = handle.arch.layers[0].register_forward_hook(lambda *_: calls.append(1))
    try:
        first = extract(handle, ds, position="mean")
        n_first = len(calls)
        second = extract(handle, ds, position="mean")
        n_second = len(calls) - n_first
        third = extract(handle, ds, position="last")  # another position is another cache entry
    finally:
        remover.remove()
    assert n_first > 0 and not first.from_cache
    assert n_second == 0 and second.from_cache
    assert torch.equal(first.values, second.values)
    assert not third.from_cache
    assert second.labels.tolist() == [0, 1, 0, 1, 0, 1]


def test_cache_key_follows_content(tiny):
    handle = tiny("llama")
    a = extract(handle, small_dataset(6))
    b = extract(handle, small_dataset(8))
    assert not b.from_cache and b.values.shape[0] == 8
    assert torch.allclose(a.values, b.values[:6], atol=1e-5)


def test_progress_reports_to_one(tiny):
    seen = []
    extract(tiny("llama"), small_dataset(10), batch_size=3, cache=False, progress=lambda f, m: seen.append((f, m)))
    fractions = [f for f, _ in seen]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0 and len(seen) == 4
    assert "10/10" in seen[-1][1]


def test_pairs_expand_to_labelled_rows(tiny):
    frame = pd.DataFrame({"prompt": ["I feel", "It is"], "positive": ["good", "nice"], "negative": ["bad", "awful"],
                          "group": ["a", "b"]})
    acts = extract(tiny("llama"), Dataset(frame=frame, kind="pairs", schema="pairs"), cache=False)
    assert acts.values.shape[0] == 4 and acts.labels.tolist() == [1, 0, 1, 0]
    assert acts.groups == ["a", "a", "b", "b"]
