"""L2S on tiny random models: P2S targets, the MLP, early stopping, the input-dependent hook, storage."""
from __future__ import annotations

import json

import pytest
import torch

from steer_ui.methods import l2s
from steer_ui.methods.base import SettingsError, noop, parse_settings
from steer_ui.model.generation import Sampling, side_by_side
from steer_ui.model.hooks import SteeringError, StepState, steering
from steer_ui.model.units import relative_scale
from steer_ui.vector import SteeringVector, VectorError


def _hidden_states(handle, text_ids):
    with torch.inference_mode():
        out = handle.model(input_ids=torch.tensor([text_ids]), output_hidden_states=True, use_cache=False)
    return out.hidden_states  # [L + 1] = output of block L (below the last block)


def _manual_target(handle, prompt, pos, neg, layer, context_layer, position):
    tok = handle.tokenizer
    p = tok(prompt).input_ids
    reads = []
    for comp in (pos, neg):
        c = tok(comp, add_special_tokens=False).input_ids
        hs = _hidden_states(handle, p + c)[layer + 1][0]
        span = hs[len(p):len(p) + len(c)]
        reads.append(span.mean(0) if position == "mean" else span[-1])
    ctx = _hidden_states(handle, p)[context_layer + 1][0, len(p) - 1]
    return ctx, reads[0] - reads[1]


@pytest.mark.parametrize("position", ["mean", "last"])
def test_targets_match_a_manual_forward_despite_padding(tiny, position):
    handle = tiny("llama")
    # Different prompt and completion lengths in one batch exercise left and right padding.
    pairs = [l2s.Pair("The sky is", " blue today", " green", "a"),
             l2s.Pair("A much longer prompt, with commas, is", " yes", " no way at all", "b"),
             l2s.Pair("Hi", " there", " you", "c")]
    ctx, z = l2s.extract(handle, pairs, layer=2, context_layer=1, position=position, batch_size=6)
    assert ctx.shape == z.shape == (3, 64)
    for i, p in enumerate(pairs):
        mctx, mz = _manual_target(handle, p.prompt, p.positive, p.negative, 2, 1, position)
        torch.testing.assert_close(z[i], mz, atol=2e-4, rtol=1e-4)
        torch.testing.assert_close(ctx[i], mctx, atol=2e-4, rtol=1e-4)


def test_mean_and_last_targets_differ_for_multi_token_completions(tiny):
    handle = tiny("llama")
    pairs = [l2s.Pair("Colour:", " dark blue", " pale green", "a")]
    _, zm = l2s.extract(handle, pairs, 1, 1, "mean")
    _, zl = l2s.extract(handle, pairs, 1, 1, "last")
    assert not torch.allclose(zm, zl)


def test_target_sign_flips_with_the_pair(tiny):
    handle = tiny("qwen2")
    fwd = [l2s.Pair("The answer is", " yes", " no", "a")]
    rev = [l2s.Pair("The answer is", " no", " yes", "a")]
    _, z1 = l2s.extract(handle, fwd, 2, 2)
    _, z2 = l2s.extract(handle, rev, 2, 2)
    torch.testing.assert_close(z1, -z2, atol=1e-5, rtol=1e-5)
    assert z1.norm() > 0


def test_mlp_fits_a_known_linear_map():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(300, 16, generator=gen) * 5 + 3
    a = torch.randn(16, 12, generator=gen)
    z = x @ a + 2.0
    train, val = list(range(240)), list(range(240, 300))
    net, report = l2s.fit_mlp(x, z, train, val, hidden=64, epochs=600, patience=60, lr=3e-3, cos_weight=0.0)
    with torch.no_grad():
        pred = net(x[val])
    cos = torch.nn.functional.cosine_similarity(pred, z[val], dim=-1).mean()
    mean_cos = torch.nn.functional.cosine_similarity(z[train].mean(0).expand(60, -1), z[val], dim=-1).mean()
    assert cos > 0.97
    assert cos > mean_cos + 0.2
    r2 = 1 - (pred - z[val]).pow(2).sum() / (z[val] - z[val].mean(0)).pow(2).sum()
    assert r2 > 0.9
    assert report.best_epoch > 0


