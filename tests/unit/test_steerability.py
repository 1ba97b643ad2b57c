"""Many prompts at once (issue #31): every prompt's side-by-side generation equals the one made alone, the
margins equal teacher-forced log-probabilities computed one α at a time, the slope is the least-squares slope,
and the summary counts what the rows say."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from steer_ui import steerability
from steer_ui.messages import UserError
from steer_ui.model.analysis import teacher_forced
from steer_ui.model.generation import Sampling, side_by_side
from steer_ui.service import RANDOM, Service

PROMPTS = ["The capital of France is", "My favourite food is", "Yesterday the weather was"]


def test_each_prompt_generates_as_it_would_alone_and_the_rows_say_what_they_measure(tiny):
    service = Service(tiny("llama"))
    out = service.compare("cmp-aaaaaaaa", "\n".join(PROMPTS) + "\n\n", vector_name=RANDOM, layer=1, alpha=0.8,
                          sampling=service.sampling(max_new_tokens=6))
    assert [r["prompt"] for r in out["rows"]] == PROMPTS
    steers = service.steers("cmp-aaaaaaaa", RANDOM, 1, 0.8)
    for row in out["rows"]:
        alone = side_by_side(service.handle, row["prompt"], steers, Sampling(max_new_tokens=6))
        assert (row["unsteered"], row["steered"]) == (alone.unsteered.text, alone.steered.text)
        assert row["kl"] > 0 and 0 < row["distinct"] <= 1 and row["fluency"] < 0
        assert row["concept_score"] is not None and "margins" not in row  # no pairs: no margins
    summary = out["summary"]
    assert summary["prompts"] == 3 and summary["steerability_mean"] is None
    assert summary["fluency_drop"] == pytest.approx(np.mean([r["fluency"] - r["fluency_unsteered"]
                                                             for r in out["rows"]]))


def test_kl_and_fluency_from_the_decode_equal_a_separate_computation(tiny):
    """The table's KL and fluency come from the decode itself (the first step's two distributions; the
    counterfactual row's log-probability of each steered token): the same numbers as a next-token pass and a
    teacher-forced pass of the unsteered model over the generated tokens."""
    from steer_ui.model.analysis import next_token
    from steer_ui.model.generation import encode_prompt

    service = Service(tiny("llama"))
    out = service.compare("cmp-kkkkkkkk", "\n".join(PROMPTS), vector_name=RANDOM, layer=1, alpha=0.8,
                          sampling=service.sampling(max_new_tokens=6))
    steers = service.steers("cmp-kkkkkkkk", RANDOM, 1, 0.8)
    handle = service.handle
    for row in out["rows"]:
        assert row["kl"] == pytest.approx(float(next_token(handle, row["prompt"], steers, top_k=1).kl), abs=1e-5)
        alone = side_by_side(handle, row["prompt"], steers, Sampling(max_new_tokens=6))
        prompt = encode_prompt(handle, row["prompt"])
        for side, key in ((alone.steered, "fluency"), (alone.unsteered, "fluency_unsteered")):
            ids = torch.tensor([[t.token_id for t in side.tokens]])
            with torch.no_grad():
                lp = handle.model(input_ids=torch.cat([prompt, ids], 1)).logits[0].float().log_softmax(-1)
            n = prompt.shape[1]
            want = float(np.mean([float(lp[n - 1 + k, t]) for k, t in enumerate(ids[0].tolist())]))
            assert row[key] == pytest.approx(want, abs=1e-4), key


def test_pairs_give_margins_over_alpha_and_each_prompt_s_slope(tiny):
    service = Service(tiny("llama"))
    service.upload_dataset("cmp-bbbbbbbb", None, bundled="sentiment_pairs.csv")
    out = service.compare("cmp-bbbbbbbb", use_dataset=True, vector_name=RANDOM, layer=1, alpha=0.5, alpha_max=1.0,
                          sampling=service.sampling(max_new_tokens=4))
    summary = out["summary"]
    alphas = summary["alphas"]
    assert alphas == steerability.alpha_grid(1.0) and alphas[len(alphas) // 2] == 0.0
    held_out = service.datasets.held_out_pairs("cmp-bbbbbbbb")
    assert [r["prompt"] for r in out["rows"]] == [p.prompt for p in held_out][:64]
    unit = service.steers("cmp-bbbbbbbb", RANDOM, 1, 1.0)[0]
    scale = float(unit.alpha.reshape(-1)[0])
    pair, row = held_out[0], out["rows"][0]
    from steer_ui.methods.l2s.pairs import join_text
    for k in (0, len(alphas) - 1):  # one α at a time, one row each: the batched margin is the same number
        one = unit.with_alpha(torch.tensor([alphas[k] * scale]))
        lp = [teacher_forced(service.handle, *join_text(pair.prompt, c), [one]).logprobs.sum()
              for c in (pair.positive, pair.negative)]
        assert row["margins"][k] == pytest.approx(float(lp[0] - lp[1]), abs=1e-4)
    slope = np.polyfit(alphas, row["margins"], 1)[0]
    assert row["steerability"] == pytest.approx(slope, abs=1e-6)
    slopes = np.array([r["steerability"] for r in out["rows"]])
    assert summary["anti_steerable_share"] == pytest.approx(float((slopes < 0).mean()))
    assert summary["intended_share"] == pytest.approx(float((slopes > 0).mean()))


def test_bad_requests_are_refused_in_one_line(tiny):
    service = Service(tiny("llama"))
    with pytest.raises(UserError) as info:
        service.compare("cmp-cccccccc", "\n".join(["a prompt"] * 65), vector_name=RANDOM, layer=1, alpha=0.5)
    assert info.value.key == "too_many_prompts"
    with pytest.raises(UserError) as info:
        service.compare("cmp-cccccccc", " \n ", vector_name=RANDOM, layer=1, alpha=0.5)
    assert info.value.key == "no_prompts"
    with pytest.raises(UserError) as info:
        service.compare("cmp-cccccccc", use_dataset=True, vector_name=RANDOM, layer=1, alpha=0.5)
    assert info.value.key == "no_dataset"
    service.upload_dataset("cmp-cccccccc", None, bundled="sentiment_pairs.csv")
    with pytest.raises(UserError) as info:  # one α gives no slope
        service.compare("cmp-cccccccc", use_dataset=True, vector_name=RANDOM, layer=1, alpha=0.5, alphas=[0.5, 0.5])
    assert info.value.key == "too_few_values"
    service.upload_dataset("cmp-cccccccc", None, bundled="capitals_statements.csv")
    with pytest.raises(UserError) as info:  # statements are not pairs... unless they pair up within groups
        service.compare("cmp-cccccccc", "a\nb", vector_name=RANDOM, layer=1, alpha=float("nan"))
    assert info.value.key != "unexpected"


# ------------------------------------------------------------------ concept scores against a computation by hand
def _projections_by_hand(handle, prompt: str, text: str, layer: int, unit: torch.Tensor) -> torch.Tensor | None:
    """The text's residual at block ``layer``'s output (HF ``hidden_states[layer + 1]``) on ``unit``, per token."""
    from steer_ui.model.analysis import encode_prompt

    if not text:
        return None
    answer = handle.tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids
    ids = torch.cat([encode_prompt(handle, prompt), answer], dim=1)
    with torch.no_grad():
        states = handle.model(input_ids=ids, output_hidden_states=True).hidden_states
    return states[layer + 1][0, -answer.shape[1]:].float() @ unit


def _scores_by_hand(handle, rows, layer, units) -> list:
    pairs = [(_projections_by_hand(handle, r["prompt"], r["unsteered"], layer, u),
              _projections_by_hand(handle, r["prompt"], r["steered"], layer, u)) for r, u in zip(rows, units)]
    spread = float(torch.cat([u for u, _s in pairs if u is not None]).std())
    return [None if u is None or s is None else float((s.mean() - u.mean()) / spread) for u, s in pairs]


def test_a_direction_s_concept_score_is_its_projection_gain_in_pooled_standard_deviations(tiny):
    service = Service(tiny("llama"))
    out = service.compare("cmp-dddddddd", "\n".join(PROMPTS), vector_name=RANDOM, layer=1, alpha=0.8,
                          sampling=service.sampling(max_new_tokens=6))
    direction = service.get_vector("cmp-dddddddd", RANDOM, 1, 0).directions[1].float()
    unit = direction / direction.norm()
    expected = _scores_by_hand(service.handle, out["rows"], 1, [unit] * len(PROMPTS))
    assert any(e is not None for e in expected)
    for row, want in zip(out["rows"], expected):
        assert (row["concept_score"] is None) == (want is None)
        if want is not None:
            assert row["concept_score"] == pytest.approx(want, abs=1e-4)
    assert out["summary"]["concept_units"] == steerability.SD


def test_l2s_reads_each_prompt_along_its_own_predicted_vector(tiny):
    from steer_ui.methods import l2s
    from steer_ui.methods.l2s.steering import predict
    from steer_ui.vector import SteeringVector

    handle = tiny("llama")
    torch.manual_seed(0)
    D = handle.arch.hidden_size
    net = l2s.SteeringMLP(D, 16, D)
    with torch.no_grad():
        net.input_scale.fill_(3.0)
        net.target_mean.copy_(torch.randn(D))
    vector = SteeringVector(directions={2: net.target_mean.clone()}, hidden_size=D, method="l2s",
                            model_id=handle.model_id, positions="all",
                            hyperparameters={"layer": 2, "context_layer": 1, "activation": "tanh",
                                             "position": "mean", "target_norm_mean": 5.0},
                            extras=net.state_tensors())
    service = Service(handle)
    name = service.add_vector("cmp-eeeeeeee", vector, "l2s by hand")
    out = service.compare("cmp-eeeeeeee", "\n".join(PROMPTS), vector_name=name, layer=2, alpha=0.5,
                          sampling=service.sampling(max_new_tokens=6))
    z = predict(handle, vector, PROMPTS).float()
    units = list(z / z.norm(dim=-1, keepdim=True))
    assert not torch.allclose(units[0], units[1])  # per prompt: a different direction each
    expected = _scores_by_hand(handle, out["rows"], 2, units)
    for row, want in zip(out["rows"], expected):
        assert (row["concept_score"] is None) == (want is None)
        if want is not None:
            assert row["concept_score"] == pytest.approx(want, abs=1e-4)
    assert out["summary"]["concept_units"] == steerability.SD


def test_tsv_s_concept_score_is_its_detector_s_p_truthful_gain(tiny):
    from steer_ui.methods import tsv

    handle = tiny("llama")
    rows = [(f"What colour is thing {i}?", f"It is {'red' if k else 'blue, no'} {i}", k, f"q{i}")
            for i in range(12) for k in (1, 0)]
    vector, _report = tsv.train(handle, rows, layer=2, init_epochs=1, aug_epochs=1, exemplars=8, selected=8,
                                batch_size=16, compare=False)
    service = Service(handle)
    name = service.add_vector("cmp-ffffffff", vector, "tsv by hand")
    out = service.compare("cmp-ffffffff", "\n".join(PROMPTS), vector_name=name, layer=2, alpha=0.5,
                          sampling=service.sampling(max_new_tokens=6))
    for row in out["rows"]:
        if row["unsteered"].strip() and row["steered"].strip():
            unsteered, steered = tsv.score(handle, vector, [(row["prompt"], row["unsteered"]),
                                                            (row["prompt"], row["steered"])])
            assert row["concept_score"] == pytest.approx(steered - unsteered, abs=1e-5)
            assert -1 <= row["concept_score"] <= 1
    assert out["summary"]["concept_units"] == steerability.DELTA_P_TRUTHFUL


def test_a_negated_vector_negates_every_slope_and_swaps_intended_and_anti_steerable(tiny):
    from dataclasses import replace

    service = Service(tiny("llama"))
    session = "cmp-gggggggg"
    service.upload_dataset(session, None, bundled="sentiment_pairs.csv")
    vector = service.get_vector(session, RANDOM, 1, 0)
    negated = service.add_vector(session, replace(vector, directions={1: -vector.directions[1]}, name="negated"),
                                 "negated")
    common = dict(use_dataset=True, layer=1, alpha=0.5, alpha_max=1.0, relative=False,
                  sampling=service.sampling(max_new_tokens=2))
    forward = service.compare(session, vector_name=RANDOM, **common)
    backward = service.compare(session, vector_name=negated, **common)
    a = np.array([r["steerability"] for r in forward["rows"]])
    b = np.array([r["steerability"] for r in backward["rows"]])
    assert np.abs(a).min() > 0
    np.testing.assert_allclose(b, -a, rtol=1e-4, atol=1e-6)
    assert backward["summary"]["anti_steerable_share"] == forward["summary"]["intended_share"]
    assert backward["summary"]["intended_share"] == forward["summary"]["anti_steerable_share"]
