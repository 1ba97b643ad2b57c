import pytest
import torch

from steer_ui.model.analysis import naive_logits, next_token, score_answer, sweep, vocab_projection
from steer_ui.model.hooks import Steer
from steer_ui.model.prefix import for_prompt
from steer_ui.model.units import to_raw_alpha
from steer_ui.tiny import FAMILIES


@pytest.mark.parametrize("family", FAMILIES)
def test_fast_path_equals_full_forward(tiny, family):
    handle = tiny(family)
    v = torch.randn(64)
    for layer in (0, 2, 3):
        steers = [Steer(layer=layer, vector=v, alpha=3.0)]
        fast = for_prompt(handle, "The fast path", layer).logits(steers, rows=1)[0]
        slow = naive_logits(handle, "The fast path", steers)[0]
        torch.testing.assert_close(fast, slow, atol=1e-4, rtol=1e-4)


def test_fast_path_with_two_layers_and_input_dependent(tiny):
    handle = tiny("llama")
    v1, v2 = torch.randn(64), torch.randn(64)
    w = torch.randn(64, 64) * 0.05
    steers = [Steer(layer=1, vector=v1, alpha=2.0), Steer(layer=3, vector=v2, alpha=-1.0),
              Steer(layer=2, fn=lambda h: h @ w, context_layer=1, alpha=1.0)]
    fast = for_prompt(handle, "two layers", 1).logits(steers, rows=1)[0]
    slow = naive_logits(handle, "two layers", steers)[0]
    torch.testing.assert_close(fast, slow, atol=1e-4, rtol=1e-4)


def test_next_token_view(tiny):
    handle = tiny("gemma3")
    v = torch.randn(64)
    view = next_token(handle, "next", [Steer(layer=1, vector=v, alpha=10.0)], top_k=5)
    assert len(view.unsteered) == 5 and len(view.steered) == 5
    assert view.unsteered.prob.is_monotonic_decreasing
    assert view.kl > 0 and view.max_abs_delta_logit > 0
    assert view.promoted.delta_logit.iloc[0] == pytest.approx(view.max_abs_delta_logit) or \
        view.suppressed.delta_logit.iloc[0] == pytest.approx(-view.max_abs_delta_logit)
    zero = next_token(handle, "next", [Steer(layer=1, vector=v, alpha=0.0)], top_k=5)
    assert zero.kl == pytest.approx(0.0, abs=1e-6) and zero.max_abs_delta_logit < 1e-4
    slow = next_token(handle, "next", [Steer(layer=1, vector=v, alpha=10.0)], top_k=5, fast=False)
    assert slow.kl == pytest.approx(view.kl, rel=1e-3, abs=1e-6)


def test_next_token_view_with_terms_at_two_blocks_takes_the_fast_path_and_equals_the_slow_one(tiny, monkeypatch):
    """The slider's whole view for a spec of two terms (issue #48): the prefix is cached below the lowest steered
    block and the blocks above re-run with the other term's hook; no full forward runs, and the view is the one
    two full forwards give."""
    from steer_ui.model import analysis

    handle = tiny("llama")
    g = torch.Generator().manual_seed(4)
    steers = [Steer(layer=2, vector=torch.randn(64, generator=g), alpha=6.0),
              Steer(layer=1, vector=torch.randn(64, generator=g), alpha=-4.0)]
    slow = next_token(handle, "two terms", steers, top_k=5, fast=False)
    full_forwards = []
    real = analysis.naive_logits
    monkeypatch.setattr(analysis, "naive_logits", lambda *a, **k: full_forwards.append(1) or real(*a, **k))
    fast = next_token(handle, "two terms", steers, top_k=5)
    assert not full_forwards
    assert list(fast.steered.token_id) == list(slow.steered.token_id)
    assert list(fast.steered.prob) == pytest.approx(list(slow.steered.prob), abs=1e-5)
    assert fast.kl == pytest.approx(slow.kl, abs=1e-5) and fast.kl > 1e-3
    one = next_token(handle, "two terms", steers[:1], top_k=5)
    assert list(one.steered.prob) != pytest.approx(list(fast.steered.prob), abs=1e-5)  # the second term counted


def test_sweep_rows_match_single_calls(tiny):
    handle = tiny("qwen3")
    v = torch.randn(64)
    alphas = [-4.0, 0.0, 2.0, 8.0]
    frame = sweep(handle, "sweep me", v, 2, alphas, target="a")
    assert list(frame.alpha) == alphas
    assert frame.kl.iloc[1] == pytest.approx(0.0, abs=1e-6)
    for a, kl in zip(alphas, frame.kl):
        single = next_token(handle, "sweep me", [Steer(layer=2, vector=v, alpha=a)])
        assert kl == pytest.approx(single.kl, rel=1e-3, abs=1e-6)
    assert {"entropy", "top1_token", "top1_prob", "max_abs_delta_logit", "target_prob"} <= set(frame.columns)


