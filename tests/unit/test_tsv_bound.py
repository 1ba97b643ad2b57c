"""The |Δlogit| bound of a trained TSV, on held-out generation positions, and its two strengths.

A tiny model, a strong vector (λ = the layer's mean residual norm) and a tight bound, so the constraint has
work to do.  The default (``bound_mode="steering_scale"``) saves the vector at a calibrated steering strength
whose held-out max centred |Δlogit| at the generation positions stays within the bound; the detector keeps the
training strength, 1 / scale times the saved direction.
"""
from __future__ import annotations

import pytest
import torch

from steer_ui.methods import tsv
from steer_ui.methods.tsv.training import calibrate_steering_scale, generation_positions, at_positions
from steer_ui.methods import constraints as C

from test_tsv import _rows

BOUND = 0.05
STRONG = dict(layer=1, init_epochs=3, aug_epochs=3, exemplars=8, selected=8, lam=1.0, max_logit_change=BOUND,
              logit_weight=5.0, batch_size=16)


@pytest.fixture(scope="module")
def bounded(tiny):
    h = tiny("llama")
    vector, report = tsv.train(h, _rows(), bound_mode="steering_scale", **STRONG)
    return h, vector, report


def test_the_bound_holds_at_held_out_generation_positions_after_training(bounded):
    _h, _vector, report = bounded
    constrained, free = report["runs"]["constrained"], report["runs"]["unconstrained"]
    assert report["bound_mode"] == "steering_scale"
    assert any(c["max_abs_delta_logit_seen"] for c in constrained["curves"])  # the penalties acted in training
    assert constrained["max_abs_delta_logit"] <= BOUND  # held out, centred, at the steering strength
    assert report["max_abs_delta_logit"]["with_constraints"] == constrained["max_abs_delta_logit"]
    assert free["max_abs_delta_logit"] > 4 * BOUND  # without the constraints the vector breaks the bound
    assert 0 < constrained["steering_scale"] < 1 and free["steering_scale"] == 1.0
    # the detector reads the training strength, where the bound does not hold (nothing is generated there)
    assert constrained["detector_strength"]["max_abs_delta_logit"] > BOUND
    calibration = constrained["steering"]["calibration"]
    assert calibration and min(t["max_abs_delta_logit"] for t in calibration) <= 0.8 * BOUND


def test_the_soft_hinge_alone_does_not_hold_the_bound(tiny):
    # the behaviour before the steering scale: the same training with the penalty only
    _v, report = tsv.train(tiny("llama"), _rows(), bound_mode="hinge", compare=False, **STRONG)
    run = report["runs"]["constrained"]
    assert run["steering_scale"] == 1.0 and run["max_abs_delta_logit"] > BOUND


def test_the_saved_vector_steers_at_the_calibrated_strength_and_detects_at_the_training_one(bounded):
    h, vector, report = bounded
    scale = report["steering_scale"]
    hp = vector.hyperparameters
    assert hp["detector_alpha"] == pytest.approx(1 / scale) and hp["steering_scale"] == scale
    assert float(vector.direction().norm()) == pytest.approx(report["runs"]["constrained"]["steering"]["vector_norm"],
                                                              rel=1e-5)
    held = report["held_out"]
    scores = tsv.score(h, vector, [(r["prompt"], r["answer"]) for r in held])
    for got, row in zip(scores, held):  # the detector at 1 / scale times the saved direction
        assert got == pytest.approx(row["score"], abs=1e-4)


def test_projection_keeps_one_strength(tiny):
    vector, report = tsv.train(tiny("llama"), _rows(), bound_mode="projection", compare=False, **STRONG)
    run = report["runs"]["constrained"]
    assert run["steering_scale"] == 1.0 and vector.hyperparameters["detector_alpha"] == 1.0
    assert sum(c["projections"] for c in run["curves"]) > 0  # the vector was scaled down to the bound
    assert run["max_abs_delta_logit"] == run["detector_strength"]["max_abs_delta_logit"]


def test_calibration_finds_a_scale_within_the_target_on_the_rows_it_measures(tiny):
    h = tiny("llama")
    frame = tsv.rows_of(_rows(6))
    texts = [tsv.format_text(p, a) for p, a in zip(frame.prompt, frame.completion)]
    from steer_ui.methods.tsv.training import answer_lengths

    n_answer = answer_lengths(h, frame, texts, tsv.PROMPT_TEMPLATE, range(len(texts)))
    batches = C.cache_prefix(h, texts, 1, batch_size=8, keep_final=True)
    direction = torch.randn(h.arch.hidden_size, generator=torch.Generator().manual_seed(0))
    direction = direction / direction.norm() * 20
    scale, tried = calibrate_steering_scale(h, batches, n_answer, direction, 1.0, target=0.1)
    assert 0 < scale < 1 and tried[0]["scale"] == 1.0 and tried[0]["max_abs_delta_logit"] > 0.1
    worst = 0.0
    for b in batches:  # measured afresh: every generation position within the target at the returned scale
        r, pos = generation_positions(b, n_answer)
        with torch.no_grad():
            steered = C.run_suffix_all(h, b, scale * direction)
        worst = max(worst, C.max_centred_delta(h, at_positions(b.final_all, r, pos), at_positions(steered, r, pos)))
    assert worst <= 0.1


def test_calibrated_mode_trains_without_penalties_and_bounds_the_steering_strength(tiny):
    h = tiny("llama")
    _v, report = tsv.train(h, _rows(), **STRONG)  # the default
    assert report["bound_mode"] == "calibrated"
    constrained, free = report["runs"]["constrained"], report["runs"]["unconstrained"]
    # one training serves both: the detector is the unconstrained one, by construction
    assert constrained["auroc"] == free["auroc"] and constrained["curves"] == free["curves"]
    assert all(c["max_abs_delta_logit_seen"] is None for c in constrained["curves"])  # no penalty in training
    assert constrained["max_abs_delta_logit"] <= BOUND < constrained["detector_strength"]["max_abs_delta_logit"]
    assert 0 < constrained["steering_scale"] < 1 and free["steering_scale"] == 1.0


def test_the_train_tab_says_which_strength_each_number_is_at(bounded):
    from steer_ui.ui.train_tab import find_results

    _h, _vector, report = bounded
    table = find_results(report).set_index("row")
    note = table.loc["TSV (constrained)", "note"]
    assert "two strengths" in note and "detector" in note and "steering" in note
    assert "no constraints" in table.loc["TSV (unconstrained)", "note"]
