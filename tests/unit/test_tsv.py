"""TSV: the pieces of the algorithm on tensors, data handling, and a short run on a tiny model."""
from __future__ import annotations

import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from steer_ui.methods import SettingsError, parse_settings, tsv
from steer_ui.tools import tsv_tables
from steer_ui.vector import SteeringVector


# ------------------------------------------------------------------ sinkhorn
def _logits(n=200, seed=0, bias=2.0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, 2, generator=g) * 3
    logits[:, 1] += bias  # the model leans towards class 1
    return logits


@pytest.mark.parametrize("epsilon,iterations", [(0.5, 100), (0.2, 100)])
def test_sinkhorn_rows_are_distributions_and_class_totals_reach_the_marginals(epsilon, iterations):
    logits = _logits()
    marginals = torch.tensor([0.5, 0.5])
    plan = tsv.sinkhorn(logits, marginals, epsilon=epsilon, iterations=iterations)
    assert plan.shape == (200, 2)
    assert torch.allclose(plan.sum(1), torch.ones(200), atol=1e-5)
    assert torch.allclose(plan.sum(0) / 200, marginals, atol=1e-3)


def test_sinkhorn_moves_a_biased_model_towards_the_marginals_with_each_iteration():
    logits = _logits(bias=2.0)  # the model gives class 0 about a third of the mass
    raw_gap = abs(float(logits.softmax(-1)[:, 0].mean()) - 0.5)
    gaps = []
    for iterations in (3, 20, 100):
        plan = tsv.sinkhorn(logits, torch.tensor([0.5, 0.5]), epsilon=0.05, iterations=iterations)
        assert torch.allclose(plan.sum(1), torch.ones(len(logits)), atol=1e-5)
        gaps.append(abs(float(plan[:, 0].mean()) - 0.5))
    assert raw_gap > gaps[0] > gaps[1] > gaps[2]


def test_sinkhorn_survives_extreme_logits_and_rejects_bad_marginals():
    logits = torch.tensor([[1000.0, -1000.0], [-1000.0, 1000.0], [0.0, 0.0]])
    plan = tsv.sinkhorn(logits, torch.tensor([0.5, 0.5]))
    assert torch.isfinite(plan).all()
    with pytest.raises(tsv.TSVError, match="marginal"):
        tsv.sinkhorn(logits, torch.tensor([1.0, 0.0]))


# ------------------------------------------------------- confident selection
def test_select_confident_takes_the_lowest_cross_entropy_per_class_in_proportion():
    # rows 0-3 class 0, rows 4-7 class 1; confidence decreases with the row number inside each class
    p0 = torch.tensor([0.99, 0.9, 0.7, 0.6])
    probs = torch.cat([torch.stack([p0, 1 - p0], 1), torch.stack([1 - p0, p0], 1)])
    plan = (probs > 0.5).float()
    picked = tsv.select_confident(probs, plan, k=4, class_dist=[0.5, 0.5])
    assert sorted(picked.tolist()) == [0, 1, 4, 5]
    picked = tsv.select_confident(probs, plan, k=4, class_dist=[0.25, 0.75])
    assert sorted(picked.tolist()) == [0, 4, 5, 6]


def test_select_confident_does_not_refill_a_short_class_from_the_other():
    probs = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.3, 0.7], [0.4, 0.6]])
    plan = (probs > 0.5).float()
    picked = tsv.select_confident(probs, plan, k=4, class_dist=[0.5, 0.5])
    assert sorted(picked.tolist()) == [0, 1, 2]  # only one class-0 row exists


# -------------------------------------------------------------- prototypes
def test_ema_prototypes_move_towards_class_means_and_stay_on_the_sphere():
    g = torch.Generator().manual_seed(0)
    protos = F.normalize(torch.randn(2, 8, generator=g), dim=-1)
    reps = F.normalize(torch.randn(6, 8, generator=g), dim=-1)
    labels = F.one_hot(torch.tensor([0, 0, 0, 1, 1, 1]), 2).float()
    means = F.normalize(torch.stack([reps[:3].mean(0), reps[3:].mean(0)]), dim=-1)
    fresh = tsv.ema_prototypes(protos, reps, labels, decay=0.0)
    assert torch.allclose(fresh, means, atol=1e-6)
    slow = tsv.ema_prototypes(protos, reps, labels, decay=0.99)
    assert torch.allclose(slow.norm(dim=-1), torch.ones(2), atol=1e-6)
    for c in range(2):
        assert float(slow[c] @ means[c]) > float(protos[c] @ means[c])  # moved towards the class mean
        assert float(slow[c] @ protos[c]) > 0.99  # but only a little


