"""The bench's greedy check against a float32 eager reference (issue #51): what it calls equal, what it calls
explained, and that a decode that is wrong is neither."""
from __future__ import annotations

from dataclasses import replace

import pytest

from steer_ui.model.generation import DecodeBatch
from steer_ui.model.loading import load_model
from steer_ui.tools.greedy_reference import eager_greedy, greedy_vs_reference
from steer_ui.tools.measures import _ours, bench_greedy_vs_float32, float32_reference, seeded_steer
from steer_ui.model.generation import encode_prompt

PROMPTS = ("The capital of France is", "She opened the book and")


def _decode(handle):
    batch = DecodeBatch(handle)
    return lambda prompt, steers, n: _ours(handle, prompt, steers, n, batch)[2]


@pytest.fixture(scope="module")
def mini32():
    return load_model("random:llama-mini", device="cpu", dtype="float32")


def test_the_apps_float32_decode_equals_the_eager_reference_token_for_token(mini32):
    steer, _ = seeded_steer(mini32, 1)
    out = greedy_vs_reference(mini32, mini32, steer, PROMPTS, 12, _decode(mini32))
    assert out["sequences"] == 4 and out["equal"] == 4 == out["equal_or_explained"]
    assert all(s["divergence"] is None and s["matched_tokens"] == 12 for s in out["detail"])


def test_eager_greedy_is_argmax_of_full_forwards(mini32):
    ids = encode_prompt(mini32, PROMPTS[0])
    tokens, logits = eager_greedy(mini32, ids, [], 5)
    assert tokens == [int(step.argmax()) for step in logits] and len(tokens) == 5


def test_a_decode_that_picks_a_wrong_token_is_not_explained(mini32):
    """A decode that swaps one token for the reference's last choice parts where the reference's margin is
    real; the model is its own reference, so its dtype error is 0 and nothing explains the difference."""
    steer, _ = seeded_steer(mini32, 1)
    decode = _decode(mini32)

    def wrong(prompt, steers, n):
        result = decode(prompt, steers, n)
        tokens = list(result.steered.tokens)
        ids = encode_prompt(mini32, prompt)
        _, ref_logits = eager_greedy(mini32, ids, steers, n)
        tokens[3] = replace(tokens[3], token_id=int(ref_logits[3].argmin()))
        return replace(result, steered=replace(result.steered, tokens=tokens))

    out = greedy_vs_reference(mini32, mini32, steer, PROMPTS[:1], 8, wrong)
    steered = [s for s in out["detail"] if s["side"] == "steered"][0]
    assert steered["divergence"]["at_token"] == 3 and steered["divergence"]["explained"] is False
    assert steered["divergence"]["max_abs_logit_gap_vs_reference"] == 0.0
    assert out["equal_or_explained"] == 1


def test_bfloat16_against_float32_is_equal_or_parted_at_a_near_tie():
    h16 = load_model("random:llama-mini", device="cpu", dtype="bfloat16")
    steer, _ = seeded_steer(h16, 1)
    with float32_reference(h16, lambda _m: None) as reference:
        out = bench_greedy_vs_float32(h16, reference, steer, 16, lambda _m: None)
    assert out["status"] == "measured" and out["sequences"] == 8
    assert out["equal_or_explained"] == 8, out["detail"]
    for s in out["detail"]:
        if s["divergence"]:
            d = s["divergence"]
            assert d["reference_margin"] <= d["max_abs_logit_gap_vs_reference"]


def test_int8_weights_skip_the_greedy_check():
    handle = load_model("tiny:llama", device="cpu", weights="int8")
    steer, _ = seeded_steer(handle, 1)
    with float32_reference(handle, lambda _m: None) as reference:
        assert reference is None
        assert bench_greedy_vs_float32(handle, reference, steer, 4, lambda _m: None)["status"].startswith("skipped")
