"""The UI's report readers pick the right table and curves from each method's report shape."""
from __future__ import annotations

import pandas as pd

from steer_ui.ui.detect_tab import answers_from_table
from steer_ui.ui.train_tab import find_alpha_sweep, find_curves, find_results


def test_tsv_report_shows_its_runs_next_to_the_baselines():
    report = {"auroc": 0.7, "curves": [{"epoch": 1, "stage": 1, "loss": 0.6}, {"epoch": 2, "stage": 2, "loss": 0.4}],
              "runs": {"constrained": {"auroc": 0.7, "max_abs_delta_logit": 1.9},
                       "unconstrained": {"auroc": 0.71, "max_abs_delta_logit": 240.0}},
              "baselines": {"probe": {"auroc": 0.65, "note": "logistic"}, "perplexity": 0.55}}
    table = find_results(report)
    assert list(table.row) == ["TSV (constrained)", "TSV (unconstrained)", "probe", "perplexity"]
    assert list(table.auroc) == [0.7, 0.71, 0.65, 0.55]
    assert table.max_abs_delta_logit[1] == 240.0
    assert list(find_curves(report).loss) == [0.6, 0.4]


def test_l2s_table_and_residual_metrics_and_sweep():
    l2s = {"table": [{"source": "Mean-S", "cosine_to_target": 0.3}, {"source": "L2S", "cosine_to_target": 0.8}],
           "fit": {"history": [{"epoch": 1, "train_loss": 1.0, "val_loss": 1.1}]}}
    assert list(find_results(l2s).source) == ["Mean-S", "L2S"]
    assert list(find_curves(l2s).val_loss) == [1.1]  # found one level deep
    residual = {"metrics": {"test_auroc": 0.99, "test_accuracy": 0.95, "note": "text is skipped"},
                "alpha_sweep": [{"alpha": -1.0, "kl": 0.2}, {"alpha": 1.0, "kl": 0.3}]}
    assert dict(zip(find_results(residual).name, find_results(residual).value)) == {"test_auroc": 0.99,
                                                                                    "test_accuracy": 0.95}
    assert find_curves(residual) is None and list(find_alpha_sweep(residual).kl) == [0.2, 0.3]


def test_answers_table_skips_blank_answers():
    frame = pd.DataFrame({"prompt": ["q1", "q2", None], "answer": ["a1", "  ", "a3"]})
    assert answers_from_table(frame) == [("q1", "a1"), ("", "a3")]
    assert answers_from_table(None) == []


def test_l2s_loss_curve_and_recommendation_reach_the_train_tab():
    from steer_ui.ui.train_tab import find_loss_curve, train_outputs

    report = {"loss_curve": [{"epoch": 0, "train_loss": None, "validation_loss": 1.0},
                             {"epoch": 1, "train_loss": 0.9, "validation_loss": 0.8},
                             {"epoch": 2, "train_loss": 0.6, "validation_loss": 0.85}],
              "fit": {"best_epoch": 1}, "table": [{"source": "L2S", "margin_gain": 0.1}],
              "recommendation": "L2S did not beat mean steering on this data."}
    frame, best = find_loss_curve(report)
    assert list(frame.validation_loss) == [1.0, 0.8, 0.85] and best == 1
    status, fig, results, _ = train_outputs(None, "en", "l2s L6<-L6", report)
    assert [t.name for t in fig.data] == ["train loss", "validation loss"]
    assert list(fig.data[1].y) == [1.0, 0.8, 0.85]
    assert status.endswith("L2S did not beat mean steering on this data.")
    assert find_loss_curve({"curves": []}) is None
    plain_status, *_ = train_outputs(None, "en", "v", {"metrics": {"test_auroc": 0.9}})
    assert "mean steering" not in plain_status


def test_training_results_name_their_measures_in_words_and_skip_a_length_said_twice():
    """Issue #52: the Train tab listed raw keys (train_auroc) and raw_norm beside an equal norm."""
    from steer_ui.ui.train_tab import results_in_words, train_outputs

    same = {"metrics": {"test_auroc": 0.9, "raw_norm": 2.5, "norm": 2.5, "odd_key": 1.0},
            "alpha_sweep": [{"alpha": -1.0, "kl": 0.2}, {"alpha": 1.0, "kl": 0.3}]}
    _, fig, results, _ = train_outputs(None, "en", "v", same)
    assert list(results.columns) == ["measure", "value"]
    assert list(results.measure) == ["AUROC, held-out rows", "vector length (L2)", "odd key"]
    # the sweep's chart: its long title on two lines inside the chart, its axis and line in words
    assert "<br>" in fig.layout.title.text and fig.layout.xaxis.title.text == "α"
    assert [t.name for t in fig.data] == ["mean KL (nats)"]
    normalised = find_results({"metrics": {"raw_norm": 7.0, "norm": 1.0}})
    assert list(results_in_words("zh-CN", normalised)["指标"]) == ["归一化前的长度", "向量长度（L2）"]
    assert results_in_words("en", None) is None
