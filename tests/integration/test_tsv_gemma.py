"""TSV on the embedded Gemma 3 270M: a short run on the bundled statements, detection from the saved file,
and generate-and-label on a few TruthfulQA questions.  The full AUROC table is in docs/tsv.md (minutes, not
a test)."""
from __future__ import annotations

import pytest
import torch

from steer_ui import lexical
from steer_ui.methods import tsv
from steer_ui.model.units import relative_scale
from steer_ui.vector import SteeringVector

from conftest import DATASETS, NEEDS_TRUTHFULQA, TRUTHFULQA

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def short_run(gemma):
    from steer_ui.data import load_dataset

    data = load_dataset(DATASETS / "capitals_statements.csv")
    return tsv.train(gemma, data, max_rows=40, init_epochs=1, aug_epochs=1, exemplars=12, selected=12,
                     penalty_rows=4)


def test_short_run_reports_everything_on_a_group_split(gemma, short_run):
    vector, report = short_run
    assert vector.layer == tsv.default_layer(gemma.arch.num_layers) == 5  # the paper's relative depth
    assert report["lam_raw"] == pytest.approx(0.05 * relative_scale(gemma, 5))
    rows = report["rows"]
    assert rows["train"] + rows["test"] == rows["total"] <= 40
    held_groups = {r["prompt"] + r["answer"] for r in report["held_out"]}
    assert len(held_groups) == rows["test"]
    assert set(report["runs"]) == {"constrained", "unconstrained"}
    assert report["max_abs_delta_logit"]["with_constraints"] >= 0
    # the bound holds at the held-out generation positions at the saved (steering) strength; the detector keeps
    # the training strength, 1 / scale times it
    constrained = report["runs"]["constrained"]
    assert constrained["max_abs_delta_logit"] <= report["max_abs_delta_logit"]["limit"] == 2.0
    assert 0 < constrained["steering_scale"] <= 1
    assert vector.hyperparameters["detector_alpha"] == pytest.approx(1 / constrained["steering_scale"])
    assert report["penalty_positions"] == "answer" and report["labelling"]["answers"].startswith("the dataset")
    # The full-label probe at the steered block sees the activations TSV steers; far above chance on capitals.
    assert report["baselines"]["probe_at_block"]["auroc"] > 0.8
    assert 0.0 <= report["auroc"] <= 1.0


def test_detection_from_the_saved_file_reproduces_the_held_out_scores(gemma, short_run, tmp_path):
    vector, report = short_run
    loaded = SteeringVector.load(vector.save(tmp_path / "tsv.safetensors"))
    held = report["held_out"][:12]
    scores = tsv.score(gemma, loaded, [(r["prompt"], r["answer"]) for r in held])
    got, want = torch.tensor(scores), torch.tensor([r["score"] for r in held])
    assert torch.allclose(got, want, atol=2e-3), (got - want).abs().max()


@NEEDS_TRUTHFULQA
def test_generate_and_label_on_truthfulqa_questions(gemma):
    import pandas as pd

    questions = pd.read_csv(TRUTHFULQA).iloc[:3]
    out = tsv.generate_and_label(gemma, questions, max_new_tokens=12)
    assert 1 <= len(out) <= 3
    assert all(isinstance(a, str) and a.strip() for a in out.completion)
    assert all("Q:" not in a and "\n" not in a for a in out.completion)
    for _, row in out.iterrows():
        expected = lexical.label_answer(row.completion, row.correct_answers.split("; "),
                                        row.incorrect_answers.split("; "))[0]
        assert row.label == expected
