"""Probes and activation extraction on the embedded Gemma 3 270M."""
from __future__ import annotations

import pytest
import torch

from conftest import DATASETS
from steer_ui.data import load_dataset
from steer_ui.data.activations import extract, extract_texts
from steer_ui.methods import probe_layers

pytestmark = pytest.mark.integration


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("STEER_UI_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def capitals():
    return load_dataset(DATASETS / "capitals_statements.csv")


def test_capitals_probe_auroc_at_recommended_layer(gemma, capitals, fresh_cache):
    out = probe_layers(gemma, capitals, position="last", seed=0)
    best = out["layers"][out["best_layer"]]
    assert best["auroc"] >= 0.95, out["layers"]
    # held out by country: no country is on both sides
    assert out["test_groups"] >= 10 and out["train_rows"] + out["test_rows"] == len(capitals)
    late = [r["auroc"] for r in out["layers"][5:]]
    assert sorted(late)[len(late) // 2] >= 0.95  # the plateau, not one lucky layer


def test_probes_find_truth_in_domains_the_defaults_were_not_set_on(gemma, fresh_cache):
    # element symbols, animal classes and word opposites, split by item: measured 0.976 at the recommended
    # layer (seed 0) and a median of 0.943 over layers 5..17, where capitals reach 1.000 and 0.99
    science = load_dataset(DATASETS / "science_statements.csv")
    out = probe_layers(gemma, science, position="last", seed=0)
    assert out["layers"][out["best_layer"]]["auroc"] >= 0.93, out["layers"]
    assert out["test_groups"] >= 20
    late = [r["auroc"] for r in out["layers"][5:]]
    assert sorted(late)[len(late) // 2] >= 0.9
    assert max(r["auroc"] for r in out["layers"][:3]) < 0.7  # the first blocks do not know: a real signal


def test_cache_hit_does_not_run_the_model_again(gemma, capitals, fresh_cache):
    subset = capitals.subset(range(12))
    calls = []
    remover = gemma.arch.layers[0].register_forward_hook(lambda *_: calls.append(1))
    try:
        first = extract(gemma, subset, position="mean")
        after_first = len(calls)
        second = extract(gemma, subset, position="mean")
    finally:
        remover.remove()
    assert after_first > 0 and not first.from_cache
    assert len(calls) == after_first and second.from_cache
    assert torch.equal(first.values, second.values)
    assert first.values.shape == (12, gemma.arch.num_layers, gemma.arch.hidden_size)


def test_left_padded_batch_matches_one_at_a_time(gemma):
    prompts = ["", "Question: what is the capital of Peru?", ""]
    completions = ["Paris is the capital of France.", "Lima", "Yes."]
    batched = extract_texts(gemma, prompts, completions, position="mean", batch_size=8)
    single = extract_texts(gemma, prompts, completions, position="mean", batch_size=1)
    scale = single.norm(dim=-1, keepdim=True)
    assert float(((batched - single).norm(dim=-1, keepdim=True) / scale).max()) < 1e-3