def test_untrained_mlp_is_mean_steering():
    x, z = torch.randn(20, 8), torch.randn(20, 8)
    net, report = l2s.fit_mlp(x, z, list(range(15)), list(range(15, 20)), hidden=4, epochs=0)
    assert report.epochs_run == 0 and report.best_epoch == 0
    torch.testing.assert_close(net(x), z[:15].mean(0).expand(20, -1))


def test_early_stopping_restores_the_best_epoch():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(80, 32, generator=gen)
    z = torch.randn(80, 32, generator=gen)  # unrelated to x: training can only overfit
    train, val = list(range(60)), list(range(60, 80))
    net, report = l2s.fit_mlp(x, z, train, val, hidden=128, epochs=500, patience=15, lr=1e-2, cos_weight=0.1)
    assert report.stopped_early
    assert report.epochs_run == report.best_epoch + 15 < 500
    assert report.best_val_loss == min(report.val_loss)
    # The returned net is the best epoch's, not the last one's.
    offset = net.target_mean / net.target_scale
    with torch.no_grad():
        got = float(l2s.mlp._loss(net.residual(x[val]) + offset, (z[val] - net.target_mean) / net.target_scale + offset,
                              0.1))
    assert got == pytest.approx(report.best_val_loss, rel=1e-5)
    assert report.val_loss[-1] > report.best_val_loss


def _tiny_vector(handle, layer=2, context_layer=1, seed=0):
    """An L2S vector with a random (untrained) MLP whose decoder is non-zero."""
    torch.manual_seed(seed)
    D = handle.arch.hidden_size
    net = l2s.SteeringMLP(D, 16, D)
    with torch.no_grad():
        net.input_scale.fill_(3.0)
        net.target_mean.copy_(torch.randn(D))
        net.target_scale.fill_(2.0)
    return SteeringVector(directions={layer: net.target_mean.clone()}, hidden_size=D, method="l2s",
                          model_id=handle.model_id, positions="all",
                          hyperparameters={"layer": layer, "context_layer": context_layer, "activation": "tanh",
                                           "position": "mean", "target_norm_mean": 5.0},
                          extras=net.state_tensors())


def _block_output(handle, ids, layer, steers, state):
    seen = {}
    arch = handle.arch

    def grab(_m, _i, out):
        seen["h"] = (out[0] if isinstance(out, tuple) else out).detach().clone()

    # Registered after `steering` installs its hooks, so it sees the steered output.
    with torch.inference_mode(), steering(handle, steers, state):
        h = arch.layers[layer].register_forward_hook(grab)
        try:
            handle.model.base_model(input_ids=ids, use_cache=False)
        finally:
            h.remove()
    return seen["h"]


def test_hook_calls_g_once_per_prompt_and_adds_a_per_row_vector(tiny):
    handle = tiny("gemma3")
    vector = _tiny_vector(handle, layer=2, context_layer=1)
    net = l2s.mlp_of(vector)
    steer = l2s.build_steers(handle, vector, alpha=1.5)[0]
    assert steer.fn is not None and steer.context_layer == 1 and steer.layer == 2
    ids = torch.tensor([handle.tokenizer(t).input_ids for t in ("abcd", "wxyz", "mnop")])  # equal lengths
    state = StepState(prompt_len=ids.shape[1])
    steered = _block_output(handle, ids, 2, [steer], state)
    plain = _block_output(handle, ids, 2, [], StepState(prompt_len=ids.shape[1]))
    assert state.fn_calls == 1
    ctx = _block_output(handle, ids, 1, [], StepState())[:, -1]
    with torch.no_grad():
        expected = 1.5 * net(ctx)
    added = steered - plain
    assert added.shape == (3, ids.shape[1], 64)
    assert ids[0, 0] == handle.tokenizer.bos_token_id
    for r in range(3):
        assert torch.equal(added[r, 0], torch.zeros(64))  # BOS, a special token, is not steered
        for t in range(1, ids.shape[1]):  # positions="all": the same per-row vector at every other position
            torch.testing.assert_close(added[r, t], expected[r], atol=1e-4, rtol=1e-4)
    assert not torch.allclose(expected[0], expected[1], atol=1e-3)  # really per input


