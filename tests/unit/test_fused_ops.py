"""Norms, rotary embeddings and products with fewer kernels (steer_ui/model/fused_ops.py): the rotary change
gives the model's own results bit for bit on every device; the CUDA norms and products agree up to the dtype's
rounding."""
import pytest
import torch

from steer_ui.model import fused_ops
from steer_ui.model.fused_ops import _FusedNorm, _rotated
from steer_ui.tiny import tiny_handle

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def _rotary_modules(handle):
    return [f for f in fused_ops._attention_families(handle.model) if hasattr(f, "apply_rotary_pos_emb")]


def _outputs(handle, ids):
    with torch.inference_mode():
        out = handle.model(input_ids=ids, use_cache=False, output_hidden_states=True)
    return [out.logits, *out.hidden_states]


@pytest.mark.parametrize("family", ["llama", "gemma3", "qwen2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_rotary_change_gives_the_models_own_outputs_bit_for_bit(family, dtype):
    handle = tiny_handle(family)
    handle.model.to(dtype)
    modules = _rotary_modules(handle)
    assert handle.fused["rotary"] == len(modules) == 1
    ids = torch.tensor([[1, 5, 9, 3, 7, 2, 8], [4, 4, 6, 1, 9, 3, 2]])
    fused = _outputs(handle, ids)
    wrapped = modules[0].apply_rotary_pos_emb
    modules[0].apply_rotary_pos_emb = wrapped.steer_ui_original
    try:
        own = _outputs(handle, ids)
    finally:
        modules[0].apply_rotary_pos_emb = wrapped
    assert all(torch.equal(a, b) for a, b in zip(fused, own))


def test_a_call_the_rotary_change_does_not_reproduce_goes_to_the_original():
    calls = []

    def original(*args, **kwargs):
        calls.append(kwargs)
        return "original"

    wrapped = fused_ops._rotary_for(original)
    q, k = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4)
    cos, sin = torch.randn(1, 3, 4), torch.randn(1, 3, 4)
    assert wrapped(q, k, cos, sin, unsqueeze_dim=2) == "original"  # heads on another axis
    assert wrapped(q, k, cos[..., :2], sin[..., :2]) == "original"  # a partial rotary
    assert wrapped(q, k.double(), cos, sin) == "original"  # mixed dtypes
    assert wrapped(q, k, cos, sin) != "original" and len(calls) == 3


def test_rotated_queries_and_keys_keep_their_head_counts():
    q, k = torch.randn(2, 8, 5, 16), torch.randn(2, 2, 5, 16)
    cos, sin = torch.randn(2, 5, 16), torch.randn(2, 5, 16)
    rq, rk = _rotated(q, k, cos, sin)
    assert rq.shape == q.shape and rk.shape == k.shape


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_llama_norm_as_one_call_agrees_with_its_own_forward(dtype):
    """The form the CUDA models take, run here on the CPU: within the dtype's rounding (here bit for bit)."""
    handle = tiny_handle("llama")
    handle.model.to(dtype)
    norm = handle.arch.final_norm
    with torch.no_grad():
        norm.weight.copy_(torch.rand(norm.weight.shape[0], generator=torch.Generator().manual_seed(3)) * 2)
    fused = _FusedNorm(norm, norm.forward, gemma=False)
    x = (torch.randn(4, 3, norm.weight.shape[0], generator=torch.Generator().manual_seed(4)) * 40).to(dtype)
    with torch.no_grad():
        own, mine = norm(x), fused(x)
    assert own.dtype == mine.dtype == dtype and fused_ops._close(own, mine)
    assert not fused_ops._close(own, mine * 1.05)  # the check itself can fail


def test_off_the_gpu_the_llama_norms_stay_their_own():
    handle = tiny_handle("llama")
    assert handle.fused["norms"] == 0
    assert not any(isinstance(m.__dict__.get("forward"), _FusedNorm) for m in handle.model.modules())


def test_the_switch_installs_nothing(monkeypatch):
    monkeypatch.setenv(fused_ops.ENV, "0")
    handle = tiny_handle("gemma3")
    assert handle.fused["norms"] == 0
    assert not any("forward" in m.__dict__ for m in handle.model.modules() if type(m).__name__.endswith("RMSNorm"))


@CUDA
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_norms_and_products_are_fused_and_the_model_agrees_with_its_own_forwards(dtype):
    from steer_ui.model.loading import load_model

    handle = load_model("tiny:llama", device="cuda", dtype=str(dtype).replace("torch.", ""))
    assert handle.fused["norms"] > 0 and handle.fused["products"] == 2 * handle.arch.num_layers
    ids = torch.tensor([[1, 5, 9, 3, 7, 2, 8]], device="cuda")
    fused = _outputs(handle, ids)
    with fused_ops.uninstalled(handle.model):
        own = _outputs(handle, ids)
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    assert all(torch.allclose(a.float(), b.float(), atol=tol, rtol=tol) for a, b in zip(fused, own))


def _products(handle, ids) -> int:
    """Matrix products dispatched by one forward."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket in (torch.ops.aten.linear, torch.ops.aten.mm, torch.ops.aten.addmm):
                seen.append(func)
            return func(*args, **(kwargs or {}))

    with torch.inference_mode(), Count():
        handle.model(input_ids=ids, use_cache=False)
    return len(seen)


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma3"])
def test_grouped_products_give_the_same_outputs_with_three_fewer_products_a_block(family):
    """The CUDA grouping, made here on the CPU: q/k/v one product, gate/up one (Qwen2's projections have biases)."""
    handle = tiny_handle(family)
    ids = torch.tensor([[1, 5, 9, 3, 7, 2, 8], [4, 4, 6, 1, 9, 3, 2]])
    own, own_products = _outputs(handle, ids), _products(handle, ids)
    assert fused_ops.fused_products(handle.model, devices=("cpu",)) == handle.arch.num_layers * 2
    grouped = _outputs(handle, ids)
    assert all(torch.allclose(a, b, atol=1e-5, rtol=1e-5) for a, b in zip(own, grouped))
    assert own_products - _products(handle, ids) == 3 * handle.arch.num_layers
    attention = handle.arch.layers[0].self_attn
    q, k = attention.q_proj.weight, attention.k_proj.weight
    assert q.untyped_storage().data_ptr() == k.untyped_storage().data_ptr()  # views of one matrix, no copy kept
    with fused_ops.uninstalled(handle.model):
        assert _products(handle, ids) == own_products
    handle.model.to(torch.float64)  # new weights, no longer views of the stacked matrix: each its own product
    assert _products(handle, ids) == own_products


def test_a_grouped_linear_called_with_another_input_or_out_of_order_computes_its_own():
    handle = tiny_handle("llama")
    fused_ops.fused_products(handle.model, devices=("cpu",))
    attention = handle.arch.layers[0].self_attn
    x, y = torch.randn(2, 3, handle.arch.hidden_size), torch.randn(2, 3, handle.arch.hidden_size)
    with torch.no_grad():
        expected = {n: torch.nn.functional.linear(t, getattr(attention, n).weight)
                    for n, t in (("q_proj", x), ("k_proj", x), ("v_proj", x))}
        assert torch.allclose(attention.q_proj(x), expected["q_proj"], atol=1e-6)
        assert torch.allclose(attention.v_proj(x), expected["v_proj"], atol=1e-6)  # v before k: its own part
        assert torch.allclose(attention.k_proj(y), torch.nn.functional.linear(y, attention.k_proj.weight))
        assert torch.allclose(attention.k_proj(x), expected["k_proj"], atol=1e-6)
        assert torch.allclose(attention.k_proj(x), expected["k_proj"], atol=1e-6)  # read twice: computed again
