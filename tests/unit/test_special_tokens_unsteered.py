"""Special tokens (BOS, EOS, a chat template's turn markers) are not steered unless a steer asks (issue #48).

Read at the hook: the residual at the steered block's output, with and without the steer, position by position.
The tiny byte tokenizer's specials are <pad> 0, <s> 1 (BOS) and </s> 2; 2 stands in for a turn marker mid-prompt.
"""
from __future__ import annotations

import pytest
import torch

from steer_ui import steering_spec
from steer_ui.model.hooks import Installed, Steer, special_ids, steering
from steer_ui.model.prefix import run_prefix

LAYER = 1
IDS = [[1, 40, 50, 2, 60, 70]]  # BOS, two bytes, a special token in the middle, two bytes
SPECIAL = [0, 3]


def _residual(handle, ids, steers) -> torch.Tensor:
    """(seq, hidden): block LAYER's output as the steer left it (the reader is registered after the steer)."""
    seen = {}
    reader = Installed()
    with torch.no_grad(), steering(handle, steers):
        reader.after(handle.arch.layers[LAYER], lambda _m, _i, out: seen.__setitem__(
            "h", (out[0] if isinstance(out, tuple) else out).detach().clone()))
        try:
            handle.model(torch.tensor(ids))
        finally:
            reader.remove_all()
    return seen["h"][0]


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_special_positions_see_no_steering_unless_asked(tiny, family):
    handle = tiny(family)
    assert {0, 1, 2} <= set(special_ids(handle).tolist())
    vector = torch.randn(handle.arch.hidden_size, generator=torch.Generator().manual_seed(3))
    unsteered = _residual(handle, IDS, [])
    steered = _residual(handle, IDS, [Steer(layer=LAYER, vector=vector, alpha=2.0)])
    for p in range(len(IDS[0])):
        if p in SPECIAL:
            assert torch.equal(steered[p], unsteered[p]), p
        else:  # the block's own output at an ordinary position is unchanged below the steer: exactly + α·v
            torch.testing.assert_close(steered[p] - unsteered[p], 2.0 * vector, atol=1e-5, rtol=0)
    everywhere = _residual(handle, IDS, [Steer(layer=LAYER, vector=vector, alpha=2.0, special_tokens=True)])
    torch.testing.assert_close(everywhere - unsteered, (2.0 * vector).expand_as(unsteered), atol=1e-5, rtol=0)


def test_prefix_engine_leaves_special_tokens_alone_as_the_hooks_do(tiny):
    """The slider's frozen prefix gives the logits of a full steered forward pass, special tokens unsteered."""
    handle = tiny("llama")
    vector = torch.randn(handle.arch.hidden_size, generator=torch.Generator().manual_seed(5))
    ids = torch.tensor(IDS)
    prefix = run_prefix(handle, ids, LAYER)
    for special in (False, True):
        steer = Steer(layer=LAYER, vector=vector, alpha=3.0, special_tokens=special)
        with torch.no_grad(), steering(handle, [steer]):
            full = handle.model(ids).logits[:, -1].float()
        torch.testing.assert_close(prefix.logits([steer]).float(), full, atol=1e-4, rtol=0)
    # final(): the additive path training uses, against the hooks' final residual at the last position
    last = handle.arch.num_layers - 1
    seen = {}
    reader = Installed()
    with torch.no_grad(), steering(handle, [Steer(layer=LAYER, vector=vector, alpha=3.0)]):
        reader.after(handle.arch.layers[last], lambda _m, _i, out: seen.__setitem__(
            "h", (out[0] if isinstance(out, tuple) else out)[:, -1].detach().clone()))
        try:
            handle.model(ids)
        finally:
            reader.remove_all()
    with torch.no_grad():
        torch.testing.assert_close(prefix.final(3.0 * vector), seen["h"].float(), atol=1e-4, rtol=0)


def test_steering_spec_takes_special_tokens_as_an_apply_option():
    spec = steering_spec.parse({"vectors": [{"source": "random", "scale": 0.1,
                                             "apply": {"phases": ["generation"], "special_tokens": True}},
                                            {"source": "random", "scale": 0.1, "apply": {"special_tokens": True}},
                                            {"source": "random", "scale": 0.1}]})
    first, second, third = spec.terms
    assert (first.positions, first.special_tokens) == ("generated", True)
    assert (second.positions, second.special_tokens) == (None, True)
    assert third.special_tokens is False
    assert steering_spec.parse(spec.to_json()) == spec  # the option survives links and saved results
    from steer_ui.messages import UserError
    with pytest.raises(UserError):
        steering_spec.parse({"vectors": [{"source": "random", "scale": 0.1, "apply": {"special_tokens": "yes"}}]})


def _decode_step_additions(handle, decode: str, steer: Steer, fed: list[int], every_block: bool = False):
    """What the steering added at block LAYER's output, per row, at each decode step fed the token ``fed[k]``
    (every row gets it): the block's own output (a reader registered before the step's hooks) against the next
    block's input (after them).  ``decode``: the batch's path; ``every_block``: the static step adds its buffers
    at every block, as a captured CUDA graph does."""
    from steer_ui.model.generation import DecodeBatch, Request, Sampling

    batch = DecodeBatch(handle, decode=decode)
    if batch.static is not None:
        batch.static.every_block = every_block
    assert batch.decode_path["path"] == ("static (eager)" if decode == "static" else "dynamic")
    batch.admit([Request.make(handle, "Hello", [steer], Sampling(max_new_tokens=len(fed) + 1, stop_at_eos=False))])
    seen: dict = {}

    def before_steering(_m, _i, out):
        seen["block"] = (out[0] if isinstance(out, tuple) else out)[:, -1].detach().clone()

    def after_steering(_m, args, kwargs):
        seen["next"] = (args[0] if args else kwargs["hidden_states"])[:, -1].detach().clone()

    added = []
    for token in fed:
        batch.sample()
        batch.next_ids = torch.full_like(batch.next_ids, token)
        handles = [handle.arch.layers[LAYER].register_forward_hook(before_steering),
                   handle.arch.layers[LAYER + 1].register_forward_pre_hook(after_steering, with_kwargs=True)]
        try:
            batch.advance()
        finally:
            for h in handles:
                h.remove()
        added.append(seen["next"] - seen["block"])  # (rows: unsteered, steered, counterfactual; hidden)
    return added


@pytest.mark.parametrize("decode,every_block", [("static", False), ("static", True), ("dynamic", False)])
@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_a_generated_special_token_is_unsteered_on_either_decode_path(tiny, family, decode, every_block):
    """The static step (the GPU's, eager here) masks a fed special token as the dynamic path's hooks do: the
    steered row's position holding </s> gets nothing, an ordinary one α·v; a steer taking special tokens adds α·v
    at both.  The unsteered and counterfactual rows get nothing anywhere."""
    handle = tiny(family)
    vector = torch.randn(handle.arch.hidden_size, generator=torch.Generator().manual_seed(7))
    fed = [40, 2, 50]  # an ordinary byte, </s>, an ordinary byte again
    for special in (False, True):
        steer = Steer(layer=LAYER, vector=vector, alpha=2.0, special_tokens=special)
        added = _decode_step_additions(handle, decode, steer, fed, every_block)
        for token, add in zip(fed, added):
            assert torch.equal(add[0], torch.zeros_like(add[0])) and torch.equal(add[2], torch.zeros_like(add[2]))
            if token == 2 and not special:
                assert torch.equal(add[1], torch.zeros_like(add[1])), (decode, token)
            else:
                torch.testing.assert_close(add[1], 2.0 * vector, atol=1e-5, rtol=0)
