"""lm_head constraints: the penalties, the cached-prefix machinery, and constrain_vector on a tiny model."""
from __future__ import annotations

import pytest
import torch

from steer_ui.methods import constraints as C
from steer_ui.model.hooks import Steer, StepState, steering
from steer_ui.model.units import relative_scale

TEXTS = ["hello there", "a much longer sentence, with commas", "xy", "the cat sat on the mat"]


# ---------------------------------------------------------------- penalties
def test_logit_penalty_zero_below_threshold_positive_above():
    # rows whose changes already average to zero: centring leaves them as they are
    below = torch.tensor([[0.5, -1.9, 1.4, 0.0]])
    assert float(C.logit_penalty(below, max_change=2.0)) == 0.0
    above = torch.tensor([[0.5, -5.0, 3.0, 1.5]])
    # excess: 3 (|-5| - 2) and 1 (3 - 2)
    assert float(C.logit_penalty(above, 2.0, "sum")) == pytest.approx(4.0)
    assert float(C.logit_penalty(above, 2.0, "mean")) == pytest.approx(1.0)
    assert float(C.logit_penalty(above, 2.0, "max")) == pytest.approx(3.0)


def test_logit_penalty_averages_rows_and_has_gradient_only_above():
    delta = torch.tensor([[-3.0, 3.0], [1.0, -1.0]], requires_grad=True)
    pen = C.logit_penalty(delta, 2.0, "sum")
    assert float(pen.detach()) == pytest.approx(1.0)  # row 0 excess 1 + 1, row 1 excess 0, mean over rows
    pen.backward()
    # through the centring: each over-bound token pushes itself by 1/2 and every token back by its share
    assert delta.grad.tolist() == [[-0.5, 0.5], [0.0, 0.0]]


@pytest.mark.parametrize("reduction", C.REDUCTIONS)
def test_logit_penalty_is_shift_invariant(reduction):
    """Adding one constant to every logit of a row moves no probability, so it costs nothing."""
    g = torch.Generator().manual_seed(0)
    delta = torch.randn(3, 50, generator=g) * 3
    shifts = torch.tensor([[100.0], [-7.5], [0.0]])
    assert float(C.logit_penalty(delta, 2.0, reduction)) > 0
    assert float(C.logit_penalty(delta + shifts, 2.0, reduction)) == pytest.approx(
        float(C.logit_penalty(delta, 2.0, reduction)), rel=1e-5)
    # a pure shift, however large, is no change at all
    assert float(C.logit_penalty(torch.zeros(3, 50) + shifts, 2.0, reduction)) == 0.0
    assert torch.allclose(C.centred(delta + shifts), C.centred(delta), atol=1e-4)
    assert torch.allclose(C.centred(delta).mean(-1), torch.zeros(3), atol=1e-5)


def test_logit_penalty_rejects_bad_arguments():
    with pytest.raises(ValueError, match="reduction"):
        C.logit_penalty(torch.zeros(3), 1.0, "median")
    with pytest.raises(ValueError, match="max_change"):
        C.logit_penalty(torch.zeros(3), -1.0)


def test_kl_penalty_zero_for_same_distribution_and_matches_definition():
    logits = torch.randn(3, 11, generator=torch.Generator().manual_seed(0))
    lp = logits.log_softmax(-1)
    assert float(C.kl_penalty(lp, lp)) == pytest.approx(0.0, abs=1e-6)
    other = (logits + torch.randn(3, 11, generator=torch.Generator().manual_seed(1))).log_softmax(-1)
    manual = (lp.exp() * (lp - other)).sum(-1).mean()
    assert float(C.kl_penalty(lp, other)) == pytest.approx(float(manual), rel=1e-5)
    assert float(C.kl_penalty(lp, other)) > 0


def test_direct_delta_logits_without_norm_is_the_unembedding_projection(tiny):
    h = tiny("llama")
    v = torch.randn(h.arch.hidden_size, generator=torch.Generator().manual_seed(0))
    expected = h.arch.unembedding.float() @ v
    assert torch.allclose(C.direct_delta_logits(h, v), expected, atol=1e-5)


def test_direct_delta_logits_through_norm_is_zero_for_zero_vector(tiny):
    h = tiny("gemma3")
    base = torch.randn(2, h.arch.hidden_size, generator=torch.Generator().manual_seed(0))
    d = C.direct_delta_logits(h, torch.zeros(h.arch.hidden_size), base)
    assert d.shape == (2, h.arch.vocab_size)
    assert float(d.abs().max()) == 0.0


# ------------------------------------------------------ cached frozen prefix
def _hooked_final(h, text, layer, vec):
    """Final residual at the last position with the vector added by the real hook path (no cache)."""
    ids = h.tokenizer(text, return_tensors="pt").input_ids
    got = {}

    def grab(_m, _i, out):
        got["x"] = (out[0] if isinstance(out, tuple) else out)[0, -1].float()

    hook = h.arch.layers[-1].register_forward_hook(grab)
    try:
        with torch.no_grad(), steering(h, [Steer(layer=layer, vector=vec, alpha=1.0)], StepState()):
            h.model.base_model(input_ids=ids, use_cache=False)
    finally:
        hook.remove()
    return got["x"]


