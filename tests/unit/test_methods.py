"""Mean-diff, probe, PCA and ITI: the maths on synthetic data, the pipeline on tiny models."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from steer_ui.data import Dataset, DatasetError
from steer_ui.model.capture import head_geometry, out_projection
from steer_ui.methods import iti, mean_diff, pca, probe, probe_layers, train
from steer_ui.methods.common import alpha_range_from_kl, class_separation
from steer_ui.model.hooks import StepState, hook_count, steering
from steer_ui.steering import build_steers
from steer_ui.vector import SteeringVector


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("STEER_UI_CACHE", str(tmp_path / "cache"))


def separable(n_groups: int = 12) -> Dataset:
    """Statements a random tiny model separates: positives are full of 'a', negatives of 'z'."""
    rows = []
    for g in range(n_groups):
        rows.append({"prompt": "", "completion": f"item {g}: " + "aaaa " * 4, "label": 1, "group": f"g{g}"})
        rows.append({"prompt": "", "completion": f"item {g}: " + "zzzz " * 4, "label": 0, "group": f"g{g}"})
    return Dataset(frame=pd.DataFrame(rows), kind="statements", schema="statements", source="separable")


# ------------------------------------------------------------------ maths
def synthetic(n=200, d=16, seed=0):
    rng = np.random.default_rng(seed)
    y = np.r_[np.ones(n // 2, dtype=int), np.zeros(n // 2, dtype=int)]
    x = rng.normal(size=(n, d))
    x[:, 3] += np.where(y == 1, 2.0, -2.0)  # the signal lives on axis 3
    x[:, 0] *= 10.0  # a high-variance nuisance axis
    return torch.tensor(x, dtype=torch.float32), y


def test_mean_diff_is_difference_of_class_means_and_normalises():
    x, y = synthetic()
    vec, info = mean_diff.direction(x, y)
    expected = x[y == 1].double().mean(0) - x[y == 0].double().mean(0)
    assert torch.allclose(vec.double(), expected, atol=1e-5)
    unit, _ = mean_diff.direction(x, y, normalize=True)
    assert abs(float(unit.norm()) - 1) < 1e-5 and info["raw_norm"] == pytest.approx(float(expected.norm()), rel=1e-5)
    assert float(vec @ (x[y == 1].mean(0) - x[y == 0].mean(0))) > 0


def test_probe_direction_finds_the_signal_axis_and_points_to_positive():
    x, y = synthetic()
    vec, info = probe.direction(x, y)
    unit = vec / vec.norm()
    assert float(unit[3]) > 0.8  # mostly the signal axis, positive sign
    assert abs(float(unit[0])) < 0.1  # the high-variance nuisance axis is ignored
    assert float(vec.norm()) == pytest.approx(class_separation(vec, x, y), rel=1e-4)  # raw α=1 = class gap
    flipped, _ = probe.direction(x, 1 - y)
    assert float(flipped[3]) < 0
    normed, _ = probe.direction(x, y, normalize=True)
    assert float(normed.norm()) == pytest.approx(1.0, abs=1e-5)


def test_pca_of_differences_sign_fixed():
    rng = np.random.default_rng(1)
    d = 12
    axis = torch.zeros(d)
    axis[5] = 1.0
    base = torch.tensor(rng.normal(size=(40, d)), dtype=torch.float32)
    size = torch.tensor(rng.uniform(0.5, 3.0, size=(40, 1)), dtype=torch.float32)
    pos, neg = base + size * axis, base - size * axis + 0.01 * torch.randn(40, d)
    vec, info = pca.direction(pos, neg)
    unit = vec / vec.norm()
    assert float(unit[5]) > 0.95 and info["explained_variance_ratio"] > 0.9
    swapped, _ = pca.direction(neg, pos)
    assert float((swapped / swapped.norm())[5]) < -0.95
    normed, _ = pca.direction(pos, neg, normalize=True)
    assert float(normed.norm()) == pytest.approx(1.0, abs=1e-5)


def test_alpha_range_stops_at_first_breach():
    (low, high), table = alpha_range_from_kl(lambda alphas: np.array([abs(a) ** 2 for a in alphas]),
                                             grid=(0.25, 0.5, 1.0, 2.0), bound=1.0)
    assert (low, high) == (-1.0, 1.0) and len(table) == 8
    (low, high), _ = alpha_range_from_kl(lambda alphas: np.array([a if a > 0 else 9.0 for a in alphas]),
                                         grid=(0.25, 0.5, 1.0, 2.0), bound=1.0)
    assert (low, high) == (-0.25, 1.0)  # nothing negative passes: the smallest step is reported


# ------------------------------------------------------------------ pipeline
def test_probe_layers_report_shape(tiny):
    handle = tiny("llama")
    out = probe_layers(handle, separable(), position="mean")
    assert [r["layer"] for r in out["layers"]] == list(range(handle.arch.num_layers))
    assert set(out["layers"][0]) >= {"layer", "auroc", "accuracy", "mean_diff_auroc", "cv_auroc"}
    assert 0 <= out["best_layer"] < handle.arch.num_layers
    assert out["layers"][out["best_layer"]]["auroc"] >= 0.9
    json.dumps(out, allow_nan=False)  # one strict JSON object for the CLI


@pytest.mark.parametrize("method", ["mean-diff", "probe", "pca"])
def test_residual_methods_on_tiny_model(tiny, tmp_path, method):
    handle = tiny("llama")
    data = separable()
    vector, report = train(handle, data, method, layer=2, position="mean")
    assert vector.method == method and vector.layers == [2] and vector.hidden_size == handle.arch.hidden_size
    assert vector.model_id == handle.model_id and vector.dataset_hash == data.content_hash
    assert vector.hyperparameters["position"] == "mean"
    low, high = vector.alpha_range
    assert low < 0 < high
    assert vector.metrics["test_auroc"] >= 0.9 and report["metrics"]["train_rows"] + report["metrics"]["test_rows"] == 24
    # sign: positive rows project higher than negative ones
    from steer_ui.data.activations import extract

    acts = extract(handle, data, position="mean")
    assert class_separation(vector.direction(2), acts.layer(2), acts.labels) > 0
    loaded = SteeringVector.load(vector.save(tmp_path / "v.safetensors"))
    assert torch.equal(loaded.direction(2), vector.direction(2)) and loaded.alpha_range == vector.alpha_range


def test_normalize_hyperparameter(tiny):
    vector, _ = train(tiny("llama"), separable(), "mean-diff", layer=1, normalize=True)
    assert float(vector.direction(1).norm()) == pytest.approx(1.0, abs=1e-5)


def test_layer_chosen_without_test_split(tiny):
    vector, report = train(tiny("llama"), separable(), "probe", position="mean")
    assert report["layer_selection"] != "given" and vector.layer == report["layer"]
    assert all("auroc" not in r for r in report["layer_selection"])  # only train-split CV numbers


def test_pairs_dataset_trains_pca_and_mean_diff(tiny):
    frame = pd.DataFrame({"prompt": [f"Story {i}:" for i in range(10)], "positive": ["aaaa aaaa"] * 10,
                          "negative": ["zzzz zzzz"] * 10, "group": [f"g{i}" for i in range(10)]})
    pairs = Dataset(frame=frame, kind="pairs", schema="pairs", source="pairs")
    for method, hp in (("pca", {"center": False}), ("mean-diff", {})):
        vector, report = train(tiny("llama"), pairs, method, layer=3, **hp)
        assert report["metrics"]["train_auroc"] > 0.9, method
    # repeng's centred PCA drops the (here nearly constant) mean difference; its sign is still voted by the
    # training pairs: more of them have the positive side projecting higher.
    vector, report = train(tiny("llama"), pairs, "pca", layer=3)
    assert vector.hyperparameters["center"] is True and 0 < report["metrics"]["explained_variance_ratio"] <= 1
    from steer_ui.data import split_indices
    from steer_ui.data.activations import extract

    labelled = pairs.as_labelled()
    train_rows, _ = split_indices(labelled, seed=0)
    x = extract(tiny("llama"), pairs).layer(3)
    pos = [i for i in train_rows if i % 2 == 0]
    gap = (x[pos] - x[[i + 1 for i in pos]]) @ vector.direction(3)
    assert int((gap > 0).sum()) >= int((gap < 0).sum())


def test_single_class_split_is_a_clear_error(tiny):
    """One true row: the stratified split keeps it for training, so held-out scoring must refuse clearly."""
    rows = [{"prompt": "", "completion": f"s{i}", "label": int(i == 0), "group": f"g{i}"} for i in range(8)]
    data = Dataset(frame=pd.DataFrame(rows), kind="statements", schema="statements", source="lop")
    with pytest.raises(DatasetError, match="test split has a single class"):
        probe_layers(tiny("llama"), data)


def test_unknown_method(tiny):
    from steer_ui.methods import SettingsError

    with pytest.raises(SettingsError, match="unknown method 'nope'"):
        train(tiny("llama"), separable(), "nope")


# ------------------------------------------------------------------ ITI
def test_iti_trains_heads_heatmap_and_extras(tiny, tmp_path):
    handle = tiny("llama")
    n_heads, head_dim = head_geometry(handle)
    vector, report = train(handle, separable(), "iti", top_heads=3, position="mean")
    assert vector.method == "iti" and vector.extras["iti.heads"].shape == (3, 2)
    assert vector.extras["iti.shifts"].shape == (3, head_dim)
    heat = report["heatmap"]
    assert len(heat) == handle.arch.num_layers and len(heat[0]) == n_heads
    assert sorted(h[2] for h in report["heads"])[-1] == max(max(r) for r in heat)  # the best head is chosen
    assert set(vector.layers) == {int(l) for l, _ in vector.extras["iti.heads"].tolist()}
    assert vector.alpha_range[0] < 0 < vector.alpha_range[1]
    loaded = SteeringVector.load(vector.save(tmp_path / "iti.safetensors"))
    assert torch.equal(loaded.extras["iti.shifts"], vector.extras["iti.shifts"])
    steers = build_steers(handle, loaded, 1.0, relative=True)
    assert len(steers) == 1 and isinstance(steers[0], iti.HeadSteer)


def test_iti_shift_signs_point_to_positive_class(tiny):
    handle = tiny("llama")
    data = separable()
    vector, _ = train(handle, data, "iti", top_heads=4, position="mean")
    from steer_ui.data.activations import extract

    acts = extract(handle, data, position="mean", site="heads")
    heads = acts.heads(head_geometry(handle)[0])
    y = torch.as_tensor(acts.labels)
    for (layer, h), shift in zip(vector.extras["iti.heads"].tolist(), vector.extras["iti.shifts"]):
        x = heads[:, layer, h, :]
        assert float((x[y == 1].mean(0) - x[y == 0].mean(0)) @ shift) > 0


def test_head_steer_per_row_alpha_and_exact_output_projection_shift(tiny):
    """α=0 rows are untouched; the o_proj output moves by exactly α·W_O·shift."""
    handle = tiny("llama")
    vector, _ = train(handle, separable(), "iti", top_heads=2, position="mean")
    steer = build_steers(handle, vector, 1.0)[0]
    layer = vector.layers[0]
    ids = handle.tokenizer("hello world", return_tensors="pt").input_ids.expand(2, -1)
    seen = {}
    grab = out_projection(handle, layer).register_forward_hook(lambda _m, _i, out: seen.__setitem__("o", out))
    try:
        with torch.no_grad():
            plain = handle.model(input_ids=ids).logits
            o_plain = seen["o"].clone()
            with steering(handle, [steer.with_alpha(torch.tensor([0.0, 2.0]))], StepState()):
                assert hook_count(handle) >= 1
                mixed = handle.model(input_ids=ids).logits
                o_mixed = seen["o"].clone()
    finally:
        grab.remove()
    assert hook_count(handle) == 0
    assert torch.allclose(mixed[0], plain[0], atol=1e-5)
    assert not torch.allclose(mixed[1], plain[1], atol=1e-3)
    # ITI steers the last prompt position by default (honest_llama): that is where the shift must be exact
    heads, shifts, _ = iti.shifts_of(vector)
    expected = iti.output_projection_shift(handle, heads, shifts, head_geometry(handle)[1])[layer]
    assert torch.allclose(o_mixed[1, -1] - o_plain[1, -1], 2.0 * expected, atol=1e-4)


def test_iti_vector_without_extras_falls_back_to_residual(tiny):
    handle = tiny("llama")
    vector, _ = train(handle, separable(), "iti", top_heads=2)
    bare = SteeringVector(directions=vector.directions, hidden_size=vector.hidden_size, method="iti")
    steers = build_steers(handle, bare, 0.5)
    assert all(not isinstance(s, iti.HeadSteer) for s in steers) and len(steers) == len(vector.layers)


# ------------------------------------------------------------------ CLI glue
def test_cli_train_refuses_a_flag_the_method_has_no_setting_for(tmp_path, capsys):
    """ITI picks heads across all layers: --layer is not one of its settings, and saying so beats ignoring it."""
    from steer_ui.cli import main

    data = tmp_path / "sep.csv"
    separable().frame.rename(columns={"completion": "statement"})[["statement", "label", "group"]].to_csv(data, index=False)
    code = main(["train", "--model", "tiny:llama", "--method", "iti", "--layer", "1", "--data", str(data),
                 "--out", str(tmp_path / "v.safetensors"), "--json"])
    captured = capsys.readouterr()
    assert code == 2 and "unknown setting(s) --layer" in json.loads(captured.out)["error"]
    assert "Traceback" not in captured.err and not (tmp_path / "v.safetensors").exists()


def test_cli_probe_layers_and_train_json(tiny, tmp_path, capsys):
    from steer_ui.cli import main

    data = tmp_path / "sep.csv"
    separable().frame.rename(columns={"completion": "statement"})[["statement", "label", "group"]].to_csv(data, index=False)
    assert main(["probe-layers", "--model", "tiny:llama", "--data", str(data), "--position", "mean", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert "best_layer" in out and len(out["layers"]) == 4
    vec_path = tmp_path / "v.safetensors"
    assert main(["train", "--model", "tiny:llama", "--method", "pca", "--data", str(data), "--layer", "2",
                 "--out", str(vec_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["method"] == "pca" and out["layers"] == [2] and vec_path.is_file()


def test_cli_bad_file_is_one_line_error(tmp_path, capsys):
    from steer_ui.cli import main

    bad = tmp_path / "bad.csv"
    bad.write_text("foo,bar\n1,2\n")
    assert main(["probe-layers", "--model", "tiny:llama", "--data", str(bad), "--json"]) == 2
    captured = capsys.readouterr()
    assert "no recognised columns" in json.loads(captured.out)["error"]
    assert "Traceback" not in captured.err


def test_iti_steers_the_last_prompt_token_and_generated_ones_by_default(tiny):
    """honest_llama's positions are ITI's default; "all" stays available."""
    handle = tiny("llama")
    vector, _ = train(handle, separable(), "iti", top_heads=2)
    assert vector.positions == "last"
    steers = build_steers(handle, vector, 5.0)
    assert steers[0].positions == "last"
    vector_all, _ = train(handle, separable(), "iti", top_heads=2, steer_positions="all")
    assert vector_all.positions == "all"
