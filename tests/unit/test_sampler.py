"""The sampler's shortcuts (steer_ui/model/sampler.py) against the whole-vocabulary formulas they replace.

Top-p from the largest logits must keep exactly the tokens the sorted vocabulary keeps; the Gumbel-max draw that
adds noise to the tokens that can win only must pick the token ``argmax(processed + gumbel(u))`` picks.  The rows
are vocabulary-sized (past the plain forms' limit) with shapes that take every branch: peaked and flat rows (the
prefix found among 64 candidates, after growing, or by sorting), top-k before top-p, ties, -inf, NaN.
"""
from __future__ import annotations

import pytest
import torch

from steer_ui.model import sampler
from steer_ui.model.architecture import argmax_last
from steer_ui.model.generation import Sampling

VOCAB = 20_000  # past sampler._SHORT, so the shortcuts run


def sorted_top_p(logits: torch.Tensor, top_p: float, top_k: int = 0) -> torch.Tensor:
    """The rule by sorting the whole row (top-k first by its own mask), with the masses the sampler uses."""
    if top_k:
        logits = sampler.top_k_filter(logits, top_k)
    ordered, order = torch.sort(logits, descending=True, dim=-1)
    probs = (ordered.double() - sampler._log_mass(logits)).exp()
    drop = torch.zeros_like(probs, dtype=torch.bool).scatter(1, order, (probs.cumsum(-1) - probs) >= top_p)
    return logits.masked_fill(drop, float("-inf"))


def whole_vocabulary_draw(processed: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    return argmax_last(processed.double() + sampler.gumbel(u))


def rows(seed: int, scale: float, n: int = 3) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, VOCAB, generator=g) * scale


@pytest.mark.parametrize("scale", [0.3, 2.0, 6.0, 30.0])  # flat (sorted after growing) to peaked (64 suffice)
@pytest.mark.parametrize("top_p", [0.05, 0.5, 0.9, 0.995])
@pytest.mark.parametrize("top_k", [0, 1, 40, 300])
def test_top_p_keeps_what_sorting_the_vocabulary_keeps(scale, top_p, top_k):
    for seed in range(3):
        x = rows(seed, scale)
        assert torch.equal(sampler.top_p_filter(x, top_p, top_k), sorted_top_p(x, top_p, top_k))


def test_each_top_p_branch_is_taken_and_agrees():
    """Peaked rows end among the first 64 candidates, middling ones after growing, flat ones are sorted."""
    taken = {}
    real = sampler.topk_last

    def counting(x, k):
        taken[k] = taken.get(k, 0) + 1
        return real(x, k)

    sampler.topk_last = counting
    try:
        for scale, top_p in ((30.0, 0.9), (2.0, 0.9), (0.01, 0.999)):
            x = rows(1, scale)
            assert torch.equal(sampler.top_p_filter(x, top_p), sorted_top_p(x, top_p))
    finally:
        sampler.topk_last = real
    assert taken.get(64) and taken.get(256) and taken.get(sampler._TOP_P_MOST), taken


def test_top_k_tied_at_its_last_keeps_every_tied_token_as_the_mask_does():
    x = rows(4, 3.0, n=1)
    top = torch.topk(x, 6).values[0]
    assert not bool((torch.topk(x, 5).indices < 5).any())
    x[0, :5] = top[4]  # five more tokens tied with the fifth largest: top-k 5 keeps all ten
    out = sampler.top_p_filter(x, 0.999, top_k=5)
    assert torch.equal(out, sorted_top_p(x, 0.999, top_k=5))
    assert int(torch.isfinite(out).sum()) == 10


@pytest.mark.parametrize("scale", [0.5, 3.0, 20.0])
def test_the_gumbel_draw_picks_what_the_whole_vocabulary_formula_picks(scale):
    for seed in range(40):
        x = rows(seed, scale, n=2)
        u = sampler.uniforms(sampler.noise_generator(seed, "cpu"), VOCAB)
        assert torch.equal(sampler.gumbel_max(x, u), whole_vocabulary_draw(x, u))
        kept = sampler.top_p_filter(x, 0.8, top_k=50)  # few finite tokens: the probes hold every candidate
        assert torch.equal(sampler.gumbel_max(kept, u), whole_vocabulary_draw(kept, u))


def test_the_gumbel_draw_takes_the_first_index_on_a_tie_nan_and_infinity_as_the_formula_does():
    u = sampler.uniforms(sampler.noise_generator(9, "cpu"), VOCAB)
    x = torch.full((1, VOCAB), -50.0)
    x[0, [7, 900, 12_000]] = 5.0
    u = u.clone()
    u[[7, 900, 12_000]] = 0.5  # equal scores: the first index wins
    assert int(sampler.gumbel_max(x, u)) == 7 == int(whole_vocabulary_draw(x, u))
    for bad in (float("nan"), float("inf")):
        y = x.clone()
        y[0, 4321] = bad
        assert torch.equal(sampler.gumbel_max(y, u), whole_vocabulary_draw(y, u))
    all_out = torch.full((1, VOCAB), float("-inf"))
    all_out[0, 17] = 0.0
    assert int(sampler.gumbel_max(all_out, u)) == 17


def test_a_sampled_choice_over_processed_logits_matches_the_formula_for_each_setting():
    x = rows(11, 4.0, n=2)
    for s in (Sampling(temperature=1.0), Sampling(temperature=0.7, top_p=0.9), Sampling(temperature=1.3, top_k=20),
              Sampling(temperature=0.5, top_k=100, top_p=0.5, repetition_penalty=1.3)):
        history = torch.tensor([[1, 2, 3], [4, 5, 6]])
        u = sampler.uniforms(sampler.noise_generator(3, "cpu"), VOCAB)
        processed = sampler.process_logits(x, history, s)
        assert torch.equal(sampler.choose(processed, s, u), whole_vocabulary_draw(processed, u))
    greedy = Sampling(temperature=0.0)
    assert torch.equal(sampler.choose(x, greedy, None), x.argmax(-1))


def test_the_cost_tool_times_both_ways_and_they_pick_the_same_tokens_on_a_tiny_model(tiny):
    """``python -m steer_ui.tools.sampling_cost``: every setting timed both ways, every draw the same token (the
    tiny vocabulary takes the plain forms, so this checks the tool, not the shortcuts: the tests above do)."""
    from steer_ui.tools import sampling_cost

    out = sampling_cost.time_sampling(tiny("llama"), reps=2)
    assert set(out) == set(sampling_cost.SETTINGS)
    for row in out.values():
        assert row["whole vocabulary"] > 0 and row["sampler"] > 0
        assert row["same_token"] == f"{2 * len(sampling_cost.PROBE_PROMPTS)}/{2 * len(sampling_cost.PROBE_PROMPTS)}"
    steps = sampling_cost.time_decode(tiny("llama"), tokens=4, reps=2)
    assert len(steps) == 6 and all(ms > 0 for ms in steps.values())