@pytest.mark.parametrize("family", ["llama", "gemma3", "gpt2", "gpt_neox"])
def test_run_suffix_matches_the_hooked_model_and_ignores_padding(tiny, family):
    h = tiny(family)
    layer = 1
    vec = torch.randn(h.arch.hidden_size, generator=torch.Generator().manual_seed(3))
    batches = C.cache_prefix(h, TEXTS, layer, batch_size=4)
    assert len(batches) == 1 and sorted(batches[0].index) == list(range(len(TEXTS)))
    b = batches[0]
    with torch.no_grad():
        unsteered = C.run_suffix(h, b, None)
        steered = C.run_suffix(h, b, vec)
    assert torch.allclose(unsteered, b.final_last, atol=1e-5)
    for row, i in enumerate(b.index):  # each row alone, unpadded, through the hooks
        ref = _hooked_final(h, TEXTS[i], layer, vec)
        assert torch.allclose(steered[row], ref, atol=1e-4), (family, TEXTS[i])


def test_select_restricts_rows_and_gradients_reach_the_vector(tiny):
    h = tiny("llama")
    b = C.cache_prefix(h, TEXTS, 2, batch_size=4)[0]
    vec = torch.randn(h.arch.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = C.run_suffix(h, b, vec)
    part = b.select([2, 0])
    assert part.index == [b.index[2], b.index[0]]
    v = vec.clone().requires_grad_(True)
    out = C.run_suffix(h, part, v)
    assert torch.allclose(out.detach(), full[[2, 0]], atol=1e-5)
    out.sum().backward()
    assert v.grad is not None and float(v.grad.abs().sum()) > 0
    assert all(not p.requires_grad for p in h.model.parameters())


def test_cache_prefix_rejects_a_missing_layer(tiny):
    h = tiny("llama")
    with pytest.raises(ValueError, match="layer 9 does not exist"):
        C.cache_prefix(h, TEXTS, 9)


# ----------------------------------------------------------- constrain_vector
def _aligned_handle():
    """A tiny model whose token 'Z' has a big unembedding row, and a vector along that row."""
    from steer_ui.tiny import tiny_handle

    h = tiny_handle("llama")  # a private copy: the weights are edited
    token = h.tokenizer("Z", add_special_tokens=False).input_ids[0]
    with torch.no_grad():
        w = h.arch.unembedding
        w[token] = w[token] / w[token].norm() * 8.0
    return h, token, w[token].detach().clone()


def test_constrain_vector_lowers_max_delta_logit_on_an_aligned_row():
    h, token, row = _aligned_handle()
    layer = 2
    vec = row / row.norm()
    alpha = 3.0 * relative_scale(h, layer)
    view_before = C.measure_delta(h, C.cache_prefix(h, list(C_PROMPTS), layer), alpha * vec)
    assert view_before["max_abs_delta_logit"] > 6.0  # the explosion the constraint must fix
    assert view_before["top_tokens"][0]["token_id"] == token
    new, report = C.constrain_vector(h, vec, layer=layer, alpha=alpha / float(vec.norm()), prompts=C_PROMPTS,
                                     max_change=2.0, steps=80, lr=0.05)
    assert new.shape == vec.shape
    assert float(new.norm()) == pytest.approx(float(vec.norm()), rel=1e-4)  # strength kept, direction changed
    before, after = report["before"]["max_abs_delta_logit"], report["after"]["max_abs_delta_logit"]
    assert before == pytest.approx(view_before["max_abs_delta_logit"], rel=1e-4)
    assert after < 0.5 * before
    assert after <= 1.5 * 2.0
    assert 0 < report["cosine_to_original"] < 0.999
    assert len(report["curve"]) == 80


def test_constrain_vector_keeps_a_steering_vector_record():
    from steer_ui.vector import SteeringVector

    h, _token, row = _aligned_handle()
    sv = SteeringVector(directions={1: row}, hidden_size=h.arch.hidden_size, method="mean-diff")
    new, report = C.constrain_vector(h, sv, alpha=1.0, prompts=C_PROMPTS[:2], steps=3)
    assert isinstance(new, SteeringVector) and new.layer == 1 and new.method == "mean-diff"
    assert new.hyperparameters["constrained"]["max_change"] == 2.0
    assert report["layer"] == 1


def test_constrain_vector_refuses_zero_and_wrong_size(tiny):
    h = tiny("llama")
    with pytest.raises(ValueError, match="all zeros"):
        C.constrain_vector(h, torch.zeros(h.arch.hidden_size), layer=1)
    with pytest.raises(ValueError, match="hidden size"):
        C.constrain_vector(h, torch.ones(3), layer=1)


C_PROMPTS = ("The weather is mild today.", "She opened the book.", "Water boils at sea level.")
