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
    """Steering block 1 equals re-running blocks 2.. by hand on (block-1 output + α·v)."""
    handle = tiny("llama")
    ids = handle.tokenizer("abc", return_tensors="pt").input_ids
    v = torch.randn(64)
    steered_logits = naive_logits(handle, "abc", [Steer(layer=1, vector=v, alpha=2.0)])
    outputs, calls = _record_blocks(handle, ids)
    h = outputs[1] + 2.0 * v
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
    for positions, expect_changed in (("all", range(7)), ("prompt", range(4)), ("generated", range(4, 7))):
        state = StepState(prompt_len=4)
        out = _input_of_block(handle, ids, 2, [Steer(layer=1, vector=v, alpha=5.0, positions=positions)], state)
        changed = [(out[0, p] - base[0, p]).abs().max() > 1e-6 for p in range(7)]
        assert [i for i, c in enumerate(changed) if c] == list(expect_changed), positions


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
    assert hook_count(handle) == 1  # installed while the stream is live
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