def test_ema_prototypes_keep_a_class_absent_from_the_batch():
    protos = F.normalize(torch.randn(2, 4, generator=torch.Generator().manual_seed(1)), dim=-1)
    reps = torch.randn(3, 4)
    only_class_1 = F.one_hot(torch.tensor([1, 1, 1]), 2).float()
    out = tsv.ema_prototypes(protos, reps, only_class_1, decay=0.5)
    assert torch.allclose(out[0], protos[0])
    assert not torch.allclose(out[1], protos[1])


def test_class_probs_is_a_softmax_sharpened_by_kappa():
    protos = torch.eye(3)[:2]
    rep = torch.tensor([[0.8, 0.6, 0.0]])
    p10 = tsv.class_probs(rep, protos, 10.0)
    assert torch.allclose(p10.sum(-1), torch.ones(1))
    assert float(p10[0, 0]) == pytest.approx(float(torch.tensor([8.0, 6.0]).softmax(0)[0]))
    assert float(tsv.class_probs(rep, protos, 100.0)[0, 0]) > float(p10[0, 0])


# ----------------------------------------------------------------------- data
def test_rows_of_reads_tuples_statements_and_frames():
    rows = tsv.rows_of([("Q?", "yes", 1, "g1"), ("Q?", "no", "false", "g1")])
    assert rows.label.tolist() == [1, 0] and rows.group.tolist() == ["g1", "g1"]
    statements = tsv.rows_of([("Paris is in France.", True), ("Paris is in Peru.", False)])
    assert statements.prompt.tolist() == ["", ""]
    frame = tsv.rows_of(pd.DataFrame({"question": ["a?", "a?"], "answer": ["x", "y"], "label": ["truthful", "hallucinated"]}))
    assert frame.group.tolist() == ["a?", "a?"] and frame.label.tolist() == [1, 0]


def test_rows_of_names_the_problem():
    with pytest.raises(tsv.TSVError, match="row 1: label 'maybe'"):
        tsv.rows_of([("Q", "a", 1), ("Q", "b", "maybe")])
    with pytest.raises(tsv.TSVError, match="contrastive pairs"):
        tsv.rows_of(pd.DataFrame({"prompt": ["p"], "positive": ["a"], "negative": ["b"]}))
    with pytest.raises(tsv.TSVError, match="completion"):
        tsv.rows_of(pd.DataFrame({"foo": [1], "label": [1]}))


def test_format_text_wraps_questions_and_leaves_statements_alone():
    assert tsv.format_text("Where is Paris?", " France ") == \
        "Answer the question concisely. Q: Where is Paris? A: France"
    assert tsv.format_text("", "Paris is in France.") == "Paris is in France."
    already = "Answer the question concisely. Q: Where is Paris? A:"
    assert tsv.format_text(already, "France") == already + " France"


def test_group_split_never_puts_a_group_on_both_sides():
    groups = [f"g{i // 3}" for i in range(60)]
    labels = [i % 2 for i in range(60)]
    train, test = tsv.split_groups(groups, labels, 0.25, seed=3)
    assert not {groups[i] for i in train} & {groups[i] for i in test}
    assert sorted(train + test) == list(range(60))
    assert {labels[i] for i in test} == {0, 1}


def test_subsample_groups_keeps_whole_groups():
    frame = tsv.rows_of([(f"q{i // 4}", f"a{i}", i % 2, f"q{i // 4}") for i in range(40)])
    sub = tsv.subsample_groups(frame, 12, seed=0)
    assert len(sub) == 12
    assert (sub.group.value_counts() == 4).all()


# --------------------------------------------------------- tiny end-to-end
def _rows(n=24):
    rows = []
    for i in range(n):
        rows.append((f"What colour is thing {i}?", f"It is red {i}", 1, f"q{i}"))
        rows.append((f"What colour is thing {i}?", f"It is blue, no {i}", 0, f"q{i}"))
    return rows


@pytest.fixture(scope="module")
def trained(tiny):
    h = tiny("llama")
    vector, report = tsv.train(h, _rows(), layer=2, init_epochs=2, aug_epochs=2, exemplars=8, selected=8,
                               batch_size=16)
    return h, vector, report


