"""The CLI's ``train --method tsv`` and ``detect`` on a tiny model: one JSON object each."""
from __future__ import annotations

import json

from steer_ui import cli


def _csv(tmp_path):
    path = tmp_path / "answers.csv"
    lines = ["question,answer,label"]
    for i in range(12):
        lines += [f"What colour is thing {i}?,It is red {i},true", f"What colour is thing {i}?,It is blue {i},false"]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_train_then_detect_print_one_json_object_each(tmp_path, capsys):
    data = _csv(tmp_path)
    out = tmp_path / "tsv.safetensors"
    code = cli.main(["train", "--method", "tsv", "--model", "tiny:llama", "--data", str(data), "--layer", "2",
                     "--exemplars", "6", "--epochs", "1", "--out", str(out), "--json"])
    trained = json.loads(capsys.readouterr().out)
    assert code == 0, trained
    assert trained["method"] == "tsv" and out.is_file()
    report = trained["report"]
    assert {"auroc", "baselines", "max_abs_delta_logit", "curves", "pseudo_labels"} <= set(report)
    code = cli.main(["detect", "--model", "tiny:llama", "--vector", str(out), "--data", str(data), "--json"])
    detected = json.loads(capsys.readouterr().out)
    assert code == 0, detected
    assert len(detected["scores"]) == 24
    assert set(detected["scores"][0]) >= {"prompt", "answer", "score", "label"}
    assert 0.0 <= detected["auroc"] <= 1.0


def test_detect_with_a_non_tsv_vector_is_a_one_line_error(tmp_path, capsys):
    from steer_ui.vector import random_vector

    vec = random_vector(64, 1).save(tmp_path / "random.safetensors")
    code = cli.main(["detect", "--model", "tiny:llama", "--vector", str(vec), "--data", str(_csv(tmp_path)),
                     "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 2 and "detection needs a TSV vector" in out["error"]  # the app's words: the CLI asks its door


def test_constraint_bound_and_weights_reach_training_and_bad_ones_are_refused(tmp_path, capsys):
    data = _csv(tmp_path)
    out = tmp_path / "tsv.safetensors"
    code = cli.main(["train", "--method", "tsv", "--model", "tiny:llama", "--data", str(data), "--layer", "2",
                     "--exemplars", "6", "--epochs", "1", "--max-logit-change", "0.5", "--logit-weight", "0.7",
                     "--kl-weight", "0.3", "--out", str(out), "--json"])
    trained = json.loads(capsys.readouterr().out)
    assert code == 0, trained
    settings = trained["report"]["settings"]
    assert (settings["max_logit_change"], settings["logit_weight"], settings["kl_weight"]) == (0.5, 0.7, 0.3)
    assert trained["report"]["max_abs_delta_logit"]["limit"] == 0.5
    # the CLI names each setting by its flag (issue #32: an error names what the interface accepts)
    for flag, value, message in (("--kl-weight", "-1", "--kl-weight must be at least 0"),
                                 ("--max-logit-change", "nan", "--max-logit-change must be a finite number")):
        code = cli.main(["train", "--method", "tsv", "--model", "tiny:llama", "--data", str(data), "--layer", "2",
                         "--epochs", "1", flag, value, "--out", str(tmp_path / "bad.safetensors"), "--json"])
        refused = json.loads(capsys.readouterr().out)
        assert code == 2 and message in refused["error"], refused
        assert not (tmp_path / "bad.safetensors").exists()


def test_bound_sweep_flag_reaches_the_report_and_a_bad_list_is_refused(tmp_path, capsys):
    data = _csv(tmp_path)
    out = tmp_path / "tsv.safetensors"
    code = cli.main(["train", "--method", "tsv", "--model", "tiny:llama", "--data", str(data), "--layer", "2",
                     "--exemplars", "6", "--epochs", "1", "--bound-sweep", "0.5,8", "--out", str(out), "--json"])
    trained = json.loads(capsys.readouterr().out)
    assert code == 0, trained
    assert [row["bound"] for row in trained["report"]["bound_sweep"]] == [0.5, 2.0, 8.0, None]
    code = cli.main(["train", "--method", "tsv", "--model", "tiny:llama", "--data", str(data), "--layer", "2",
                     "--epochs", "1", "--bound-sweep", "2,x", "--out", str(tmp_path / "bad.safetensors"), "--json"])
    refused = json.loads(capsys.readouterr().out)
    assert code == 2 and "--bound-sweep must be a number, got 'x'" in refused["error"], refused
    assert not (tmp_path / "bad.safetensors").exists()
