"""The one-pass summary of a decode step's logits (steer_ui/model/vocab_pass.py, vocab_kernel.c) against torch."""
from __future__ import annotations

import pytest
import torch

from steer_ui.model import vocab_pass
from steer_ui.model.architecture import argmax_last
from steer_ui.model.generation import DecodeBatch, Request, Sampling
from steer_ui.model.hooks import Steer

pytestmark = pytest.mark.skipif(vocab_pass._kernel() is None, reason="no C compiler to build vocab_kernel.c")


@pytest.mark.parametrize("rows, vocab, k", [(1, 262_144, 5), (3, 50_257, 1), (16, 32_000, 64), (2, 4_099, 7)])
def test_each_row_has_torchs_top_k_and_argmax_and_its_log_sum_exp(rows, vocab, k):
    x = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(rows)) * 4
    s = vocab_pass.summarise(x, k)
    values, indices = torch.topk(x, k)
    assert torch.equal(s.top_values, values) and torch.equal(s.top_indices, indices)
    assert torch.equal(s.top_indices[:, 0], argmax_last(x))
    assert torch.allclose(s.lse, torch.logsumexp(x, -1), rtol=0, atol=4e-6)  # float32's rounding at these sizes
    # each row alone gets the very same numbers
    for r in range(rows):
        alone = vocab_pass.summarise(x[r:r + 1].clone(), k)
        assert torch.equal(alone.lse, s.lse[r:r + 1]) and torch.equal(alone.top_indices, s.top_indices[r:r + 1])


@pytest.mark.parametrize("flags", [(), ("-mno-avx512f",), ("-mno-avx2", "-mno-avx512f")])
def test_the_log_sum_exp_is_within_float32s_rounding_of_float64s_on_every_vector_width(flags):
    """Against a float64 reference, on the native build, the AVX2 build and the plain one (CI's CPU may have any)."""
    kernel = vocab_pass._kernel(flags)
    for rows, vocab in ((1, 9_999), (5, 262_144)):
        x = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(vocab)) * 6 - 20
        s = vocab_pass.summarise(x, 9, kernel=kernel)
        exact = torch.logsumexp(x.double(), -1)
        assert ((s.lse.double() - exact).abs() <= 2 * torch.finfo(torch.float32).eps * exact.abs()).all()
        assert torch.equal(s.top_indices, torch.topk(x, 9).indices)


def test_ties_keep_the_lower_index_first_across_slices():
    x = torch.full((1, 40_000), -3.0)
    x[0, [39_000, 5, 20_000, 6]] = 2.0  # four equal maxima in three of the eight slices
    s = vocab_pass.summarise(x, 6)
    assert s.top_indices[0, :4].tolist() == [5, 6, 20_000, 39_000]
    assert int(s.top_indices[0, 0]) == int(x.argmax())
    assert s.top_indices[0, 4:].tolist() == [0, 1]  # then the lowest of the -3.0 tokens


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_row_torch_must_say_about_is_left_to_torch(bad):
    x = torch.randn(2, 10_000)
    x[1, 77] = bad
    assert vocab_pass.summarise(x, 5) is None


def test_what_it_does_not_take_is_left_to_torch():
    assert vocab_pass.summarise(torch.randn(1, 100), 5) is None  # short: torch is cheap there
    assert vocab_pass.summarise(torch.randn(1, 10_000), 65) is None  # past the kernel's k
    assert vocab_pass.summarise(torch.randn(1, 10_000, dtype=torch.float64), 5) is None


def _decode(handle, specs, summary: bool, monkeypatch):
    monkeypatch.setattr(vocab_pass._SHORTEST, "value", 0 if summary else 10 ** 9)
    batch = DecodeBatch(handle)
    requests = [Request.make(handle, prompt, steers, sampling) for prompt, steers, sampling in specs]
    batch.admit(requests)
    while batch.requests:
        batch.sample()
        batch.advance()
    return [r.result for r in requests]


def test_a_batch_decodes_the_same_tokens_and_numbers_with_the_summary_as_with_torchs_passes(tiny, monkeypatch):
    """Greedy, penalised and sampled requests side by side in one batch (a tiny vocabulary, let through)."""
    handle = tiny("llama")
    steer = Steer(layer=1, vector=torch.randn(handle.arch.hidden_size, generator=torch.Generator().manual_seed(2)),
                  alpha=3.0)
    specs = [("Once upon", [steer], Sampling(max_new_tokens=8, stop_at_eos=False)),
             ("The cat", [steer], Sampling(max_new_tokens=8, stop_at_eos=False, repetition_penalty=1.3)),
             ("Hello", [steer], Sampling(max_new_tokens=8, stop_at_eos=False, temperature=0.9, seed=4,
                                         alternatives=3))]
    with_summary = _decode(handle, specs, True, monkeypatch)
    with_torch = _decode(handle, specs, False, monkeypatch)
    for a, b in zip(with_summary, with_torch):
        for side_a, side_b in ((a.unsteered, b.unsteered), (a.steered, b.steered)):
            assert [t.token_id for t in side_a.tokens] == [t.token_id for t in side_b.tokens]
            for ta, tb in zip(side_a.tokens, side_b.tokens):
                assert abs(ta.logprob - tb.logprob) < 1e-5
                assert [x for x, _ in ta.alternatives] == [x for x, _ in tb.alternatives]
                assert all(abs(p - q) < 1e-5 for (_, p), (_, q) in zip(ta.alternatives, tb.alternatives))