def test_train_returns_a_tsv_record_and_a_full_report(trained):
    h, vector, report = trained
    assert vector.method == "tsv" and vector.layer == 2
    assert tuple(vector.extras["prototypes"].shape) == (2, h.arch.hidden_size)
    assert torch.allclose(vector.extras["prototypes"].norm(dim=-1), torch.ones(2), atol=1e-5)
    assert vector.hyperparameters["kappa"] == 10.0 and vector.hyperparameters["lam_raw"] > 0
    assert float(vector.direction().norm()) > 0
    assert [c["epoch"] for c in report["curves"]] == [1, 2, 3, 4]
    assert [c["stage"] for c in report["curves"]] == [1, 1, 2, 2]
    assert all(0 <= c["exemplar_accuracy"] <= 1 for c in report["curves"])
    counts = report["pseudo_labels"]["counts"]
    assert set(counts) == {"hallucinated", "truthful"} and sum(counts.values()) == report["pseudo_labels"]["selected"]
    assert 0 < report["pseudo_labels"]["selected"] <= 8
    assert 0 <= report["auroc"] <= 1
    assert set(report["baselines"]) >= {"probe", "probe_exemplars", "mean_difference_exemplars",
                                        "mean_token_logprob", "perplexity"}
    # perplexity is a monotone function of the mean log-probability: the same ranking
    assert report["baselines"]["perplexity"]["auroc"] == pytest.approx(report["baselines"]["mean_token_logprob"]["auroc"])
    assert set(report["max_abs_delta_logit"]) >= {"with_constraints", "without_constraints"}
    assert set(report["runs"]) == {"constrained", "unconstrained"}
    assert report["top_tokens"] and "token" in report["top_tokens"][0]
    assert report["rows"]["exemplars"] == 8 and report["rows"]["test"] == len(report["held_out"])


def test_detection_from_a_saved_file_matches_the_training_path(trained, tmp_path):
    h, vector, report = trained
    loaded = SteeringVector.load(vector.save(tmp_path / "tsv.safetensors"))
    held = report["held_out"]
    scores = tsv.score(h, loaded, [(r["prompt"], r["answer"]) for r in held])
    for got, row in zip(scores, held):  # hooks + padding at detection vs cached suffix at training
        assert got == pytest.approx(row["score"], abs=1e-4)
    result = tsv.detect(h, loaded, [(r["prompt"], r["answer"], r["label"]) for r in held])
    assert result["auroc"] == pytest.approx(report["auroc"], abs=1e-6)
    assert set(result["scores"][0]) == {"prompt", "answer", "score", "label"}


def test_detect_without_labels_gives_no_auroc(trained):
    h, vector, _ = trained
    out = tsv.detect(h, vector, pd.DataFrame({"prompt": ["What colour is thing 1?"], "completion": ["It is red 1"]}))
    assert out["auroc"] is None and out["scores"][0]["label"] is None


def test_detect_on_one_class_gives_no_auroc(trained):
    h, vector, report = trained
    truthful = [(r["prompt"], r["answer"], r["label"]) for r in report["held_out"] if r["label"] == 1]
    out = tsv.detect(h, vector, truthful)
    assert out["auroc"] is None and len(out["scores"]) == len(truthful)


def test_detect_refuses_a_vector_that_is_not_tsv(tiny):
    from steer_ui.vector import random_vector

    from steer_ui.vector import VectorError

    h = tiny("llama")
    with pytest.raises(VectorError, match="not a TSV vector"):
        tsv.score(h, random_vector(h.arch.hidden_size, 1), [("q", "a")])


def test_supervised_training_uses_every_training_label(tiny):
    h = tiny("llama")
    _, report = tsv.train(h, _rows(10), layer=2, supervised=True, init_epochs=1, compare=False,
                          logit_penalty=False, kl_penalty=False)
    assert report["rows"]["unlabelled"] == 0 and report["rows"]["exemplars"] == report["rows"]["train"]
    assert report["pseudo_labels"]["selected"] == 0
    assert report["max_abs_delta_logit"]["with_constraints"] is None


def test_train_rejects_unknown_settings_and_one_class(tiny):
    h = tiny("llama")
    with pytest.raises(SettingsError, match="unknown setting.*lamda"):
        tsv.train(h, _rows(4), lamda=3)
    with pytest.raises(tsv.TSVError, match="only one class"):
        tsv.train(h, [(f"q{i}", "a", 1, f"q{i}") for i in range(8)])