def test_g_runs_once_during_a_whole_generation(tiny):
    handle = tiny("llama")
    vector = _tiny_vector(handle)
    steer = l2s.build_steers(handle, vector, alpha=2.0)[0]
    calls = []
    inner = steer.fn

    def counting(ctx):
        calls.append(ctx.shape)
        return inner(ctx)

    steer.fn = counting
    out = side_by_side(handle, "hello", [steer], Sampling(max_new_tokens=6, stop_at_eos=False))
    assert len(calls) == 1 and calls[0] == (3, 64)  # unsteered, steered, counterfactual rows, at prefill
    assert len(out.steered.tokens) == 6


def test_steering_generated_positions_only_leaves_the_prompt_alone(tiny):
    handle = tiny("llama")
    vector = _tiny_vector(handle)
    steer = l2s.build_steers(handle, vector, alpha=1.0, positions="generated")[0]
    ids = torch.tensor([handle.tokenizer("abcdef").input_ids])
    state = StepState(prompt_len=ids.shape[1])
    steered = _block_output(handle, ids, 2, [steer], state)
    plain = _block_output(handle, ids, 2, [], StepState(prompt_len=ids.shape[1]))
    torch.testing.assert_close(steered, plain)


def test_context_after_steered_layer_is_refused_for_prompt_positions(tiny):
    handle = tiny("llama")
    vector = _tiny_vector(handle, layer=1, context_layer=3)
    with pytest.raises(SteeringError, match="context layer 3 comes after steered layer 1"):
        l2s.build_steers(handle, vector, alpha=1.0)
    assert l2s.build_steers(handle, vector, alpha=1.0, positions="generated")[0].context_layer == 3


def test_relative_alpha_divides_by_the_mean_target_norm(tiny):
    handle = tiny("llama")
    vector = _tiny_vector(handle)
    raw = l2s.build_steers(handle, vector, alpha=0.5)[0]
    rel = l2s.build_steers(handle, vector, alpha=0.5, relative=True)[0]
    assert float(raw.scalar_alpha) == pytest.approx(0.5)
    assert float(rel.scalar_alpha) == pytest.approx(0.5 * relative_scale(handle, 2) / 5.0, rel=1e-5)


def test_core_build_steers_routes_l2s_vectors(tiny):
    from steer_ui.steering import build_steers

    handle = tiny("llama")
    steers = build_steers(handle, _tiny_vector(handle), 1.0)
    assert len(steers) == 1 and steers[0].fn is not None


def test_sources_share_units_and_p2s_is_the_true_target(tiny):
    handle = tiny("llama")
    vector = _tiny_vector(handle)
    src = l2s.steer_sources(handle, vector, 0.7, prompt="The sky is", positive=" blue", negative=" red",
                            relative=True)
    assert set(src) == {"mean", "l2s", "p2s"}
    alphas = {k: float(v[0].scalar_alpha) for k, v in src.items()}
    assert alphas["mean"] == pytest.approx(alphas["l2s"]) == pytest.approx(alphas["p2s"])
    _, z = l2s.extract(handle, [l2s.Pair("The sky is", " blue", " red")], 2, 1)
    torch.testing.assert_close(src["p2s"][0].vector, z[0])
    torch.testing.assert_close(src["mean"][0].vector, vector.directions[2])
    assert "p2s" not in l2s.steer_sources(handle, vector, 0.7)


def test_describe_reports_norms_and_cosines(tiny):
    handle = tiny("llama")
    vector = _tiny_vector(handle)
    frame = l2s.describe(handle, vector, ["abc", "a much longer prompt"])
    assert list(frame.columns) == ["prompt", "predicted_norm", "norm_over_mean", "cosine_to_mean"]
    assert (frame.predicted_norm > 0).all() and frame.cosine_to_mean.between(-1, 1).all()
    assert frame.predicted_norm.nunique() == 2


def _toy_pairs(n=24):
    words = ["red", "blue", "green", "black", "white", "pink"]
    rows = []
    for i in range(n):
        a, b = words[i % 6], words[(i + 1) % 6]
        rows.append((f"Item {i} looks", f" {a}", f" {b}", f"g{i}"))
    return rows


