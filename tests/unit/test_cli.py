import dataclasses
import json

import pytest
import torch

from steer_ui.cli import main
from steer_ui.vector import SteeringVector, random_vector


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_generate_json_is_one_object(capsys):
    code, out, _ = run(capsys, "generate", "--model", "tiny:llama", "--prompt", "hi", "--random-vector", "3",
                       "--alpha", "5", "--max-new-tokens", "4", "--json")
    assert code == 0
    data = json.loads(out)  # exactly one JSON document
    assert set(data) >= {"unsteered", "steered"}
    assert len(data["steered"]["tokens"]) <= 4
    tok = data["steered"]["tokens"][0]
    assert {"token", "logprob", "delta_logit", "direct_delta_logit"} <= set(tok)


def test_generate_with_a_delta_logit_limit(capsys):
    args = ("generate", "--model", "tiny:llama", "--prompt", "hi", "--random-vector", "3", "--alpha", "8",
            "--max-new-tokens", "4", "--json")
    code, out, _ = run(capsys, *args, "--max-delta-logit", "0.2")
    assert code == 0
    tokens = json.loads(out)["steered"]["tokens"]
    assert all(t["kept"] * t["max_delta_logit"] <= 0.2 + 1e-4 for t in tokens) and any(t["kept"] < 1 for t in tokens)
    code, out, _ = run(capsys, *args, "--max-delta-logit", "-1")
    # the CLI asks through the app's door, so it refuses in the app's words
    assert code == 2 and json.loads(out)["error"] == "The Δlogit limit must be at least 0, got -1.0."


def test_generate_holds_the_bound_a_vector_states_unless_told_otherwise(capsys, tiny, tmp_path):
    """A vector that states its Δlogit bound (a constrained TSV vector does) is steered within it by default."""
    bounded = dataclasses.replace(random_vector(tiny("llama").arch.hidden_size, 1, seed=3), max_delta_logit=0.2)
    path = bounded.save(tmp_path / "bounded.safetensors")
    args = ("generate", "--model", "tiny:llama", "--prompt", "hi", "--vector", str(path), "--alpha", "8",
            "--relative", "--max-new-tokens", "4", "--json")
    code, out, _ = run(capsys, *args)
    assert code == 0
    data = json.loads(out)
    assert data["max_delta_logit"] == 0.2
    tokens = data["steered"]["tokens"]
    assert all(t["kept"] * t["max_delta_logit"] <= 0.2 + 1e-4 for t in tokens) and any(t["kept"] < 1 for t in tokens)
    code, out, _ = run(capsys, *args, "--max-delta-logit", "0")  # 0 turns it off
    data = json.loads(out)
    assert code == 0 and data["max_delta_logit"] == 0 and "kept" not in data["steered"]["tokens"][0]


def test_next_token_json(capsys):
    code, out, _ = run(capsys, "next-token", "--model", "tiny:gpt2", "--prompt", "hi", "--random-vector", "1",
                       "--layer", "2", "--alpha", "0.5", "--relative", "--top-k", "4", "--json")
    assert code == 0
    data = json.loads(out)
    assert len(data["unsteered"]) == 4 and {"kl", "max_abs_delta_logit", "promoted", "suppressed"} <= set(data)


def test_sweep_json(capsys):
    code, out, _ = run(capsys, "sweep", "--model", "tiny:llama", "--prompt", "hi", "--random-vector", "1",
                       "--alphas", "0,1,2", "--json")
    assert code == 0
    rows = json.loads(out)["rows"]
    assert [r["alpha_requested"] for r in rows] == [0, 1, 2] and rows[0]["kl"] == pytest.approx(0, abs=1e-6)


def test_errors_are_one_line_json(capsys, tmp_path):
    code, out, err = run(capsys, "generate", "--model", "tiny:llama", "--prompt", " ", "--json")
    assert code == 2 and json.loads(out) == {"error": "The prompt is empty: type some text to continue."}
    assert "Traceback" not in err
    wrong = random_vector(32, 1, seed=0).save(tmp_path / "small.safetensors")
    code, out, _ = run(capsys, "next-token", "--model", "tiny:llama", "--prompt", "x", "--vector", str(wrong),
                       "--alpha", "1", "--json")
    assert code == 2 and "hidden size 32" in json.loads(out)["error"] and "64" in json.loads(out)["error"]
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"not a tensor file")
    code, out, _ = run(capsys, "next-token", "--model", "tiny:llama", "--prompt", "x", "--vector", str(junk), "--json")
    assert code == 2 and "junk.safetensors" in json.loads(out)["error"]


def test_vector_record_roundtrip(tmp_path):
    vec = SteeringVector(directions={3: torch.randn(64)}, hidden_size=64, method="mean-diff", model_id="m",
                         hyperparameters={"lr": 0.1}, metrics={"auroc": 0.9}, alpha_range=(-1, 1),
                         extras={"prototypes": torch.randn(2, 64)})
    back = SteeringVector.load(vec.save(tmp_path / "v.safetensors"))
    assert torch.equal(back.direction(3), vec.direction(3)) and torch.equal(back.extras["prototypes"], vec.extras["prototypes"])
    assert back.metadata() == vec.metadata()