def test_the_methods_settings_take_the_cli_names(tiny):
    h = tiny("llama")
    # what --layer 1 --exemplars 6 --epochs 1 --no-logit-penalty --no-kl-penalty become
    settings = parse_settings(tsv.TSVSettings, {"layer": 1, "generate": "no", "exemplars": 6, "epochs": 1,
                                                "logit_penalty": False, "kl_penalty": False, "seed": 0})
    vector, report = tsv.METHOD.train(h, _rows(8), settings, lambda _f, _m: None)
    s = report["settings"]
    assert (s["layer"], s["exemplars"], s["init_epochs"], s["aug_epochs"]) == (1, 6, 1, 1)
    assert not s["logit_penalty"] and not s["kl_penalty"]
    assert vector.layer == 1 and "unconstrained" in vector.name
    assert vector.max_delta_logit is None  # no bound was trained for, so generation applies none by default


def _two_seeds(trained) -> tuple[dict, dict]:
    """The trained fixture's report (seed 0) and one more run like it with seed 1."""
    h, _vector, first = trained
    _v, second = tsv.train(h, _rows(), layer=2, init_epochs=2, aug_epochs=2, exemplars=8, selected=8,
                           batch_size=16, seed=1)
    return first, second


def test_seeds_markdown_reports_mean_sd_and_each_seed(trained):
    first, second = _two_seeds(trained)
    assert second["settings"]["seed"] == 1
    table = tsv_tables.seeds_markdown([first, second])
    pairs = [r["runs"]["constrained"]["auroc"] for r in (first, second)]
    mean = sum(pairs) / 2
    sd = abs(pairs[0] - pairs[1]) / 2 ** 0.5
    row = next(line for line in table.splitlines() if line.startswith("| TSV (constrained) |"))
    assert f"{mean:.3f} ± {sd:.3f}" in row and f"{pairs[0]:.3f}, {pairs[1]:.3f}" in row
    drops = [r["runs"]["unconstrained"]["auroc"] - r["runs"]["constrained"]["auroc"] for r in (first, second)]
    drop_row = next(line for line in table.splitlines() if line.startswith("| drop from the constraints |"))
    assert f"{drops[0]:.3f}, {drops[1]:.3f}" in drop_row
    assert "per seed (0, 1)" in table and "| full-label probe (ceiling) |" in table
    assert "| exemplar probe (TSV's labels) |" in table and "| perplexity (no training) |" in table
    # steered with the limit the vector carries: the positions over the bound are scaled to it
    checks = [r["runs"]["constrained"]["bound_check"] for r in (first, second)]
    held = min(checks[0]["limit"], max(r["runs"]["constrained"]["max_abs_delta_logit"] for r in (first, second)))
    line = next(x for x in table.splitlines() if x.startswith("Steered with the Δlogit limit the saved vector"))
    assert f"|Δlogit| {held:.3f} over the seeds'" in line
    assert f"scales {sum(c['positions_over'] for c in checks)} of {sum(c['positions'] for c in checks)} " in line
    # the verdict line checks the three conditions on these numbers
    verdict = table.splitlines()[-1]
    probe = sum(r["baselines"]["probe_exemplars"]["auroc"] for r in (first, second)) / 2
    assert verdict.startswith("Target: ") and verdict.count("met: ") + verdict.count("MISSED: ") == 3
    assert ("met: constrained" if mean > probe else "MISSED: constrained") in verdict.split(";")[1]


