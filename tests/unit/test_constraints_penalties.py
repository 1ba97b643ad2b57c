"""The training penalties on tiny models: exact values and gradients without autograd over the vocabulary,
and the steered final residual at every position (where the penalties act) equal to a full forward pass."""
from __future__ import annotations

import pytest
import torch

from steer_ui.methods import constraints as C

TEXTS = ["The capital of France is Paris.", "Water boils at one hundred degrees.", "Hi", "A cat sat on the mat"]


def _reference(h, base_final, steered_final, added, bound, reduction):
    """The penalties the plain way: full logits with autograd, through logit_penalty and kl_penalty."""
    base = C.logits_of(h, base_final).detach()
    steered = C.logits_of(h, steered_final)
    direct = C.logits_of(h, base_final + added) - base
    logit = C.logit_penalty(steered - base, bound, reduction) + C.logit_penalty(direct, bound, reduction)
    kl = C.kl_penalty(base.log_softmax(-1), steered.log_softmax(-1))
    worst = float(C.centred(steered - base).detach().abs().max())
    return logit, kl, worst


@pytest.mark.parametrize("family", ["llama", "gemma2"])  # gemma2: a logit soft-cap and a norm with a weight
@pytest.mark.parametrize("reduction", ["max", "sum", "mean"])
def test_penalties_have_the_values_and_gradients_of_the_plain_autograd_computation(tiny, family, reduction):
    h = tiny(family)
    g = torch.Generator().manual_seed(0)
    width = h.arch.hidden_size
    base_final = torch.randn(7, width, generator=g) * 3
    direction = torch.randn(width, generator=g)
    mixing = torch.randn(width, width, generator=g) / width ** 0.5
    # a nonlinear map from the vector to the steered residual, as the blocks above the layer would be
    bound = 0.05

    def steered_of(v):
        return base_final + v + torch.tanh(base_final @ mixing) * v.norm()

    got_v = (direction * 2).requires_grad_(True)
    lt, kt, worst = C.penalties(h, base_final, steered_of(got_v), got_v, bound, reduction, True, True)
    (lt + 0.7 * kt).backward()
    ref_v = (direction * 2).requires_grad_(True)
    r_lt, r_kt, r_worst = _reference(h, base_final, steered_of(ref_v), ref_v, bound, reduction)
    (r_lt + 0.7 * r_kt).backward()
    lt, kt, r_lt, r_kt = (x.detach() for x in (lt, kt, r_lt, r_kt))
    assert float(lt) == pytest.approx(float(r_lt), rel=1e-4) and float(lt) > 0
    assert float(kt) == pytest.approx(float(r_kt), rel=1e-3, abs=1e-7) and float(kt) > 0
    assert worst == pytest.approx(r_worst, rel=1e-4)
    assert torch.allclose(got_v.grad, ref_v.grad, rtol=1e-3, atol=1e-5 * float(ref_v.grad.abs().max()))


def test_penalties_are_zero_with_no_gradient_below_the_bound(tiny):
    h = tiny("llama")
    base_final = torch.randn(3, h.arch.hidden_size, generator=torch.Generator().manual_seed(1))
    v = torch.zeros(h.arch.hidden_size, requires_grad=True)
    lt, kt, worst = C.penalties(h, base_final, base_final + v, v, 2.0, "max", True, True)
    (lt + kt).backward()
    assert float(lt.detach()) == 0.0 and float(kt.detach()) == pytest.approx(0.0, abs=1e-7) and worst == 0.0
    assert float(v.grad.abs().max()) == 0.0


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_the_steered_final_residual_at_every_position_is_a_full_forward_pass(tiny, family):
    # The cached prefix re-runs the final block's MLP on the last position only (all a detector reads); the
    # penalties read every generation position, so there each position must get its own MLP output.
    h = tiny(family)
    (batch,) = C.cache_prefix(h, TEXTS, 1, batch_size=8, keep_final=True)
    with torch.no_grad():
        C.run_suffix(h, batch, None)  # the fast path first, so the final block is known to be sliceable
        everywhere = C.run_suffix_all(h, batch, None)
    real = batch.attention_mask.bool()
    assert torch.allclose(everywhere[real], batch.final_all.float()[real], atol=1e-4)


def test_chunk_bounds_cover_every_position_in_chunks_above_the_tuned_row_counts():
    for n in (1, 63, 64, 65, 128, 129, 200, 1000):
        chunks = C.chunk_bounds(n, 64)
        assert chunks[0][0] == 0 and chunks[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(chunks, chunks[1:]))
        sizes = [e - s for s, e in chunks]
        assert max(sizes) <= 128 and (n <= 64 or min(sizes) >= 64)
    assert C.chunk_bounds(0) == []