def test_sweep_refuses_input_dependent_vectors_in_one_line(capsys, tmp_path, tiny):
    from steer_ui.methods import l2s

    handle = tiny("llama")
    import pandas as pd

    pairs = pd.DataFrame({"prompt": [f"p{i} is" for i in range(12)], "positive": [f" a{i}" for i in range(12)],
                          "negative": [f" b{i}" for i in range(12)], "group": [f"g{i}" for i in range(12)]})
    vector, _ = l2s.train(handle, pairs, layer=2, context_layer=1, hidden=16, epochs=2, eval_limit=2)
    path = vector.save(tmp_path / "l2s.safetensors")
    code, out, _ = run(capsys, "sweep", "--model", "tiny:llama", "--prompt", "hi", "--vector", str(path), "--json")
    assert code == 2 and "input-dependent" in json.loads(out)["error"]


def test_bench_decode_flag_picks_the_decode_path(capsys, monkeypatch):
    from steer_ui.model import static_decode

    # the flag sets the variable for the process; setting it here first makes monkeypatch remove it afterwards
    monkeypatch.setenv(static_decode.ENV, "auto")
    code, out, _ = run(capsys, "bench", "--model", "tiny:llama", "--device", "cpu", "--quick", "--decode", "static",
                       "--json")
    assert code == 0
    path = json.loads(out)["side_by_side"]["decode_path"]
    assert path["path"] == "static (eager)" and "eagerly" in path["reason"]


def test_compare_reports_rows_and_summary_as_json_and_csv(capsys, tmp_path):
    from steer_ui.service import DATASETS_DIR

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The capital of France is\nMy favourite food is\n")
    common = ("--model", "tiny:llama", "--random-vector", "3", "--layer", "1", "--alpha", "0.5", "--relative",
              "--max-new-tokens", "4")
    code, out, _ = run(capsys, "compare", *common, "--prompts", str(prompts), "--json")
    data = json.loads(out)
    assert code == 0 and [r["prompt"] for r in data["rows"]] == ["The capital of France is", "My favourite food is"]
    assert {"unsteered", "steered", "kl", "fluency", "concept_score"} <= set(data["rows"][0])
    code, out, _ = run(capsys, "compare", *common, "--data", str(DATASETS_DIR / "sentiment_pairs.csv"),
                       "--alphas=-1,0,1", "--csv")
    header, first = out.splitlines()[:2]
    assert code == 0 and header.split(",")[-2:] == ["margins", "steerability"]
    code, out, _ = run(capsys, "compare", *common, "--prompts", str(tmp_path / "missing.txt"), "--json")
    assert code == 2 and "--prompts" in json.loads(out)["error"]


def test_steering_spec_on_the_command_line_combines_vector_files_as_their_sum(capsys, tiny, tmp_path):
    """Issue #48: --steering takes several vectors (files here, on the command line only) in EasySteer's words;
    two at one layer give what their weighted sum saved as one file gives."""
    hidden = tiny("llama").arch.hidden_size
    v1, v2 = random_vector(hidden, 1, seed=1), random_vector(hidden, 1, seed=2)
    p1, p2 = v1.save(tmp_path / "v1.safetensors"), v2.save(tmp_path / "v2.safetensors")
    both = dataclasses.replace(v1, directions={1: 2.0 * v1.direction(1) - 1.5 * v2.direction(1)})
    summed = both.save(tmp_path / "sum.safetensors")
    spec = {"vectors": [{"source": str(p1), "scale": 2.0, "normalize": False},
                        {"source": str(p2), "alpha": -1.5, "layer": 1, "normalize": False}]}
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(spec))
    common = ("--model", "tiny:llama", "--prompt", "The weather today is", "--json")
    code, out, _ = run(capsys, "next-token", *common, "--steering", str(spec_file))
    two = json.loads(out)
    sources = [t["source"] for t in two["steering"]["vectors"]]
    assert code == 0 and len(set(sources)) == 2 and not any("/" in s for s in sources)  # imported, then by name
    code, out, _ = run(capsys, "next-token", *common, "--vector", str(summed), "--alpha", "1")
    one = json.loads(out)
    assert two["kl"] == pytest.approx(one["kl"], abs=1e-5) and one["kl"] > 1e-4
    assert [t["token"] for t in two["steered"]] == [t["token"] for t in one["steered"]]
    code, out, _ = run(capsys, "generate", *common, "--steering", json.dumps(spec), "--max-new-tokens", "6")
    code_one, out_one, _ = run(capsys, "generate", *common, "--vector", str(summed), "--alpha", "1",
                               "--max-new-tokens", "6")
    assert code == code_one == 0
    assert json.loads(out)["steered"]["text"] == json.loads(out_one)["steered"]["text"]
    assert json.loads(out)["raw_alpha"] == [2.0, -1.5]


def test_a_bad_steering_spec_is_one_line(capsys):
    code, out, _ = run(capsys, "next-token", "--model", "tiny:llama", "--prompt", "hi", "--json", "--steering",
                       '{"vectors": [{"source": "random", "scale": 1, "algorithm": "direct"}]}')
    assert code == 2 and json.loads(out)["error"].startswith("Steering term 1 has a field this app does not take")
