"""Gemma's RMS norms as one ``F.rms_norm`` call each (issue #50: fewer dispatches a step), bit for bit the same."""
import pytest
import torch

from steer_ui.model.fused_ops import fused_norms
from steer_ui.model.loading import load_model


def _unfused(model) -> int:
    """Put every norm's own forward back; how many were fused."""
    n = 0
    for module in model.modules():
        if type(module).__name__.endswith("RMSNorm") and "forward" in module.__dict__:
            del module.forward
            n += 1
    return n


@pytest.mark.parametrize("family", ["gemma", "gemma2", "gemma3"])
def test_a_gemma_models_outputs_do_not_change_bit_for_bit(family):
    handle = load_model(f"tiny:{family}", weights="float32")
    ids = torch.tensor([[1, 5, 9, 3, 7, 2, 8]])
    with torch.inference_mode():
        fused = handle.model(input_ids=ids, use_cache=False, output_hidden_states=True)
    assert _unfused(handle.model) > 0  # the loader fused them
    with torch.inference_mode():
        plain = handle.model(input_ids=ids, use_cache=False, output_hidden_states=True)
    assert torch.equal(fused.logits, plain.logits)
    for a, b in zip(fused.hidden_states, plain.hidden_states):
        assert torch.equal(a, b)
    assert fused_norms(handle.model) == _unfused(handle.model)  # fusing again finds the same norms


def test_other_families_norms_are_left_alone():
    handle = load_model("tiny:llama", weights="float32")
    assert fused_norms(handle.model) == 0


def test_training_the_norms_weight_keeps_its_own_forward():
    handle = load_model("tiny:gemma3", weights="float32")
    norm = next(m for m in handle.model.modules() if type(m).__name__ == "Gemma3RMSNorm" and "forward" in m.__dict__)
    norm.weight.requires_grad_(True)
    x = torch.randn(2, norm.weight.shape[0])
    norm(x).sum().backward()
    assert norm.weight.grad is not None and norm.weight.grad.abs().sum() > 0


def test_a_gain_written_after_loading_is_used():
    """``1 + w`` is kept, but a weight written in place (a test sets a final norm's gain this way) is read again."""
    handle = load_model("tiny:gemma3", weights="float32")
    norm = handle.arch.final_norm
    assert "forward" in norm.__dict__
    x = torch.randn(3, norm.weight.shape[0])
    with torch.no_grad():
        norm(x)
        norm.weight.copy_(torch.rand(norm.weight.shape[0], generator=torch.Generator().manual_seed(1)) * 3)
        fused = norm(x)
    del norm.forward
    with torch.no_grad():
        assert torch.equal(fused, norm(x))