def test_train_saves_and_loads_back_with_identical_steering(tiny, tmp_path):
    handle = tiny("llama")
    seen = []
    vector, report = l2s.train(handle, _toy_pairs(), layer=2, context_layer=1, hidden=8, epochs=30,
                               progress=lambda f, m: seen.append(f))
    assert vector.method == "l2s" and vector.layers == [2] and vector.positions == "all"
    assert vector.hyperparameters["layer_sizes"] == [64, 8, 64]
    assert vector.hyperparameters["context_layer"] == 1 and vector.hyperparameters["activation"] == "tanh"
    assert seen and seen[-1] == 1.0
    for key in ("l2s_cosine", "mean_cosine", "l2s_mse", "mean_mse", "margin_gain", "positive_rate", "per_input",
                "table"):
        assert key in report
    assert set(report["margin_gain"]) == {"mean", "l2s", "p2s"}
    assert set(report["positive_rate"]) == {"none", "mean", "l2s", "p2s"}
    assert report["splits"]["test"] > 0 and report["splits"]["validation"] > 0
    assert len(report["per_input"]) == report["splits"]["test"]
    json.dumps(report)  # the CLI prints it
    path = vector.save(tmp_path / "l2s.safetensors")
    loaded = SteeringVector.load(path)
    assert loaded.method == "l2s" and loaded.hyperparameters["context_layer"] == 1
    ctx = torch.randn(4, 64) * 3
    with torch.no_grad():
        torch.testing.assert_close(l2s.mlp_of(loaded)(ctx), l2s.mlp_of(vector)(ctx))
    torch.testing.assert_close(loaded.directions[2], vector.directions[2])


def test_method_trains_from_parsed_settings(tiny):
    handle = tiny("llama")
    # The values the generated CLI flags --layer --context-layer --hidden --position --seed --epochs produce.
    settings = parse_settings(l2s.L2SSettings, {"layer": "2", "context_layer": 2, "hidden": 6, "position": "last",
                                                "seed": 3, "epochs": "5"})
    vector, report = l2s.METHOD.train(handle, _toy_pairs(), settings, noop)
    hp = vector.hyperparameters
    assert (hp["layer"], hp["context_layer"], hp["hidden"], hp["position"], hp["seed"]) == (2, 2, 6, "last", 3)
    assert report["fit"]["epochs_run"] <= 5
    assert l2s.METHOD.steering == "input"
    steers = l2s.METHOD.steers(handle, vector, 1.0, layer=2)
    assert len(steers) == 1 and steers[0].fn is not None and steers[0].context_layer == 2
    with pytest.raises(SteeringError, match="steers layer 2 only"):
        l2s.METHOD.steers(handle, vector, 1.0, layer=1)


@pytest.mark.parametrize("values, message", [
    ({"epochs": 10**9}, "epochs must be at most 5000"),
    ({"hidden": 0}, "hidden must be at least 1"),
    ({"learning_rate": 0.1}, "unknown setting.*learning_rate"),
    ({"steer_positions": "bogus"}, "steer_positions must be one of all, prompt, generated"),
    ({"lr": 0}, "lr must be > 0"),
])
def test_settings_refuse_out_of_bounds_values_by_name(values, message):
    with pytest.raises(SettingsError, match=message) as info:
        parse_settings(l2s.L2SSettings, values)
    assert "\n" not in str(info.value)


