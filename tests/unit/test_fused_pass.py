"""The fused pass (steer_ui/model/fused_pass.py): a prefix's blocks above L re-run in one C call a block.

On a CPU it is what a slider move, a sweep and an α grid take for Gemma 3 with int8 weights.  It must give the
modules' logits to float32 noise (its norms, rope and attention sum in another order) across blocks, α, per-row
vectors, special tokens and a prompt longer than the sliding window; a row must not depend on the rows beside it
(a sweep's row equals the slider's one-row call bit for bit); and what it cannot take (steers at later blocks,
which act through the modules' hooks; left-padded batches; other models) must go through the modules.
"""
import pytest
import torch

from steer_ui.model import fused_pass
from steer_ui.model.hooks import HeadSteer, Steer
from steer_ui.model.int8 import kernel_available
from steer_ui.model.prefix import for_prompt, for_texts
from steer_ui.tiny import tiny_handle

pytestmark = pytest.mark.skipif(not kernel_available(), reason="no C compiler: the fused kernel is not built")

LONG = "a prompt long enough to run well past the sliding window of sixteen tokens, twice over at least"


@pytest.fixture(scope="module")
def gemma3():
    """A 6-block tiny Gemma 3 (sliding-window blocks beside a full one, window 16) with int8 weights."""
    return tiny_handle("gemma3", layers=6, int8=True)


def _vector(handle, seed: int) -> torch.Tensor:
    return torch.randn(handle.arch.hidden_size, generator=torch.Generator().manual_seed(seed))


def _both(prefix, steers, rows):
    """(the fused pass's logits, the modules' logits) of one call."""
    fused = prefix.logits(steers, rows=rows)
    with fused_pass.modules_only():
        modules = prefix.logits(steers, rows=rows)
    return fused, modules


def _agree(fused: torch.Tensor, modules: torch.Tensor) -> None:
    scale = float(modules.abs().max())
    assert float((fused - modules).abs().max()) <= 1e-4 * max(scale, 1.0)
    assert torch.equal(fused.argmax(-1), modules.argmax(-1))


@pytest.mark.parametrize("layer", [0, 2, 4, 5])
@pytest.mark.parametrize("prompt", ["hi", LONG])
def test_the_pass_gives_the_modules_logits_at_every_block(gemma3, layer, prompt):
    prefix = for_prompt(gemma3, prompt, layer)
    assert fused_pass.why_not(prefix) is None
    if prompt == LONG:
        assert prefix.input_ids.shape[1] > 2 * gemma3.model.config.sliding_window
    alphas = torch.tensor([-6.0, -1.5, 0.0, 2.0, 8.0])
    fused, modules = _both(prefix, [Steer(layer=layer, vector=_vector(gemma3, layer), alpha=alphas)], len(alphas))
    _agree(fused, modules)
    assert not torch.equal(fused[0], fused[-1])  # the rows really were steered apart


def test_a_row_does_not_depend_on_the_rows_beside_it(gemma3):
    prefix = for_prompt(gemma3, LONG, 2)
    vector = _vector(gemma3, 7)
    alphas = [-4.0, 0.5, 3.0, 9.0]
    batched = prefix.logits([Steer(layer=2, vector=vector, alpha=torch.tensor(alphas))], rows=len(alphas))
    for i, a in enumerate(alphas):
        assert torch.equal(prefix.logits([Steer(layer=2, vector=vector, alpha=a)], rows=1)[0], batched[i])


def test_per_row_vectors_and_special_tokens(gemma3):
    eos = gemma3.tokenizer.eos_token
    prefix = for_prompt(gemma3, f"one turn{eos} and the next one", 1)
    vectors = torch.stack([_vector(gemma3, s) for s in (1, 2, 3)])
    for special in (False, True):
        steer = Steer(layer=1, vector=vectors, alpha=torch.tensor([3.0, -2.0, 5.0]), special_tokens=special)
        _agree(*_both(prefix, [steer], 3))


