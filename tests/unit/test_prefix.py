"""The frozen-prefix engine: one prompt or padded batches, Steers or plain additions, no hook left behind."""
from __future__ import annotations

import pytest
import torch

from steer_ui.model.analysis import naive_logits
from steer_ui.model.hooks import Steer, hook_count
from steer_ui.model.prefix import for_prompt, for_texts

TEXTS = ["hello there", "a much longer sentence, with commas", "xy"]


@pytest.mark.parametrize("family", ["llama", "gemma3", "gpt2"])
def test_padded_batch_logits_equal_each_row_alone(tiny, family):
    handle = tiny(family)
    v = torch.randn(handle.arch.hidden_size, generator=torch.Generator().manual_seed(0))
    (batch,) = for_texts(handle, TEXTS, 1, batch_size=8)
    alphas = torch.tensor([0.0, 2.0, -3.0])
    steered = batch.logits([Steer(layer=1, vector=v, alpha=alphas), Steer(layer=2, vector=v, alpha=1.0)])
    for row, i in enumerate(batch.index):
        alone = naive_logits(handle, TEXTS[i], [Steer(layer=1, vector=v, alpha=float(alphas[row])),
                                                Steer(layer=2, vector=v, alpha=1.0)])[0]
        torch.testing.assert_close(steered[row], alone, atol=1e-4, rtol=1e-4)
    assert hook_count(handle) == 0


def test_one_text_batch_is_the_prompt_prefix(tiny):
    handle = tiny("qwen2")
    single, batch = for_prompt(handle, "one engine", 2), for_texts(handle, ["one engine"], 2)[0]
    assert torch.equal(single.final_last, batch.final_last) and torch.equal(single.hidden, batch.hidden)
    v = torch.randn(64)
    torch.testing.assert_close(single.final(v), batch.final(v), atol=0, rtol=0)


def test_a_failing_input_dependent_vector_leaves_no_hook(tiny):
    handle = tiny("llama")
    prefix = for_prompt(handle, "boom", 1)

    def bad(_h):
        raise RuntimeError("bad vector function")

    with pytest.raises(RuntimeError, match="bad vector"):
        prefix.logits([Steer(layer=2, fn=bad, context_layer=1, alpha=1.0)], rows=1)
    assert hook_count(handle) == 0
    with pytest.raises(ValueError, match="above a steered block"):
        prefix.logits([Steer(layer=0, vector=torch.ones(64), alpha=1.0)], rows=1)


# ------------------------------------------------------------------ CUDA only: the slider's recorded re-run
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def _cuda_handle(family: str):
    from steer_ui.tiny import tiny_handle

    return tiny_handle(family, device="cuda")


@CUDA
@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_cuda_slider_rerun_is_recorded_once_and_replays_the_eager_logits(family):
    handle = _cuda_handle(family)
    v = torch.randn(handle.arch.hidden_size, generator=torch.Generator().manual_seed(1)).cuda()
    prompt = "The lighthouse keeper climbed the stairs"
    # each from a prefix of its own, whose first call runs eagerly
    eager = {a: for_prompt(handle, prompt, 1).logits([Steer(layer=1, vector=v, alpha=a)], rows=1)
             for a in (0.0, 1.5, -4.0, 9.0)}
    prefix = for_prompt(handle, prompt, 1)
    first = prefix.logits([Steer(layer=1, vector=v, alpha=0.0)], rows=1)  # the first call stays eager
    assert "rerun_graph" not in prefix.memo
    for alpha, expected in eager.items():
        got = prefix.logits([Steer(layer=1, vector=v, alpha=alpha)], rows=1)
        torch.testing.assert_close(got, expected, atol=0, rtol=0)
    assert "rerun_graph" in prefix.memo and "rerun_graph_error" not in prefix.memo
    torch.testing.assert_close(first, eager[0.0], atol=0, rtol=0)
    # against the full forward with the hook, as the slider's reference
    torch.testing.assert_close(prefix.logits([Steer(layer=1, vector=v, alpha=1.5)], rows=1),
                               naive_logits(handle, prompt, [Steer(layer=1, vector=v, alpha=1.5)]), atol=2e-4,
                               rtol=2e-4)
    assert hook_count(handle) == 0


@CUDA
def test_cuda_slider_replays_from_threads_at_once_each_get_their_own_alpha():
    from concurrent.futures import ThreadPoolExecutor

    handle = _cuda_handle("llama")
    v = torch.randn(handle.arch.hidden_size, generator=torch.Generator().manual_seed(2)).cuda()
    prompt = "Many visitors, one prompt"
    alphas = [float(a) for a in range(-8, 8)]
    expected = {a: for_prompt(handle, prompt, 2).logits([Steer(layer=2, vector=v, alpha=a)], rows=1) for a in alphas}
    prefix = for_prompt(handle, prompt, 2)
    prefix.logits([Steer(layer=2, vector=v, alpha=0.0)], rows=1)
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda a: (a, prefix.logits([Steer(layer=2, vector=v, alpha=a)], rows=1)), alphas * 4))
    for alpha, logits in got:
        torch.testing.assert_close(logits, expected[alpha], atol=0, rtol=0)
    assert "rerun_graph" in prefix.memo


def _rows_rerun(handle, prefix, steers, rows):
    """(logits, the batch sizes the blocks above the prefix ran with)."""
    seen = []
    remover = handle.arch.layers[-1].register_forward_pre_hook(lambda _m, args: seen.append(args[0].shape[0]))
    try:
        return prefix.logits(steers, rows=rows), seen
    finally:
        remover.remove()


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_rows_that_add_nothing_take_the_unsteered_logits_and_only_the_others_rerun(tiny, family):
    handle = tiny(family)
    prefix = for_prompt(handle, "a sweep's centre", 1)
    g = torch.Generator().manual_seed(4)
    v, w = (torch.randn(handle.arch.hidden_size, generator=g) for _ in range(2))
    alphas = [-2.0, 0.0, 1.5, -0.0, 3.0]
    got, seen = _rows_rerun(handle, prefix, [Steer(layer=1, vector=v, alpha=torch.tensor(alphas))], 5)
    assert seen == [3]  # the three rows that add something, in one pass
    for row, a in enumerate(alphas):
        alone = prefix.logits([Steer(layer=1, vector=v, alpha=a)], rows=1)[0] if a else prefix.unsteered_logits[0]
        torch.testing.assert_close(got[row], alone, atol=1e-5, rtol=1e-5)
        if not a:
            assert torch.equal(got[row], prefix.unsteered_logits[0])
    # a zero row of per-row vectors adds nothing either; a held steer elsewhere makes a zero-α row add something
    per_row = torch.stack([v, torch.zeros_like(v)])
    got, seen = _rows_rerun(handle, prefix, [Steer(layer=1, vector=per_row)], 2)
    assert seen == [1] and torch.equal(got[1], prefix.unsteered_logits[0])
    held = [Steer(layer=1, vector=v, alpha=torch.tensor([0.0, 1.0])), Steer(layer=2, vector=w, alpha=0.5)]
    got, seen = _rows_rerun(handle, prefix, held, 2)
    assert seen == [2] and not torch.equal(got[0], prefix.unsteered_logits[0])
    # nothing added anywhere: no pass at all
    got, seen = _rows_rerun(handle, prefix, [Steer(layer=1, vector=v, alpha=torch.zeros(3))], 3)
    assert seen == [] and all(torch.equal(r, prefix.unsteered_logits[0]) for r in got)
    assert hook_count(handle) == 0