def test_generate_cli_steers_with_a_saved_l2s_vector(tiny, tmp_path, capsys):
    from steer_ui.cli import main

    handle = tiny("llama")
    path = _tiny_vector(handle).save(tmp_path / "v.safetensors")
    code = main(["generate", "--model", "tiny:llama", "--vector", str(path), "--alpha", "3", "--prompt", "hello",
                 "--max-new-tokens", "4", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0, out
    assert out["unsteered"]["text"] != out["steered"]["text"]


@pytest.mark.parametrize("bad, message", [
    ([("", " a", " b")], "pair 1: L2S needs a prompt"),
    ([("p", " a", " a")], "pair 1: positive and negative completions are identical"),
    ([("p", " a", " b"), ("q", "", " b")], "pair 2: empty positive or negative"),
    ([("p", " a")], "pair 1: expected"),
])
def test_bad_pairs_get_one_line_errors(bad, message):
    with pytest.raises(l2s.L2SError, match=message):
        l2s.as_pairs(bad)


def test_train_refuses_bad_settings(tiny):
    handle = tiny("llama")
    with pytest.raises(l2s.L2SError, match="layer 9 does not exist"):
        l2s.train(handle, _toy_pairs(), layer=9)
    with pytest.raises(SteeringError, match="context layer 3 comes after steered layer 1"):
        l2s.train(handle, _toy_pairs(), layer=1, context_layer=3)
    with pytest.raises(SettingsError, match="unknown setting.*learning_rate"):
        l2s.train(handle, _toy_pairs(), layer=1, learning_rate=3)
    with pytest.raises(SettingsError, match="epochs must be at most 5000"):
        l2s.train(handle, _toy_pairs(), l2s.L2SSettings(layer=1, epochs=10**9))
    with pytest.raises(l2s.L2SError, match="at least 3 groups"):
        l2s.train(handle, [("a", " x", " y", "g"), ("b", " x", " y", "g")], layer=1)


def test_vector_without_mlp_tensors_is_a_clear_error(tiny):
    handle = tiny("llama")
    broken = SteeringVector(directions={2: torch.ones(64)}, hidden_size=64, method="l2s",
                            hyperparameters={"layer": 2, "context_layer": 2})
    with pytest.raises(VectorError, match="missing the MLP tensors"):
        l2s.build_steers(handle, broken, 1.0)


def test_accepts_a_pairs_dataset(tmp_path):
    from steer_ui.data import load_dataset

    path = tmp_path / "p.csv"
    path.write_text('prompt,positive,negative,group\n"Q1"," yes"," no",a\n"Q2"," no"," yes",b\n')
    pairs = l2s.as_pairs(load_dataset(path))
    assert [(p.prompt, p.positive, p.negative, p.group) for p in pairs] == [("Q1", " yes", " no", "a"),
                                                                          ("Q2", " no", " yes", "b")]


def test_svd_decoder_starts_at_mean_steering_and_spans_the_principal_directions():
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(40, 12, generator=gen)
    direction = torch.nn.functional.normalize(torch.randn(16, generator=gen), dim=0)
    z = 3.0 + torch.randn(40, 1, generator=gen) * 5 * direction + 0.01 * torch.randn(40, 16, generator=gen)
    net, report = l2s.fit_mlp(x, z, list(range(30)), list(range(30, 40)), hidden=4, epochs=0, decoder_init="svd")
    assert report.best_epoch == 0
    torch.testing.assert_close(net(x), z[:30].mean(0).expand(40, -1))  # epoch 0 is Mean-S exactly
    first = torch.nn.functional.normalize(net.decoder.weight[:, 0], dim=0)
    assert abs(float(first @ direction)) > 0.99  # the direction the shifts vary along
    with pytest.raises(l2s.L2SError, match="decoder_init must be one of"):
        l2s.fit_mlp(x, z, list(range(30)), list(range(30, 40)), hidden=4, decoder_init="bogus")


def test_svd_init_fits_a_low_rank_map_at_least_as_well_as_a_zero_decoder():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(120, 24, generator=gen)
    basis = torch.randn(2, 32, generator=gen)
    z = torch.tanh(x[:, :2]) @ basis * 4 + 1.0  # the shifts vary along two directions, chosen by the input
    train, val = list(range(90)), list(range(90, 120))
    losses = {}
    for init in ("svd", "zero"):
        _, report = l2s.fit_mlp(x, z, train, val, hidden=16, epochs=60, patience=60, lr=3e-3, decoder_init=init)
        losses[init] = report.best_val_loss
    assert losses["svd"] < 0.5 * report.val_loss[0]  # well below Mean-S's loss
    assert losses["svd"] <= losses["zero"] * 1.05


def _colour_pairs(n=16):
    words = ["red", "blue", "green", "black", "white", "pink", "gold", "grey"]
    rows = []
    for i in range(n):
        a, b = words[i % 8], words[(i + 3) % 8]
        rows.append((f"Item {i} is", f" {a}", f" {b}", f"g{i}"))
        rows.append((f"No, item {i} is not", f" {b}", f" {a}", f"g{i}"))
    return rows


def test_calibration_tries_both_sources_at_the_same_strengths_within_the_budget(tiny):
    handle = tiny("llama")
    vector = _tiny_vector(handle, layer=2, context_layer=1)
    pairs = l2s.as_pairs(_colour_pairs(4))
    contexts, _ = l2s.extract(handle, pairs, 2, 1)
    result = l2s.calibrate(handle, vector, pairs, contexts, budget=0.3, steps=3)
    table = result["table"]
    for source in ("mean", "l2s"):
        rows = [r for r in table if r["source"] == source]
        assert [round(r["relative_norm"], 6) for r in rows] == pytest.approx([0.1, 0.2, 0.3], rel=1e-4)
        best = max(rows, key=lambda r: r["margin_gain"])
        assert result["alphas"][source] == best["raw_alpha"]


def test_calibration_weighs_the_input_dependent_part_and_its_zero_is_mean_steering(tiny):
    handle = tiny("llama")
    vector = _tiny_vector(handle, layer=2, context_layer=1)
    pairs = l2s.as_pairs(_colour_pairs(4))
    contexts, _ = l2s.extract(handle, pairs, 2, 1)
    result = l2s.calibrate(handle, vector, pairs, contexts, budget=0.3, steps=3, residual_steps=2)
    table = result["table"]
    mean_rows = [r for r in table if r["source"] == "mean"]
    l2s_rows = [r for r in table if r["source"] == "l2s"]
    assert sorted({r["residual_weight"] for r in l2s_rows}) == [0.0, 0.5, 1.0]
    # Weight 0 adds z̄ + 0·(g − z̄) = Mean-S: the same strengths and the same margins as Mean-S's own rows.
    zero = [r for r in l2s_rows if r["residual_weight"] == 0]
    assert [(r["raw_alpha"], r["margin_gain"]) for r in zero] == [(r["raw_alpha"], r["margin_gain"]) for r in mean_rows]
    # Every weight is tried at the same budgeted strengths.
    for w in (0.5, 1.0):
        rows = [r for r in l2s_rows if r["residual_weight"] == w]
        assert [round(r["relative_norm"], 6) for r in rows] == pytest.approx([0.1, 0.2, 0.3], rel=1e-4)
    best = max(l2s_rows, key=lambda r: r["margin_gain"])  # the first maximum: the smaller weight, then α
    assert (result["residual_weight"], result["alphas"]["l2s"]) == (best["residual_weight"], best["raw_alpha"])
    # residual_steps = 0 tries g as trained only (the behaviour before the weight existed).
    only = l2s.calibrate(handle, vector, pairs, contexts, budget=0.3, steps=3, residual_steps=0)
    assert {r["residual_weight"] for r in only["table"] if r["source"] == "l2s"} == {1.0}
    assert only["residual_weight"] == 1.0


def test_the_kept_weight_is_what_the_saved_vector_steers_with(tiny, tmp_path):
    # 40 items at lr 1e-2: g learns something (best epoch 41) and validation keeps 3/4 of it (measured 0.75).
    handle, pairs = tiny("qwen2"), _colour_pairs(40)
    common = dict(layer=2, context_layer=2, hidden=8, epochs=60, patience=60, lr=1e-2, norm_budget=0.4,
                  calibration_steps=2)
    as_trained, _ = l2s.train(handle, pairs, residual_steps=0, **common)
    weighed, report = l2s.train(handle, pairs, residual_steps=4, **common)
    weight = weighed.hyperparameters["residual_weight"]
    assert as_trained.hyperparameters["residual_weight"] == 1.0
    assert report["fit"]["best_epoch"] > 0 and weight in (0.25, 0.5, 0.75) and report["residual_weight"] == weight
    kept = max((r for r in report["calibration"] if r["source"] == "l2s"), key=lambda r: r["margin_gain"])
    assert kept["residual_weight"] == weight
    # Same seed, same fit: the weighed vector's g is z̄ + w·(g − z̄), through save and load too.
    weighed.save(tmp_path / "w.safetensors")
    loaded = SteeringVector.load(tmp_path / "w.safetensors")
    prompts = [p.prompt for p in l2s.as_pairs(_colour_pairs(3))]
    g, mean = l2s.predict(handle, as_trained, prompts), as_trained.directions[2]
    assert (g - mean).norm() > 0.1 * mean.norm()  # g is not Mean-S, so the weight shows
    assert torch.allclose(l2s.predict(handle, loaded, prompts), mean + weight * (g - mean), atol=1e-5)
    # Weight 0 makes the held-out L2S row Mean-S's, and the sentence says why.
    zero = {**report, "residual_weight": 0.0, "l2s_minus_mean": {"mean": 0.0, "se": 0.0, "n": 4}}
    beats, text = l2s.recommendation(zero, 0.4)
    assert not beats and "set its weight to 0" in text


def _steered_logp(handle, vector, raw_alpha, prompt, completion):
    """log p(completion | prompt) with the vector's own generation hook (build_steers) at raw α, by hand."""
    tok = handle.tokenizer
    p = tok(prompt).input_ids
    c = tok(completion, add_special_tokens=False).input_ids
    ids = torch.tensor([p + c])
    with torch.inference_mode(), steering(handle, l2s.build_steers(handle, vector, raw_alpha),
                                          StepState(prompt_len=len(p))):
        logits = handle.model(input_ids=ids, use_cache=False).logits[0].float()
    logp = logits.log_softmax(-1)
    return float(sum(logp[len(p) - 1 + t, c[t]] for t in range(len(c))))


def test_report_carries_the_loss_curve_the_behaviour_at_one_budget_and_a_recommendation(tiny):
    handle = tiny("llama")
    vector, report = l2s.train(handle, _colour_pairs(), layer=2, context_layer=1, hidden=8, epochs=20, patience=20,
                               norm_budget=0.4, calibration_steps=2)
    curve = report["loss_curve"]
    assert [r["epoch"] for r in curve] == list(range(report["fit"]["epochs_run"] + 1))
    assert [r["validation_loss"] for r in curve] == report["fit"]["val_loss"]
    assert curve[0]["train_loss"] is None and curve[1]["train_loss"] == report["fit"]["train_loss"][0]
    # Mean-S and L2S were calibrated under the same budget: neither adds more than it on average.
    assert report["norm_budget"] == 0.4
    for source in ("mean", "l2s"):
        assert 0 < report["steered_norm"][source] <= 0.4 * 1.3  # the held-out mean norm, calibrated on validation
    assert {r["source"] for r in report["calibration"]} == {"mean", "l2s"}
    assert vector.hyperparameters["calibrated_raw_alpha"] == {
        s: pytest.approx(a) for s, a in report["raw_alpha"].items() if s != "p2s"}
    # The reported margin gain is what the vector's own hook does: recompute one held-out pair by hand.
    first = report["per_input"][0]
    pair = next(p for p in l2s.as_pairs(_colour_pairs()) if p.prompt == first["prompt"])
    assert pair.group in report["splits"]["test_groups"]
    raw = report["raw_alpha"]["l2s"]
    by_hand = (_steered_logp(handle, vector, raw, pair.prompt, pair.positive)
               - _steered_logp(handle, vector, raw, pair.prompt, pair.negative)
               - _steered_logp(handle, vector, 0.0, pair.prompt, pair.positive)
               + _steered_logp(handle, vector, 0.0, pair.prompt, pair.negative))
    assert by_hand == pytest.approx(first["margin_gain_l2s"], abs=1e-3)
    assert isinstance(report["recommendation"], str) and isinstance(report["l2s_beats_mean"], bool)


def test_when_g_learns_nothing_l2s_is_mean_steering_and_the_report_says_so(tiny):
    handle = tiny("llama")
    # One epoch at a tiny learning rate cannot beat Mean-S on validation, so early stopping keeps epoch 0.
    _, report = l2s.train(handle, _colour_pairs(), layer=2, context_layer=1, hidden=8, epochs=1, lr=1e-9,
                          calibration_steps=2)
    assert report["fit"]["best_epoch"] == 0
    assert report["margin_gain"]["l2s"] == pytest.approx(report["margin_gain"]["mean"])
    assert report["l2s_beats_mean"] is False
    assert report["recommendation"].startswith("L2S did not beat mean steering on this data")
    assert "Use mean steering instead" in report["recommendation"]


def test_recommendation_needs_a_clear_paired_advantage():
    result = {"margin_gain": {"mean": 0.2, "l2s": 1.0}, "n_steered": 30, "alpha": {"l2s": 0.25},
              "l2s_minus_mean": {"mean": 0.8, "se": 0.1, "n": 30}}
    beats, text = l2s.recommendation(result, 0.1)
    assert beats and text.startswith("L2S beat mean steering") and "+1.00 for L2S vs +0.20" in text
    assert "relative α 0.25" in text
    noisy = {**result, "l2s_minus_mean": {"mean": 0.8, "se": 0.5, "n": 30}}
    beats, text = l2s.recommendation(noisy, 0.1)
    assert not beats and "did not beat" in text
