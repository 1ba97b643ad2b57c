"""The slider's fast path cuts work, never answers: each cut against the plain computation."""
import pytest
import torch

from steer_ui.model import architecture
from steer_ui.model.analysis import naive_logits
from steer_ui.model.architecture import _UNEMBED_KERNELS, _candidates, unembed
from steer_ui.model.hooks import Steer
from steer_ui.model.prefix import for_prompt
from steer_ui.tiny import FAMILIES

PROMPT = "Hello there, general Kenobi"


@pytest.mark.parametrize("rows", [1, 3, 21])
def test_every_unembedding_kernel_equals_the_linear_layer(rows):
    torch.manual_seed(0)
    w = torch.randn(20000, 48)
    flat = torch.randn(rows, 48)
    reference = torch.nn.functional.linear(flat, w)
    names = _candidates(w)
    assert {"plain", "transposed"} <= set(names)
    with torch.inference_mode():
        for name in names:
            torch.testing.assert_close(_UNEMBED_KERNELS[name](w, flat), reference, atol=1e-4, rtol=1e-4)


def test_unembedding_with_gradients_uses_the_differentiable_product(monkeypatch):
    torch.manual_seed(0)
    w = torch.randn(20000, 16)
    flat = torch.randn(2, 16, requires_grad=True)
    # were a kernel without a backward remembered for this shape, a gradient through it would fail
    monkeypatch.setitem(architecture._UNEMBED_KERNEL, architecture.kernel_key(w, 2), "onednn")
    out = unembed(w, flat)
    out.sum().backward()
    torch.testing.assert_close(flat.grad, w.sum(0).expand(2, -1), atol=1e-3, rtol=1e-4)


@pytest.mark.parametrize("family", FAMILIES)
def test_fast_path_equals_a_hooked_forward_with_the_final_mlp_cut(tiny, family):
    handle = tiny(family)
    prefix = for_prompt(handle, PROMPT, 1)
    torch.manual_seed(2)
    steers = [Steer(layer=1, vector=torch.randn(handle.arch.hidden_size), alpha=torch.tensor(3.0)),
              Steer(layer=handle.arch.num_layers - 1, vector=torch.randn(handle.arch.hidden_size),
                    alpha=torch.tensor(2.0))]  # a steer on the final block itself
    fast = prefix.logits(steers, rows=1)
    torch.testing.assert_close(fast, naive_logits(handle, PROMPT, steers), atol=1e-4, rtol=1e-4)
    # every family with one MLP module per block runs the final one on the last position only
    assert handle.__dict__["_final_mlp_sliceable"] is (family != "opt")


def test_the_final_mlp_really_sees_one_position(tiny):
    handle = tiny("llama")
    prefix = for_prompt(handle, PROMPT, 1)
    seen = []
    remover = handle.arch.final_mlp.register_forward_hook(lambda _m, args, _out: seen.append(args[0].shape[1]))
    # a steer that adds something (a row that adds nothing takes the kept unsteered logits: no re-run at all)
    push = [Steer(layer=1, vector=torch.ones(handle.arch.hidden_size), alpha=0.5)]
    try:
        prefix.logits(push, rows=1)  # the first call checks the cut once (a full and a cut run), then cuts
        prefix.logits(push, rows=1)
    finally:
        remover.remove()
    assert seen[-1] == 1 and prefix.input_ids.shape[1] > 1


def test_autograd_reaches_the_added_vector_through_the_cut_block(tiny):
    handle = tiny("gemma3")
    prefix = for_prompt(handle, PROMPT, 2)
    added = torch.zeros(handle.arch.hidden_size, requires_grad=True)
    prefix.final(added).sum().backward()
    assert added.grad is not None and float(added.grad.abs().sum()) > 0
