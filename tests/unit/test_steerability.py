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


def test_pairs_give_margins_over_alpha_and_each_prompt_s_slope(tiny):
    service = Service(tiny("llama"))
    service.upload_dataset("cmp-bbbbbbbb", None, bundled="sentiment_pairs.csv")
    out = service.compare("cmp-bbbbbbbb", use_dataset=True, vector_name=RANDOM, layer=1, alpha=0.5, alpha_max=1.0,
                          sampling=service.sampling(max_new_tokens=4))
    summary = out["summary"]
    alphas = summary["alphas"]
    assert alphas == steerability.alpha_grid(1.0) and alphas[len(alphas) // 2] == 0.0
    held_out = service._held_out_pairs("cmp-bbbbbbbb")
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