def test_steers_at_later_blocks_are_added_between_the_calls_as_their_hooks_add_them(gemma3):
    """A second term above the prefix's block (the slider with two vectors, a sweep with a held row): added to
    its block's output between the calls, per row too, with the special tokens left alone, and so the modules'
    numbers to float noise; a per-head steer there goes through the modules."""
    eos = gemma3.tokenizer.eos_token
    prefix = for_prompt(gemma3, f"{LONG}{eos} and on", 1)
    here = Steer(layer=1, vector=_vector(gemma3, 4), alpha=torch.tensor([3.0, -2.0, 0.5]))
    for later in ([Steer(layer=4, vector=_vector(gemma3, 5), alpha=6.0)],
                  [Steer(layer=3, vector=torch.stack([_vector(gemma3, s) for s in (6, 7, 8)]),
                         alpha=torch.tensor([1.0, -4.0, 2.5])), Steer(layer=5, vector=_vector(gemma3, 9), alpha=-3.0,
                                                                      special_tokens=True)]):
        assert fused_pass.why_not(prefix, later) is None
        fused, modules = _both(prefix, [here, *later], 3)
        _agree(fused, modules)
        assert not torch.equal(fused, prefix.logits([here], rows=3))  # the later steers did something
    heads = HeadSteer({4: torch.randn(gemma3.model.config.num_attention_heads * gemma3.model.config.head_dim)},
                      alpha=2.0)
    assert "per-head" in fused_pass.why_not(prefix, [heads])


def test_padded_batches_go_through_the_modules(gemma3):
    padded = for_texts(gemma3, ["short", LONG], 1)
    assert len(padded) == 1 and "left-padded" in fused_pass.why_not(padded[0])


@pytest.mark.parametrize("family, why", [("llama", "Gemma 3"), ("gemma3", "not int8")])
def test_other_models_go_through_the_modules_and_say_why(family, why):
    handle = tiny_handle(family, int8=family == "llama")
    assert why in fused_pass.why_not(for_prompt(handle, "hello there", 1))


def test_a_switched_weight_path_is_seen_at_the_next_call(gemma3):
    """The blocks kept on the handle hold the addresses of one product path's codes: switching a weight's path
    (a tool's A/B run) must build them again, never call the kernel on stale addresses."""
    prefix = for_prompt(gemma3, LONG, 2)
    steer = Steer(layer=2, vector=_vector(gemma3, 9), alpha=4.0)
    before = prefix.logits([steer], rows=1)
    weight = gemma3.arch.layers[3].mlp.down_proj.int8
    weight.w8a8, was = True, weight.w8a8
    try:
        assert "int8 activations" in fused_pass.why_not(prefix)
    finally:
        weight.w8a8 = was
    assert fused_pass.why_not(prefix) is None
    assert torch.equal(prefix.logits([steer], rows=1), before)


def test_a_long_prompt_runs_a_few_rows_a_call_with_the_same_numbers(gemma3, monkeypatch):
    """A call's attention scores grow with the prompt's length squared: past SCRATCH_FLOATS the pass runs a few α
    rows at a time, which changes no number (rows are computed alone)."""
    prefix = for_prompt(gemma3, LONG, 1)
    steer = Steer(layer=1, vector=_vector(gemma3, 11), alpha=torch.tensor([-3.0, 1.0, 4.0, 7.0, -9.0]))
    held = Steer(layer=3, vector=torch.stack([_vector(gemma3, s) for s in range(5)]), alpha=torch.arange(5.0) - 2)
    steer = [steer, held]  # and a later term, per row, taken at each chunk's rows
    whole = prefix.logits(steer, rows=5)
    calls = []
    run = fused_pass._final_last
    monkeypatch.setattr(fused_pass, "_final_last", lambda *a: calls.append(a[2].shape[0]) or run(*a))
    monkeypatch.setattr(fused_pass, "SCRATCH_FLOATS", 2 * fused_pass._blocks(gemma3)[0].scratch_floats(
        prefix.input_ids.shape[1], gemma3.arch.hidden_size, prefix.input_ids.shape[1]))
    assert torch.equal(prefix.logits(steer, rows=5), whole) and calls == [2, 2, 1]


def test_the_unsteered_side_comes_from_the_same_arithmetic_so_a_view_goes_to_nothing_with_alpha(gemma3):
    """Against the modules' own unsteered logits every steered view carried the two paths' rounding: a Δlogit and a
    KL that did not go to 0 with α (a review).  The unsteered reference takes the pass too, so a row at α 0 is it
    bit for bit and a vanishing α moves nothing."""
    from steer_ui.model.analysis import compare_logits, unsteered_reference

    prefix = for_prompt(gemma3, LONG, 2)
    vector = _vector(gemma3, 12)
    zero = prefix.logits([Steer(layer=2, vector=vector, alpha=torch.tensor([0.0, 1e-30]))], rows=2)
    assert torch.equal(zero[0], prefix.unsteered_logits[0]) and torch.equal(zero[1], prefix.unsteered_logits[0])
    view = compare_logits(gemma3, unsteered_reference(prefix), zero[1], 5)
    assert view.kl == 0.0 and view.max_abs_delta_logit == 0.0
    with fused_pass.modules_only():
        modules = for_prompt(gemma3, LONG, 2).unsteered_logits
    _agree(prefix.unsteered_logits, modules)
