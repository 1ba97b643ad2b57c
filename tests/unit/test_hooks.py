import pytest
import torch

from steer_ui.model.analysis import naive_logits
from steer_ui.model.generation import Sampling, stream_side_by_side
from steer_ui.model.hooks import Steer, SteeringError, StepState, hook_count, steering


def _record_blocks(handle, ids):
    """One unsteered pass: each block's output and the (args, kwargs) each block was called with."""
    outputs, calls = {}, {}
    hooks = []
    for k, layer in enumerate(handle.arch.layers):
        hooks.append(layer.register_forward_pre_hook(
            lambda m, a, kw, k=k: calls.__setitem__(k, (a[1:], dict(kw))), with_kwargs=True))
        hooks.append(layer.register_forward_hook(
            lambda m, i, o, k=k: outputs.__setitem__(k, o[0] if isinstance(o, tuple) else o)))
    try:
        with torch.inference_mode():
            handle.model.base_model(input_ids=ids, use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    return outputs, calls


def test_adds_alpha_times_vector_at_block_output(tiny):
    """Steering block 1 equals re-running blocks 2.. by hand on (block-1 output + α·v), α·v added at every position
    but BOS (a special token) unless the steer asks for special tokens too."""
    handle = tiny("llama")
    ids = handle.tokenizer("abc", return_tensors="pt").input_ids
    assert ids[0, 0] == handle.tokenizer.bos_token_id
    v = torch.randn(64)
    for special_tokens, first in ((False, 0.0), (True, 1.0)):
        steered_logits = naive_logits(handle, "abc", [Steer(layer=1, vector=v, alpha=2.0,
                                                            special_tokens=special_tokens)])
        outputs, calls = _record_blocks(handle, ids)
        where = torch.ones(1, ids.shape[1], 1)
        where[0, 0] = first
        h = outputs[1] + 2.0 * v * where
        with torch.inference_mode():
            for i in range(2, handle.arch.num_layers):
                out = handle.arch.layers[i](h, *calls[i][0], **calls[i][1])
                h = out[0] if isinstance(out, tuple) else out
            expect = handle.arch.logits(handle.arch.final_hidden(h)[:, -1])
        torch.testing.assert_close(steered_logits, expect, atol=1e-5, rtol=1e-5)


def test_per_row_alpha(tiny):
    handle = tiny("qwen2")
    v = torch.randn(64)
    both = naive_logits(handle, "hello", [Steer(layer=2, vector=v, alpha=[0.0, 3.0])], rows=2)
    alone0 = naive_logits(handle, "hello", [])
    alone3 = naive_logits(handle, "hello", [Steer(layer=2, vector=v, alpha=3.0)])
    torch.testing.assert_close(both[0], alone0[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(both[1], alone3[0], atol=1e-5, rtol=1e-5)


def test_several_vectors_at_several_layers_add_up(tiny):
    handle = tiny("gemma3")
    v1, v2 = torch.randn(64), torch.randn(64)
    two = naive_logits(handle, "hi there", [Steer(layer=0, vector=v1, alpha=1.5), Steer(layer=2, vector=v2, alpha=-1.0)])
    one = naive_logits(handle, "hi there", [Steer(layer=0, vector=v1, alpha=1.5)])
    assert not torch.allclose(two, one)


def _input_of_block(handle, ids, layer, steers, state):
    seen = {}
    hook = handle.arch.layers[layer].register_forward_pre_hook(lambda m, a: seen.__setitem__("h", a[0]))
    try:
        with torch.inference_mode(), steering(handle, steers, state):
            handle.model.base_model(input_ids=ids, use_cache=False)
    finally:
        hook.remove()
    return seen["h"]


def test_position_masks(tiny):
    handle = tiny("llama")
    ids = handle.tokenizer("abcdef", return_tensors="pt").input_ids  # 7 tokens incl. <s>
    v = torch.ones(64)
    base = _input_of_block(handle, ids, 2, [], StepState())
    # position 0 holds BOS, a special token: left alone unless the steer asks for special tokens
    for positions, expect_changed, special_tokens in (
            ("all", range(1, 7), False), ("prompt", range(1, 4), False), ("generated", range(4, 7), False),
            ("all", range(7), True), ("prompt", range(4), True)):
        state = StepState(prompt_len=4)
        out = _input_of_block(handle, ids, 2, [Steer(layer=1, vector=v, alpha=5.0, positions=positions,
                                                     special_tokens=special_tokens)], state)
        changed = [(out[0, p] - base[0, p]).abs().max() > 1e-6 for p in range(7)]
        assert [i for i, c in enumerate(changed) if c] == list(expect_changed), (positions, special_tokens)


def test_bad_steers_are_refused(tiny):
    handle = tiny("llama")
    with pytest.raises(SteeringError, match="hidden size"):
        naive_logits(handle, "x", [Steer(layer=0, vector=torch.ones(10), alpha=1.0)])
    with pytest.raises(SteeringError, match="layer 9 does not exist"):
        naive_logits(handle, "x", [Steer(layer=9, vector=torch.ones(64), alpha=1.0)])
    with pytest.raises(SteeringError, match="finite"):
        Steer(layer=0, vector=torch.ones(64), alpha=float("nan"))
    assert hook_count(handle) == 0


def test_exception_mid_generation_leaves_no_hook(tiny):
    handle = tiny("gpt2")
    steer = Steer(layer=1, vector=torch.randn(64), alpha=1.0)
    stream = stream_side_by_side(handle, "boom", [steer], Sampling(max_new_tokens=10))
    next(stream)
    # hooks live for one forward pass only: a stream paused between steps (a slow client) holds none
    assert hook_count(handle) == 0
    with pytest.raises(RuntimeError):
        stream.throw(RuntimeError("client went away"))
    assert hook_count(handle) == 0
    # and an error raised inside a hook too
    def bad_fn(h):
        raise RuntimeError("bad vector function")
    with pytest.raises(RuntimeError):
        naive_logits(handle, "x", [Steer(layer=1, fn=bad_fn, context_layer=0, alpha=1.0)])
    assert hook_count(handle) == 0


def test_input_dependent_vector_called_once_per_prompt(tiny):
    handle = tiny("llama")
    w = torch.randn(64, 64) * 0.1
    calls = []

    def g(h):
        calls.append(h.shape)
        return h @ w

    steer = Steer(layer=2, fn=g, context_layer=1, alpha=1.0, positions="generated")
    events = list(stream_side_by_side(handle, "per input", [steer], Sampling(max_new_tokens=6)))
    assert len(calls) == 1 and calls[0] == (3, 64)  # one call for the 3 batch rows, reused every step
    assert len(events) >= 1


def test_input_dependent_needs_earlier_context_for_prompt_positions(tiny):
    handle = tiny("llama")
    steer = Steer(layer=1, fn=lambda h: h, context_layer=3, alpha=1.0, positions="all")
    with pytest.raises(SteeringError, match="context"):
        naive_logits(handle, "x y", [steer])
    assert hook_count(handle) == 0


def test_head_steer_refused_half_way_leaves_no_hook(tiny):
    """An ITI table naming a missing layer after a valid one: the valid layer's hook is removed too."""
    from steer_ui.model.capture import site_width
    from steer_ui.model.hooks import HeadSteer

    handle = tiny("llama")
    width = site_width(handle, "heads")
    clean = naive_logits(handle, "heads", [])
    steer = HeadSteer({0: torch.ones(width), 9: torch.ones(width)}, alpha=5.0)  # layer 0 installs first
    with pytest.raises(SteeringError, match="layer 9"):
        naive_logits(handle, "heads", [steer])
    assert hook_count(handle) == 0
    torch.testing.assert_close(naive_logits(handle, "heads", []), clean, atol=0, rtol=0)
    # the same table without the bad layer does steer (so the refusal above was not a no-op by accident)
    assert not torch.allclose(naive_logits(handle, "heads", [HeadSteer({0: torch.ones(width)}, alpha=5.0)]), clean)


def test_generated_only_input_dependent_steer_with_later_context(tiny):
    """L2S with its context layer above the steering layer: prefill untouched, steering from the first generated token."""
    handle = tiny("llama")
    prompt, layer, context_layer = "late context", 0, 2  # hidden_states[3] is block 2's output (not the last)
    w = torch.randn(64, 64, generator=torch.Generator().manual_seed(0))
    seen = []

    def g(h):
        seen.append(h.clone())
        return h @ w

    steer = Steer(layer=layer, fn=g, context_layer=context_layer, alpha=50.0, positions="generated")
    events = list(stream_side_by_side(handle, prompt, [steer], Sampling(max_new_tokens=3, stop_at_eos=False)))
    assert hook_count(handle) == 0 and len(events) == 3
    first_u, first_s = events[0].unsteered, events[0].steered
    # prefill logits untouched: the first token and its distribution are the unsteered ones
    assert first_s.token_id == first_u.token_id and first_s.logprob == pytest.approx(first_u.logprob, abs=1e-6)
    assert first_s.delta_logit == pytest.approx(0.0, abs=1e-5)
    # the context is the unsteered last prompt token at the context layer, read once for all rows
    ids = handle.tokenizer(prompt, return_tensors="pt").input_ids
    with torch.inference_mode():
        hidden = handle.model(input_ids=ids, output_hidden_states=True).hidden_states[context_layer + 1]
    assert len(seen) == 1 and torch.allclose(seen[0][0], hidden[0, -1], atol=1e-5)
    # the logits at the first generated token are steered: Δlogit against the unsteered model on the same tokens
    second = events[1].steered
    assert abs(second.delta_logit) > 1e-2
    assert second.direct_delta_logit != 0.0


def test_last_positions_steer_the_last_prompt_token_and_every_generated_one(tiny):
    """ITI's positions: at prefill only the last prompt position moves; while decoding every new token does."""
    from steer_ui.model.capture import capture

    handle = tiny("llama")
    ids = handle.tokenizer("a short prompt here", return_tensors="pt").input_ids
    n = ids.shape[1]
    steer = Steer(layer=1, vector=torch.ones(64), alpha=3.0, positions="last")
    clean = capture(handle, ids, [1])[1]
    with steering(handle, [steer], StepState(prompt_len=n)):
        prefill = capture(handle, ids, [1])[1]
    moved = (prefill - clean).abs().amax(-1)[0]
    assert torch.all(moved[:-1] == 0) and moved[-1] > 1.0
    state = StepState(prompt_len=n, offset=n)  # one generated position
    assert state.touches(1, "last") and StepState(prompt_len=n).touches(n, "last")
    assert not StepState(prompt_len=n).touches(n, "generated")
    mask = StepState(prompt_len=3).position_mask(5, "last", "cpu").reshape(-1).tolist()
    assert mask == [False, False, True, True, True]