def test_vocab_projection_finds_aligned_token(tiny):
    handle = tiny("llama")
    token_id = 100
    v = handle.arch.unembedding[token_id].clone()
    frame = vocab_projection(handle, v, top_k=3)
    assert int(frame[frame.direction == "+"].token_id.iloc[0]) == token_id


def test_score_answer(tiny):
    handle = tiny("llama")
    v = torch.randn(64)
    frame = score_answer(handle, "Q: hi A:", " yes", [Steer(layer=1, vector=v, alpha=10.0, positions="all")])
    assert len(frame) == 4  # " yes" is 4 bytes
    assert frame.attrs["nats_shifted"] == pytest.approx(frame.delta.sum())
    # unsteered column equals a direct teacher-forced computation
    ids = handle.tokenizer("Q: hi A: yes", return_tensors="pt").input_ids
    with torch.inference_mode():
        logp = handle.model(input_ids=ids).logits[0].log_softmax(-1)
    n = len(frame)
    direct = [float(logp[-n - 1 + i, ids[0, -n + i]]) for i in range(n)]
    assert frame.logprob_unsteered.tolist() == pytest.approx(direct, abs=1e-4)


def test_relative_alpha_uses_layer_norm(tiny):
    handle = tiny("llama")
    norms = handle.layer_norms()
    assert len(norms) == 4 and all(n > 0 for n in norms)
    assert to_raw_alpha(handle, 0.5, 2, relative=True) == pytest.approx(0.5 * norms[2])
    assert to_raw_alpha(handle, 0.5, 2, relative=False) == 0.5


def test_the_explosion_flag_reads_the_likely_tokens_not_the_vocabulary_tail(tiny):
    """A push that moves only improbable tokens (p ~ 0 before and after) raises no flag, however far; the same push
    on a likely token does (issue #32)."""
    import torch

    from steer_ui.model.analysis import EXPLOSION_THRESHOLD, LIKELY_PROB, compare_logits

    handle = tiny("llama")
    vocab = handle.arch.vocab_size
    unsteered = torch.full((vocab,), -30.0)
    unsteered[:5] = torch.tensor([5.0, 4.0, 3.0, 2.0, 1.0])  # five likely tokens, the rest ~e-35
    tail = unsteered.clone()
    tail[100] += 25.0  # a tail token jumps by 25 and is still improbable
    view = compare_logits(handle, unsteered, tail)
    assert view.max_abs_delta_logit == pytest.approx(25.0, abs=1e-4)  # the whole vocabulary's raw maximum
    assert not view.exploding and view.likely_max_abs_delta_logit < 1.0
    assert set(view.likely_promoted.token_id) <= set(range(5)) and view.likely_tokens == 5
    assert (view.likely_promoted.prob_steered >= LIKELY_PROB).all()  # promoted: likely after steering
    assert (view.likely_suppressed.prob_unsteered >= LIKELY_PROB).all()  # suppressed: likely before it
    likely = unsteered.clone()
    likely[3] += EXPLOSION_THRESHOLD + 2  # a likely token's odds move by e^12
    view = compare_logits(handle, unsteered, likely)
    assert view.exploding and view.likely_max_delta_token == handle.tokenizer.decode([3])
    assert view.as_dict()["exploding"] is True


def test_the_slider_reuses_the_unsteered_side_and_its_views_equal_fresh_ones(tiny):
    """A slider move compares against the prompt's unsteered side built once (analysis.Reference, kept with the
    prefix); each view must equal one computed from the raw logits, and a view's frames stay its own."""
    from steer_ui.model.analysis import compare_logits, prefix_state, unsteered_reference

    handle = tiny("gemma3")
    v = torch.randn(64, generator=torch.Generator().manual_seed(7))
    st = prefix_state(handle, "reuse the unsteered side", 1)
    ref = unsteered_reference(st)
    for alpha in (0.0, 4.0, -9.0):
        view = next_token(handle, "reuse the unsteered side", [Steer(layer=1, vector=v, alpha=alpha)], top_k=4)
        steered = st.logits([Steer(layer=1, vector=v, alpha=alpha)], rows=1)[0]
        assert view.as_dict() == compare_logits(handle, st.unsteered_logits[0], steered, top_k=4).as_dict()
        view.unsteered.loc[0, "prob"] = -1.0  # a caller editing its frame leaves the next view alone
    assert unsteered_reference(st) is ref and ref.frame(handle, 4).prob.iloc[0] > 0
    assert st.select([0]).memo == {}  # a cut prefix derives its own