# ---------------------------------------------------------------- the dose-response's pass (vocab_pass.compare)
def _reference(x: torch.Tensor, base: torch.Tensor) -> dict:
    """The sweep frame's numbers in float64, each row against ``base``."""
    lu, ls = base.double().log_softmax(-1), x.double().log_softmax(-1)
    return {"kl": (lu.exp() * (lu - ls)).sum(-1), "entropy": -(ls.exp() * ls).sum(-1),
            "top1_prob": ls.exp().amax(-1), "max_abs_delta_logit": (x.double() - base.double()).abs().amax(-1)}


@pytest.mark.parametrize("flags", [(), ("-mno-avx512f",), ("-mno-avx2", "-mno-avx512f")])
@pytest.mark.parametrize("rows, vocab", [(1, 262_144), (21, 50_257), (3, 9), (2, 4_099)])
def test_each_row_against_the_base_is_float64s_kl_entropy_and_top_to_1e_6_on_every_vector_width(flags, rows, vocab):
    """Against a float64 reference on the native, AVX2 and plain builds (torch's float32 passes were 3e-4 off the
    KL of a 21-row sweep of the embedded model); the argmax is torch's first maximum; a row equal to the base has
    a KL of exactly 0, and a row's numbers are the same alone."""
    kernel = vocab_pass._compare_kernel(flags)
    g = torch.Generator().manual_seed(vocab + rows)
    base = torch.randn(vocab, generator=g) * 5
    x = base + torch.randn(rows, vocab, generator=g) * torch.linspace(0, 3, rows).unsqueeze(1)  # row 0: the base
    seen = vocab_pass.compare(x, base, kernel=kernel)
    exact = _reference(x, base)
    for name, value in exact.items():
        assert torch.allclose(getattr(seen, name), value, rtol=1e-6, atol=1e-6), name
    assert torch.equal(seen.top1, argmax_last(x))
    assert float(seen.kl[0]) == 0.0 and float(seen.max_abs_delta_logit[0]) == 0.0
    for r in range(rows):
        alone = vocab_pass.compare(x[r:r + 1].clone(), base, kernel=kernel)
        assert torch.equal(alone.kl, seen.kl[r:r + 1]) and torch.equal(alone.entropy, seen.entropy[r:r + 1])


def test_the_first_maximum_wins_across_slices_and_odd_rows_are_left_to_torch():
    base = torch.zeros(40_000)
    x = torch.full((1, 40_000), -3.0)
    x[0, [39_000, 20_000, 6]] = 2.0
    assert int(vocab_pass.compare(x, base).top1[0]) == 6
    for bad in (float("nan"), float("inf"), float("-inf")):
        odd = x.clone()
        odd[0, 77] = bad
        assert vocab_pass.compare(odd, base) is None
    assert vocab_pass.compare(x.double(), base.double()) is None
    assert vocab_pass.compare(x, base[:-1]) is None
    assert vocab_pass.compare(torch.randn(1, 7), torch.randn(7)) is None  # fewer values than the kernel's slices


def test_the_sweep_frame_is_the_same_with_the_kernel_as_with_torchs_passes(tiny, monkeypatch):
    from steer_ui.model.analysis import sweep

    handle = tiny("llama")
    v = torch.randn(64, generator=torch.Generator().manual_seed(3))
    alphas = [-6.0, 0.0, 2.0, 9.0]
    fast = sweep(handle, "sweep me", v, 1, alphas, target="a")
    monkeypatch.setattr(vocab_pass, "compare", lambda *a, **k: None)
    slow = sweep(handle, "sweep me", v, 1, alphas, target="a")
    assert list(fast.top1_token_id) == list(slow.top1_token_id) and list(fast.top1_token) == list(slow.top1_token)
    assert fast.kl[1] == 0.0
    for column in ("kl", "entropy", "top1_prob", "max_abs_delta_logit", "target_prob"):
        assert list(fast[column]) == pytest.approx(list(slow[column]), rel=1e-4, abs=1e-5), column
