import pytest
import torch
from torch import nn

from steer_ui.model.architecture import ArchitectureError, discover
from steer_ui.tiny import FAMILIES


@pytest.mark.parametrize("family", FAMILIES)
def test_discovers_every_family(tiny, family):
    handle = tiny(family)
    arch = handle.arch
    assert arch.num_layers == 4
    assert arch.hidden_size == 64
    assert arch.vocab_size == handle.model.config.vocab_size
    assert arch.unembedding.shape == (arch.vocab_size, arch.hidden_size)
    # Our unembedding of the base model's (normed) last hidden state reproduces the model's own logits.
    ids = handle.tokenizer("steering", return_tensors="pt").input_ids
    with torch.inference_mode():
        full = handle.model(input_ids=ids).logits[0, -1]
        hidden = handle.model.base_model(input_ids=ids).last_hidden_state[0, -1]
    torch.testing.assert_close(arch.logits(hidden), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_block_output_is_hf_hidden_states_plus_one(tiny, family):
    """Our site (block L output) is HF hidden_states[L + 1] for every block but the last."""
    handle = tiny(family)
    ids = handle.tokenizer("site check", return_tensors="pt").input_ids
    seen = {}
    hooks = [layer.register_forward_hook(lambda m, i, o, k=k: seen.__setitem__(k, o[0] if isinstance(o, tuple) else o))
             for k, layer in enumerate(handle.arch.layers)]
    try:
        with torch.inference_mode():
            out = handle.model(input_ids=ids, output_hidden_states=True)
    finally:
        for h in hooks:
            h.remove()
    for layer in range(handle.arch.num_layers - 1):
        torch.testing.assert_close(seen[layer], out.hidden_states[layer + 1])


def test_tied_lm_head_detected(tiny):
    assert tiny("gemma3").arch.tied_lm_head
    assert not tiny("llama").arch.tied_lm_head


def test_softcap_applied(tiny):
    assert tiny("gemma2").arch.logit_softcap == 30.0


def test_unknown_architecture_names_what_is_missing():
    class Odd(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([nn.Linear(4, 4)])

    with pytest.raises(ArchitectureError) as err:
        discover(Odd())
    message = str(err.value)
    assert "decoder block list" in message and "final norm" in message and "unembedding" in message
