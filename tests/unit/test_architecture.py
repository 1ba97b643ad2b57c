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


# ------------------------------------------------ vocabulary-sized top-k / argmax
@pytest.mark.parametrize("vocab", [262_144, 151_937, 70_000])  # whole blocks; a tail; a tail past the last block
@pytest.mark.parametrize("k", [1, 5, 64])
def test_topk_last_equals_torch_topk(vocab, k):
    from steer_ui.model.architecture import topk_last

    x = torch.randn(3, vocab, generator=torch.Generator().manual_seed(vocab + k)) * 4
    x[1, -1] = 50.0  # the largest value of row 1 sits in the tail (or the last block)
    x[2, : vocab // 2] = float("-inf")  # what the sampling filters leave
    values, indices = topk_last(x, k)
    ref = torch.topk(x, k, dim=-1)
    assert torch.equal(values, ref.values) and torch.equal(indices, ref.indices)


def test_topk_last_finds_k_values_packed_into_one_block():
    from steer_ui.model.architecture import topk_last

    x = torch.zeros(1, 262_144)
    x[0, 2048:2058] = torch.arange(10, 20, dtype=torch.float32)  # the top 10 all in block 2
    values, indices = topk_last(x, 10)
    assert indices[0].tolist() == list(range(2057, 2047, -1)) and values[0, 0] == 19.0


def test_argmax_last_returns_the_first_maximum_like_torch():
    from steer_ui.model.architecture import argmax_last

    x = torch.randn(4, 151_937, generator=torch.Generator().manual_seed(0))
    x[0, [7000, 90000, 140000]] = 9.0  # ties in three blocks: the first wins
    x[1, 151_936] = 9.0  # only in the tail
    x[2, [151_000, 151_936]] = 9.0  # in the last whole block and the tail
    x[3, 5] = float("nan")  # NaN counts as the maximum for torch.argmax
    assert torch.equal(argmax_last(x), x.argmax(-1))
    assert argmax_last(x)[:3].tolist() == [7000, 151_936, 151_000]


def test_small_vocabularies_and_large_k_use_torch_directly():
    from steer_ui.model.architecture import argmax_last, topk_last

    x = torch.randn(2, 1000)
    assert torch.equal(topk_last(x, 5)[1], torch.topk(x, 5, dim=-1).indices)
    assert torch.equal(argmax_last(x), x.argmax(-1))
    big = torch.randn(2, 262_144)
    assert torch.equal(topk_last(big, 200)[1], torch.topk(big, 200, dim=-1).indices)