def test_combine_prints_the_seed_table_of_reports_from_separate_runs(trained, tmp_path, capsys):
    # seeds run in parallel processes, one --json each (one report, or a list), make the table one run would
    import json

    first, second = _two_seeds(trained)
    table = tsv_tables.seeds_markdown([first, second])
    (tmp_path / "a.json").write_text(json.dumps(first, default=str))
    (tmp_path / "b.json").write_text(json.dumps([second], default=str))
    assert tsv_tables.main(["--combine", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 0
    assert capsys.readouterr().out.strip() == table.strip()
    with pytest.raises(SystemExit):  # without --combine, --data is needed
        tsv_tables.main([])


def test_the_tables_tool_saves_the_vector_it_trained_and_reports_on(tmp_path, capsys):
    import json

    import pandas as pd

    data = tmp_path / "qa.csv"
    pd.DataFrame(_rows(), columns=["prompt", "completion", "label", "group"]).to_csv(data, index=False)
    out, report = tmp_path / "tsv.safetensors", tmp_path / "report.json"
    assert tsv_tables.main(["--data", str(data), "--model", "tiny:llama", "--layer", "1", "--epochs", "1",
                            "--exemplars", "8", "--lam", "0.2", "--json", str(report), "--vector-out", str(out)]) == 0
    capsys.readouterr()
    vector = SteeringVector.load(out)
    saved = json.loads(report.read_text())
    assert vector.method == "tsv" and vector.layers == [1] and saved["lam"] == 0.2
    assert vector.hyperparameters["steering_scale"] == pytest.approx(saved["steering_scale"])


def test_bound_sweep_measures_auroc_against_each_bound_on_the_same_split(tiny):
    h = tiny("llama")
    # λ and lr large enough that the tiny model's Δlogit (~0.6 unconstrained) crosses the tightest bound
    _v, report = tsv.train(h, _rows(), layer=2, init_epochs=3, aug_epochs=3, exemplars=8, selected=8,
                           batch_size=16, lam=1.0, lr=0.05, bound_sweep=[50, 0.05, 2.0])
    sweep = report["bound_sweep"]
    assert [row["bound"] for row in sweep] == [0.05, 2.0, 50.0, None]  # sorted, the main bound once, none last
    assert set(report["runs"]) == {"constrained", "unconstrained", "constrained, bound 0.05",
                                   "constrained, bound 50"}
    by_bound = {row["bound"]: row for row in sweep}
    assert by_bound[2.0]["auroc"] == report["runs"]["constrained"]["auroc"]
    assert by_bound[None]["max_abs_delta_logit"] == report["runs"]["unconstrained"]["max_abs_delta_logit"]
    # a bound nothing reaches leaves the hinge at zero, so that run is the main run step for step
    assert by_bound[50.0]["max_abs_delta_logit"] == pytest.approx(by_bound[2.0]["max_abs_delta_logit"], rel=1e-6)
    # a bound that binds pulls the logit change down
    assert by_bound[0.05]["max_abs_delta_logit"] < 0.6 * by_bound[50.0]["max_abs_delta_logit"]
    assert all(0 <= row["auroc"] <= 1 for row in sweep)
    table = tsv_tables.bounds_markdown([report])
    assert table.splitlines()[2].startswith("| 0.05 |") and table.splitlines()[-1].startswith("| none |")
    per_run = tsv_tables.table_markdown(report)
    assert f"| TSV (constrained, bound 0.05) | {by_bound[0.05]['auroc']:.3f} |" in per_run
    assert f"| TSV (unconstrained) | {by_bound[None]['auroc']:.3f} |" in per_run


@pytest.mark.parametrize("hp, message", [
    ({"bound_sweep": {"six": 6}}, "bound_sweep must be a list"),
    ({"bound_sweep": [6, float("nan")]}, "bound_sweep must be a finite number"),
    ({"bound_sweep": [-1]}, "bound_sweep must be at least 0"),
    ({"bound_sweep": [6], "logit_penalty": False}, "turn logit_penalty on"),
])
def test_bound_sweep_refuses_bad_bounds_by_name(tiny, hp, message):
    with pytest.raises(SettingsError, match=message):
        tsv.train(tiny("llama"), _rows(4), layer=1, init_epochs=1, **hp)


def test_parse_bounds_reads_the_cli_list_and_names_a_bad_entry():
    assert tsv_tables.parse_bounds("2, 6,20") == (2.0, 6.0, 20.0)
    assert tsv_tables.parse_bounds(None) is None
    with pytest.raises(tsv.TSVError, match="'six' is not one"):
        tsv_tables.parse_bounds("2,six")


# ------------------------------------------------------------- the template
@pytest.mark.parametrize("template", [
    "Q: {__class__} A:",
    "Q: {question.__class__} A:",
    "Q: {question.__init__.__globals__} A:",
    "Q: {0} A:",
    "Q: {} A:",
    "Q: {question!r} A:",
    "Q: {question:>999999999} A:",
    "Q: {question[0]} A:",
])
def test_the_template_refuses_every_field_but_question_and_answer(template):
    with pytest.raises(tsv.TSVError, match="only {question} and {answer}") as refused:
        tsv.format_text("Where is Paris?", "France", template)
    assert "\n" not in str(refused.value)


def test_the_template_fills_question_and_answer_and_keeps_literal_braces():
    assert tsv.format_text("Where is Paris?", "France", "Q: {question} A:") == "Q: Where is Paris? A: France"
    template = "{{quiz}} Q: {question}\nA: {answer}."
    assert tsv.format_text("Where is Paris?", " France ", template) == "{quiz} Q: Where is Paris?\nA: France."
    assert tsv.prefix_text("Where is Paris?", template) == "{quiz} Q: Where is Paris?\nA: "
    # a question that itself contains braces is text, not a field
    assert tsv.format_text("What is {0}?", "x") == "Answer the question concisely. Q: What is {0}? A: x"


@pytest.mark.parametrize("template, message", [
    ("no field at all", "must contain '{question}'"),
    ("{answer} then {question}", "once, after every"),
    ("Q: {question} A: {answer} {answer}", "once, after every"),
    ("Q: {question", "literal braces"),
    ("Q: {question} " + "x" * 600, "limit is 500"),
])
def test_the_template_names_what_is_wrong(template, message):
    with pytest.raises(tsv.TSVError, match=message):
        tsv.template_pieces(template)


# ---------------------------------------------------------------- settings
@pytest.mark.parametrize("values, message", [
    ({"epochs": 10**9}, "init_epochs must be at most 200"),
    ({"bound_sweep": list(range(100))}, "bound_sweep has 100 values; the limit is 16"),
    ({"lamda": 3}, "unknown setting.*lamda"),
    ({"exemplars": 1}, "exemplars must be at least 2"),
    ({"batch_size": 10**6}, "batch_size must be at most 1024"),
    ({"max_rows": 0}, "max_rows must be at least 1"),
    ({"kappa": 0}, "kappa must be > 0"),
    ({"template": "Q: {question.__class__}"}, "only {question} and {answer}"),
    ({"template": "x" * 501}, "template is 501 characters long"),
])
def test_parse_settings_holds_the_bounds(values, message):
    with pytest.raises(SettingsError, match=message):
        parse_settings(tsv.TSVSettings, values)


def test_the_epochs_alias_sets_both_stages_and_none_means_the_default():
    s = parse_settings(tsv.TSVSettings, {"epochs": "3", "layer": None, "max_rows": None, "bound_sweep": "6, 20"})
    assert (s.init_epochs, s.aug_epochs, s.layer, s.max_rows, s.bound_sweep) == (3, 3, None, None, (6.0, 20.0))
    assert parse_settings(tsv.TSVSettings, {"epochs": 3, "aug_epochs": 1}).aug_epochs == 1


def test_train_checks_a_hand_built_settings_too(tiny):
    with pytest.raises(SettingsError, match="init_epochs must be at most 200"):
        tsv.METHOD.train(tiny("llama"), _rows(4), tsv.TSVSettings(init_epochs=10**6), lambda _f, _m: None)


# ------------------------------------------------- a vector from elsewhere
def _tampered(vector, **changes):
    hyper = {**vector.hyperparameters, **changes.pop("hyperparameters", {})}
    extras = {**vector.extras, **changes.pop("extras", {})}
    return SteeringVector(directions=dict(vector.directions), hidden_size=vector.hidden_size, method=vector.method,
                          model_id=vector.model_id, model_type=vector.model_type, positions=vector.positions,
                          name=vector.name, hyperparameters=hyper, extras=extras)


@pytest.mark.parametrize("changes, message", [
    ({"hyperparameters": {"kappa": float("inf")}}, "kappa must be a number in"),
    ({"hyperparameters": {"kappa": 1e9}}, "kappa must be a number in"),
    ({"hyperparameters": {"kappa": -1.0}}, "kappa must be a number in"),
    ({"hyperparameters": {"kappa": "10"}}, "kappa must be a number in"),
    ({"hyperparameters": {"template": "{question.__class__.__mro__}"}}, "stored template may use only"),
    ({"hyperparameters": {"template": "Q: {question:>999999999}"}}, "stored template may use only"),
    ({"hyperparameters": {"template": 42}}, "template must be text"),
    ({"extras": {"prototypes": torch.zeros(3, 64)}}, r"shape \(3, 64\), expected \(2, 64\)"),
    ({"hyperparameters": {"detector_alpha": 0.5}}, "detector_alpha must be a number in"),
    ({"hyperparameters": {"detector_alpha": float("nan")}}, "detector_alpha must be a number in"),
    ({"hyperparameters": {"detector_alpha": "2"}}, "detector_alpha must be a number in"),
])
def test_score_refuses_a_tampered_vector_before_running_the_model(trained, changes, message):
    from steer_ui.model.capture import recording
    from steer_ui.vector import VectorError

    h, vector, _ = trained
    bad = _tampered(vector, **changes)
    with recording(h, [0, vector.layer]) as seen:
        with pytest.raises(VectorError, match=message) as refused:
            tsv.score(h, bad, [("What colour is thing 1?", "It is red 1")])
        with pytest.raises(VectorError, match=message):
            tsv.detect(h, bad, [("What colour is thing 1?", "It is red 1", 1)])
    assert not seen, "the model ran before the vector was checked"
    assert "\n" not in str(refused.value)


def test_a_vector_with_non_finite_prototypes_cannot_even_be_built(trained):
    """NaN prototypes are refused where every vector is checked, before TSV's own check could see them."""
    from steer_ui.vector import VectorError

    _h, vector, _ = trained
    with pytest.raises(VectorError, match="NaN or inf"):
        _tampered(vector, extras={"prototypes": torch.full((2, 64), float("nan"))})


# ------------------------------------------------- layer, positions, sweep
def test_the_default_block_is_the_papers_relative_depth(tiny):
    # LLaMA-3.1-8B: block 9 of 32 in the paper; Gemma 3 270M: block 5 of 18; a 4-block tiny model: block 1
    assert [tsv.default_layer(n) for n in (32, 18, 26, 4, 1)] == [9, 5, 7, 1, 0]
    h = tiny("llama")
    vector, report = tsv.train(h, _rows(8), init_epochs=1, aug_epochs=0, exemplars=6, compare=False)
    assert vector.layer == report["layer"] == 1 and report["layer_sweep"] is None


def test_generation_positions_are_those_whose_logits_produce_the_answer(tiny):
    from steer_ui.methods import constraints as C
    from steer_ui.methods.tsv.training import answer_lengths, generation_positions

    h = tiny("llama")  # byte-level tokenizer: one token per byte, BOS first
    frame = tsv.rows_of([("What colour is it?", "Red.", 1, "g"), ("", "Paris is in France.", 1, "s"),
                         ("Why?", "Because it rains a lot here", 0, "w")])
    texts = [tsv.format_text(p, a) for p, a in zip(frame.prompt, frame.completion)]
    n_answer = answer_lengths(h, frame, texts, tsv.PROMPT_TEMPLATE, range(3))
    assert n_answer == {0: len(" Red."), 1: len("Paris is in France."), 2: len(" Because it rains a lot here")}
    (batch,) = C.cache_prefix(h, texts, 1, batch_size=8)
    seq = batch.input_ids.shape[1]
    for where in ("answer", "answer_and_end", "last"):
        rows, positions = generation_positions(batch, n_answer, where=where)
        for p, i in enumerate(batch.index):
            mine = [pos for r, pos in zip(rows, positions) if r == p]
            if where == "last":
                assert mine == [seq - 1]
                continue
            # the token each position predicts is the next one: together, exactly the answer's tokens
            predicted = batch.input_ids[p, [pos + 1 for pos in mine if pos + 1 < seq]].tolist()
            answer_ids = h.tokenizer(texts[i]).input_ids[-n_answer[i]:]
            assert predicted == answer_ids
            assert (seq - 1 in mine) == (where == "answer_and_end")  # the detector's position
    rows, _ = generation_positions(batch, n_answer, rows=1)
    assert set(rows) == {0}


def test_constraints_at_the_generation_positions_bound_the_logits_there(tiny):
    h = tiny("llama")
    # a strong vector (λ = the residual norm) and a tight bound, so the penalty has something to do
    _v, report = tsv.train(h, _rows(), layer=1, init_epochs=3, aug_epochs=3, exemplars=8, selected=8, lam=1.0,
                           max_logit_change=0.05, logit_weight=5.0, penalty_positions="answer")
    constrained, free = report["runs"]["constrained"], report["runs"]["unconstrained"]
    assert constrained["max_abs_delta_logit"] < 0.5 * free["max_abs_delta_logit"]
    assert report["max_abs_delta_logit"]["with_constraints"] == constrained["max_abs_delta_logit"]
    assert report["penalty_positions"] == "answer"
    # the centred change never exceeds twice the raw one (the mean moves by at most the max)
    assert constrained["max_abs_delta_logit"] <= 2 * constrained["max_abs_raw_delta_logit"] + 1e-6
    assert set(constrained["last_position"]) == {"max_abs_delta_logit", "max_abs_raw_delta_logit", "mean_kl"}


def test_the_bound_check_names_where_the_held_out_positions_break_the_bound(tiny):
    h = tiny("llama")
    _v, report = tsv.train(h, _rows(), layer=1, init_epochs=2, aug_epochs=2, exemplars=8, selected=8, lam=1.0,
                           max_logit_change=0.05, bound_sweep=(0.01,))
    constrained = report["runs"]["constrained"]
    check = constrained["bound_check"]
    assert check["limit"] == 0.05 and report["runs"]["unconstrained"]["bound_check"] is None
    assert check["rows"] == report["rows"]["test"]
    assert check["positions"] >= check["rows"]  # every held-out row has at least one generation position
    # the worst row's worst position is the run's maximum, and the rows come worst first
    worst = [w["max_abs_delta_logit"] for w in check["worst_rows"]]
    assert worst == sorted(worst, reverse=True) and len(worst) == min(3, check["rows"])
    assert worst[0] == pytest.approx(constrained["max_abs_delta_logit"], rel=1e-5)
    held_out = {(r["prompt"], r["answer"]) for r in report["held_out"]}
    assert all((w["prompt"], w["answer"]) in held_out for w in check["worst_rows"])
    assert (check["positions_over"] > 0) == (constrained["max_abs_delta_logit"] > 0.05)
    assert check["rows_over"] <= min(check["rows"], check["positions_over"])
    # a swept run is checked against its own bound, not the main one
    swept = report["runs"]["constrained, bound 0.01"]["bound_check"]
    assert swept["limit"] == 0.01
    held = check["positions"] - check["positions_over"]
    assert check["note"].startswith(f"The |Δlogit| bound 0.05 held at {held} of {check['positions']} held-out")
    # steered with the limit the vector carries, the same positions keep the bound: those over it are scaled
    # down to it, keeping limit / their maximum of their change at least
    limited = check["with_limit"]
    assert limited["positions_limited"] == check["positions_over"]
    assert limited["max_abs_delta_logit"] == pytest.approx(min(worst[0], 0.05))
    assert limited["least_kept"] == pytest.approx(min(1.0, 0.05 / worst[0]))
    assert _v.max_delta_logit == 0.05  # the saved vector states its bound, for generation to hold
    assert check["note"] in tsv_tables.table_markdown(report)
    from steer_ui.ui.train_tab import train_outputs  # and the Train tab shows it under the status
    status, *_ = train_outputs(None, "en", "tsv L1", report)
    assert status.endswith(check["note"])


def test_the_layer_sweep_trains_each_candidate_and_keeps_the_best_on_validation(tiny):
    h = tiny("llama")
    _v, report = tsv.train(h, _rows(), layer_sweep=3, sweep_epochs=1, init_epochs=1, aug_epochs=1, exemplars=8,
                           selected=8, compare=False)
    sweep = report["layer_sweep"]
    assert [c["layer"] for c in sweep["candidates"]] == [0, 1, 2]  # centred on the paper's depth, block 1
    best = max(sweep["candidates"], key=lambda c: c["validation_auroc"])
    assert sweep["best"] == best["layer"] == report["layer"]
    assert sweep["validation_rows"] > 0 and sweep["epochs_per_candidate"] == 1
    help_text = tsv.TSVSettings.__dataclass_fields__["layer_sweep"].metadata["help"]  # what the form shows
    assert "Cost" in help_text and "sweep_epochs" in help_text


def test_first_questions_keeps_whole_groups_in_file_order():
    from steer_ui.data import load_dataset

    frame = pd.DataFrame({"Question": ["q1", "q2", "q3"], "Correct Answers": ["a; b", "c", "d"],
                          "Incorrect Answers": ["x", "y; z", "w"]})
    data = load_dataset(frame)
    cut = tsv_tables.first_questions(data, 2)
    assert cut.schema == "truthfulqa" and list(dict.fromkeys(cut.frame.group)) == ["q1", "q2"]
    assert len(cut.frame) == 6 and tsv.is_question_table(cut)
    assert tsv_tables.first_questions(data, None) is data
