"""L2S on the embedded Gemma 3 270M with the bundled capitals pairs: held-out countries only."""
from __future__ import annotations

import pytest
import torch

from steer_ui.methods import l2s
from steer_ui.vector import SteeringVector

from conftest import DATASETS

# The science check on the embedded model.  It ran only with `-m slow` while training L2S on Gemma took ~75 s;
# with the model's forward passes on every thread (steer_ui/methods/l2s/cpu.py) the whole module took 25 s on
# the 2-core AVX-512 EPYC, so CI runs it, beside the tiny-model tests of tests/unit/test_l2s.py.
pytestmark = [pytest.mark.integration]


@pytest.fixture(scope="module")
def trained(gemma):
    from steer_ui.data import load_dataset

    dataset = load_dataset(DATASETS / "capitals_pairs.csv")
    assert dataset.kind == "pairs" and len(dataset) >= 240
    # Steering is scored on 16 validation pairs (α calibration) and 16 held-out pairs to keep the test short;
    # cosines use all 64.
    return l2s.train(gemma, dataset, eval_limit=16)


def test_l2s_beats_mean_steering_on_heldout_countries(trained):
    vector, report = trained
    assert report["layer"] == 6 and report["context_layer"] == 6
    assert report["splits"]["test"] == 64 and len(report["splits"]["test_groups"]) == 32
    # Predicting each input's target beats the one-size-fits-all mean, by a wide margin.
    assert report["l2s_cosine"] > report["mean_cosine"] + 0.2
    assert report["l2s_mse"] < report["mean_mse"]
    # The early-stopped epoch is a trained one, not the Mean-S starting point.
    assert report["fit"]["best_epoch"] > 0
    # At the same norm budget (each source's α calibrated on validation within it), L2S moves held-out margins
    # toward the positive completion; Mean-S, one vector for two opposite questions, barely moves them.
    budget = report["norm_budget"]
    assert report["steered_norm"]["mean"] <= budget + 1e-6  # Mean-S has one norm: exactly what was calibrated
    assert report["steered_norm"]["l2s"] <= 1.2 * budget  # calibrated on validation, measured on held-out
    gain = report["margin_gain"]
    assert gain["l2s"] > 0.2
    assert gain["l2s"] > abs(gain["mean"]) + 0.2
    assert gain["p2s"] > gain["l2s"]  # the oracle bounds what a predictor can do
    assert set(report["positive_rate"]) == {"none", "mean", "l2s", "p2s"}
    assert report["l2s_beats_mean"] is True and report["recommendation"].startswith("L2S beat mean steering")
    assert [r["epoch"] for r in report["loss_curve"]][:2] == [0, 1]


# `slow` for CI's 30 minutes (17-19 s in the twelfth session's full runs, 8 s on an earlier machine): the
# recommendation's wording when mean steering wins is tested on a tiny model in CI (tests/unit/test_l2s.py); this
# is the measured case on the embedded model
@pytest.mark.slow
def test_l2s_says_plainly_when_mean_steering_wins(gemma):
    # One question per domain (element symbol, animal class, opposite): a shared direction exists and the
    # per-input part must generalise from ~60 items. Seed 0, g as trained, measured L2S +0.008 against Mean-S
    # +0.114 (paired −0.106, s.e. 0.039); weighing g's per-input part on validation keeps none of it, so L2S
    # steers as Mean-S does (docs/l2s.md). Either way the report must not recommend L2S here.
    from steer_ui.data import load_dataset

    data = load_dataset(DATASETS / "science_pairs.csv")
    as_trained, before = l2s.train(gemma, data, seed=0, residual_steps=0)
    assert before["margin_gain"]["mean"] > before["margin_gain"]["l2s"] and before["margin_gain"]["mean"] > 0
    assert before["l2s_minus_mean"]["mean"] < 0 and before["l2s_beats_mean"] is False
    vector, report = l2s.train(gemma, data, seed=0)
    assert vector.hyperparameters["residual_weight"] == 0.0
    gain = report["margin_gain"]
    assert gain["l2s"] == pytest.approx(gain["mean"]) and gain["mean"] > 0
    assert report["l2s_beats_mean"] is False
    assert report["recommendation"].startswith("L2S did not beat mean steering")
    assert "Use mean steering instead" in report["recommendation"]
    assert "set its weight to 0" in report["recommendation"]


def test_predicted_vectors_depend_on_the_question(trained, gemma):
    from steer_ui.data import load_dataset

    vector, report = trained
    country = report["splits"]["test_groups"][0]
    pairs = l2s.as_pairs(load_dataset(DATASETS / "capitals_pairs.csv"))
    prompts = [p.prompt for p in pairs if p.group == country]
    assert len(prompts) == 2  # "The capital of X ..." and "A major city in X other than its capital ..."
    pred = l2s.predict(gemma, vector, prompts)
    # Capital vs not-the-capital ask for opposite directions; Mean-S is one vector for both.
    assert torch.nn.functional.cosine_similarity(pred[0], pred[1], dim=0) < 0
    frame = l2s.describe(gemma, vector, prompts)
    assert (frame.cosine_to_mean.abs() < 0.9).all()


def test_saved_vector_steers_identically(trained, gemma, tmp_path):
    from steer_ui.model.analysis import next_token
    from steer_ui.steering import build_steers

    vector, _ = trained
    loaded = SteeringVector.load(vector.save(tmp_path / "l2s.safetensors"))
    assert loaded.directions[6].shape == (640,)  # Mean-S, for tools that know nothing of L2S
    prompt = "A major city in Australia other than its capital is the city of"
    a = next_token(gemma, prompt, build_steers(gemma, vector, 1.0))
    b = next_token(gemma, prompt, build_steers(gemma, loaded, 1.0))
    assert a.kl > 0.01  # it steers
    assert a.steered.token.tolist() == b.steered.token.tolist()
    assert a.steered.prob.tolist() == pytest.approx(b.steered.prob.tolist(), abs=1e-6)
